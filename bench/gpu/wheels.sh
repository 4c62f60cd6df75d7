#!/usr/bin/env bash
# Download the wheels the GPU machine lacks into bench/gpu/carry/wheels/, and copy the hh-rlhf items
# bench/score_load.py sends into bench/gpu/carry/data/ (the ../shared beside a checkout does not
# travel). The folder is ignored by git and carried to the machine with the working tree
# (`run(..., carry=["bench/gpu/carry"])`, 64 MiB at most in all; about 28 MB).
#
# The GPU machine (see the device notes: an H200, Python 3.12, torch, transformers, tokenizers,
# safetensors, pyarrow, numpy, httpx, prometheus-client, PyYAML already there, nothing reachable)
# lacks the store, the HTTP stack (with orjson and httptools; fastapi 0.165 requires
# opentelemetry-api, pydantic 2.14 typing-extensions>=4.16, which the image may predate) and the
# agreement statistics. Versions are those of this checkout's .venv, so the GPU run uses what the
# tests here ran; without a .venv, pip's newest.
#
#   bench/gpu/wheels.sh          then   bench/gpu/run.sh   (there)
set -euo pipefail
cd "$(dirname "$0")"
DEST=carry/wheels
PACKAGES=(duckdb fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv
          annotated-types typing-inspection annotated-doc krippendorff orjson httptools
          opentelemetry-api typing-extensions anyio
          trl accelerate)   # TRL, the baseline of bench/gpu/train_1b.py
PY=../../.venv/bin/python
mkdir -p "$DEST"
specs=()
for name in "${PACKAGES[@]}"; do
  version=$([ -x "$PY" ] && "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name" || true)
  specs+=("$name${version:+==$version}")
done
# manylinux tags from newest to oldest: pip matches each tag exactly
platforms=()
for n in 39 38 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" \
  --platform manylinux2014_x86_64 --platform any -d "$DEST" "${specs[@]}"
SHARED="${BRADLEY_SHARED_DATA:-../../../shared/data}"
mkdir -p carry/data/hh-rlhf
cp "$SHARED/hh-rlhf/harmless-base-test.jsonl.gz" carry/data/hh-rlhf/
ls "$DEST"
du -sh carry
