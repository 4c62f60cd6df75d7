"""bench/gpu/ does not rot: `bench/gpu/run.sh --smoke` runs the whole GPU plan on CPU with a tiny
model (training through the real CLI twice per objective, then bench/score_load.py serving the
trained reward model) and leaves one JSON line per bench in $OUT; the FLOP count's model shape is
SmolLM2-135M's, checked against transformers' own Llama built from it (on the meta device: no memory)."""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"


def train_mfu():
    spec = importlib.util.spec_from_file_location("train_mfu", GPU / "train_mfu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_135m_shape_and_flop_count():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    bench = train_mfu()
    assert doctest.testmod(bench).failed == 0
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**bench.SMOLLM2_135M))
    assert sum(p.numel() for p in model.parameters()) == bench.total_parameters(bench.SMOLLM2_135M)
    assert bench.total_parameters(bench.SMOLLM2_135M) == 134_515_008   # SmolLM2-135M's published size


@pytest.mark.timeout(900)   # the 1B phases add their tiny runs and TRL in a child
def test_run_sh_smoke(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(GPU / "run.sh"), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {}
    for name in ("score_load_small", "rm_train", "dpo_train", "score_load"):
        text = (tmp_path / f"{name}.json").read_text().strip().splitlines()
        assert len(text) == 1, f"{name}: {text}\n{done.stderr[-3000:]}"
        lines[name] = json.loads(text[0])
    for name in ("rm_train", "dpo_train"):
        line = lines[name]
        assert line["steps"] == [1, 3] and line["every_sequence_full"] is True
        assert line["tokens_per_step"] == 2 * 4 * 48
        assert line["tokens_per_s"] > 0 and 0 < line["mfu"] < 1 and line["smoke"] is True
    assert lines["dpo_train"]["matmul_parameters"] > lines["rm_train"]["matmul_parameters"]
    score = lines["score_load"]
    assert score["model"] == Path(lines["rm_train"]["path"]).name and score["errors"] == 0
    assert score["ratio_vs_offline"] > 0 and score["ratio_vs_per_request"] > 0
    assert score["p50_ms"] <= score["p99_ms"]
    assert score["scores_without_mask"] is True and score["layout"] == "unmasked"   # a causal Llama
    served = score["models"][score["model"]]
    assert served["batch_bound_items_per_s"] > 0 and served["ratio_vs_batch_bound"] > 0
    assert served["single"]["errors"] == served["batch8"]["errors"] == 0
    small = lines["score_load_small"]   # the two built models, before the training
    assert set(small["models"]) == {"tiny", "5m"} and small["errors"] == 0
    assert small["tiny_ratio_vs_offline"] > 0 and small["tiny_p99_ms"] > 0
    assert all(model["scores_without_mask"] is True for model in small["models"].values())
    phases = {}   # bench/gpu/train_1b.py: the 1B shape's phases, the tiny one here
    for name in ("rm_full", "rm_lora", "dpo_full", "dpo_lora", "trl_rm", "trl_dpo"):
        text = (tmp_path / f"train_1b_{name}.json").read_text().strip().splitlines()
        assert len(text) == 1, f"train_1b_{name}: {text}\n{done.stderr[-3000:]}"
        phases[name] = json.loads(text[0])
    assert phases["rm_lora"]["lora_rank"] == 16 and phases["rm_full"]["lora_rank"] == 0
    assert all(phases[n]["tokens_per_s"] > 0 for n in phases)
    assert phases["trl_rm"]["rm_speedup_vs_trl"] > 0 and phases["trl_dpo"]["dpo_speedup_vs_trl"] > 0


def test_the_1b_shape():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    spec = importlib.util.spec_from_file_location("train_1b", GPU / "train_1b.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**bench.LLAMA_1B))
    assert sum(p.numel() for p in model.parameters()) == 1_235_814_400   # Llama-3.2-1B's size
    assert bench.mfu.total_parameters(bench.LLAMA_1B) == 1_235_814_400
