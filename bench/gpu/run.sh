#!/usr/bin/env bash
# One prepared GPU run, under 9 minutes: RM and DPO training on a 135M Llama (SmolLM2-135M's shape,
# random weights, bf16 autocast) with tokens/s and MFU, then bench/score_load.py serving the trained
# reward model against the offline batched forward and a one-forward-per-request server. First,
# the cheap models (the tiny and 5M reward models built from a config) served on the GPU,
# where a forward is cheap and the server's own work per request is what shows. One JSON line each
# in $OUT: score_load_small.json, rm_train.json, dpo_train.json, score_load.json. Last, training on a
# Llama-3.2-1B shape (bench/gpu/train_1b.py): train rm and train po --loss dpo, in full and with LoRA
# r=16, and TRL's RewardTrainer and DPOTrainer beside them: train_1b_<phase>.json.
#
#   bench/gpu/wheels.sh                       here: wheels the GPU machine lacks, + the hh-rlhf items
#   bench/gpu/run.sh                          there (carry bench/gpu/carry), OUT set by the device tool
#   bench/gpu/run.sh --serve-only             there: only the serving part (a 10-step reward model)
#   bench/gpu/run.sh --smoke                  anywhere, CPU, a tiny model, seconds (tests run this)
set -euo pipefail
cd "$(dirname "$0")/../.."
SMOKE="" SERVE_ONLY=""
[ "${1:-}" = "--smoke" ] && SMOKE=--smoke
[ "${1:-}" = "--serve-only" ] && SERVE_ONLY=--serve-only
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ -n "$SMOKE" ]; then
  PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
  SCORE=(--device cpu --requests 64 --offline-seconds 0.5 --torch-threads 1)
  SMALL=("${SCORE[@]}" --items 64)   # two passes of 1,000 items take the 5M model ~13 s a ceiling
  LIMIT=()   # the caller's own limit (tests: pytest's) is enough on a CPU
else
  CARRY=bench/gpu/carry
  ls "$CARRY"/wheels/*.whl >/dev/null || { echo "run bench/gpu/wheels.sh first" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" "$CARRY"/wheels/*.whl
  export PYTHONPATH="$WORK/site:$PWD" BRADLEY_SHARED_DATA="${BRADLEY_SHARED_DATA:-$PWD/$CARRY/data}"
  PY=python3
  # scale 0.3: 6,000 single-sample requests, 900 for the one-forward-per-request server (each a
  # 31 ms forward of the 30-layer model there): the serving part fits its 240 s; the training
  # took ~110 s on the H200 (2026-12-04), warm-up runs included
  SCORE=(--device cuda --scale 0.3 --offline-seconds 4)
  # scale 0.1: 2,000 single-sample requests for the tiny model, 300 for the 5M one
  SMALL=(--device cuda --scale 0.1 --offline-seconds 1)
  LIMIT=(timeout)   # the 9-minute plan: small models 100 s, training 200 s, serving 240 s at most
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
  # fail in seconds, not after the training, when the server's imports are not all there
  "$PY" -c "import duckdb, fastapi, httptools, orjson, uvicorn, service.api.app, service.cli.main"
fi

started=$SECONDS
if [ -z "$SERVE_ONLY" ]; then   # a failure here must not cost the training's figures
  "${LIMIT[@]}" ${LIMIT:+100} "$PY" bench/score_load.py "${SMALL[@]}" > "$OUT/score_load_small.json" \
    || echo "bench/gpu/run.sh: the small models' score_load failed (exit $?)" >&2
  cat "$OUT/score_load_small.json"
fi
"${LIMIT[@]}" ${LIMIT:+200} "$PY" bench/gpu/train_mfu.py --out "$OUT" --work "$WORK/train" $SMOKE \
  $SERVE_ONLY
model="$(cat "$WORK/train/rm_path.txt")"
"${LIMIT[@]}" ${LIMIT:+240} "$PY" bench/score_load.py --model "$model" "${SCORE[@]}" | tee "$OUT/score_load.json"
if [ -z "$SERVE_ONLY" ]; then   # the 1B shape last: a failure here keeps every figure above
  "${LIMIT[@]}" ${LIMIT:+240} "$PY" bench/gpu/train_1b.py --out "$OUT" --work "$WORK/train-1b" $SMOKE \
    || echo "bench/gpu/run.sh: the 1B training phases failed (exit $?)" >&2
fi
echo "bench/gpu/run.sh ${SMOKE:-(gpu)}: $((SECONDS - started)) s" >&2
