"""TRL's own trainers, unchanged, against bradley: GRPO scoring through a live `bradley serve`, and
DPO / reward-model training on `bradley export --format trl` of a store that mixes plain-text
(hh-rlhf) and conversational prompts.

TRL runs in a venv of the tests' own holding only torch and trl (tests/cached_venv.py; built once,
about 2 minutes, then cached in ~/.cache/bradley-tests/trl-<version>/). Nothing of bradley is
installed there: the reward function comes from service/client.py, which needs the standard library
only (httpx is blocked in the TRL process to prove it). Each trainer takes 2 optimizer steps on tiny
models built from a config here; the rewards GRPO received are checked against the reward model
loaded directly.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.cached_venv import trl_venv
from tests.service.conftest import ROOT, free_port, make_db

HEAD = r'''
import json, sys
sys.modules["httpx"] = None  # the adapter must not need it
a = json.loads(sys.argv[1])
sys.path.insert(0, a["root"])
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
from datasets import Dataset, load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
common = dict(max_steps=2, per_device_train_batch_size=4, learning_rate=1e-4, logging_steps=1,
              report_to=[], use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0)
'''

GRPO_SCRIPT = HEAD + r'''
from service.client import trl_reward_func
from trl import GRPOConfig, GRPOTrainer
reward = trl_reward_func(a["url"])
calls = []
def bradley(prompts, completions, **columns):
    out = reward(prompts=prompts, completions=completions, **columns)
    calls.append({"prompts": prompts, "completions": completions, "rewards": out})
    return out
tok = AutoTokenizer.from_pretrained(a["policy"])
model = AutoModelForCausalLM.from_pretrained(a["policy"])
cfg = GRPOConfig(output_dir=a["out"], num_generations=2, max_completion_length=8, **common)
trainer = GRPOTrainer(model=model, reward_funcs=[bradley], args=cfg,
                      train_dataset=Dataset.from_list(a["rows"]), processing_class=tok)
out = trainer.train()
print(json.dumps({"steps": out.global_step, "calls": calls}))
'''

PAIRS_SCRIPT = HEAD + r'''
from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer
steps = {}
for kind, path in a["jobs"]:
    data = load_dataset("json", data_files=path, split="train")  # as a user loads the export
    out = f'{a["out"]}/{kind}-{path.rsplit("/", 1)[-1]}'
    if kind == "dpo":
        tok = AutoTokenizer.from_pretrained(a["policy"])
        model = AutoModelForCausalLM.from_pretrained(a["policy"])
        trainer = DPOTrainer(model=model, args=DPOConfig(output_dir=out, max_length=128, **common),
                             train_dataset=data, processing_class=tok)
    else:
        tok = AutoTokenizer.from_pretrained(a["rm"])
        model = AutoModelForSequenceClassification.from_pretrained(a["rm"], num_labels=1)
        trainer = RewardTrainer(model=model, args=RewardConfig(output_dir=out, max_length=128, **common),
                                train_dataset=data, processing_class=tok)
    steps[f"{kind}:{path}"] = trainer.train().global_step
print(json.dumps(steps))
'''

QUESTIONS = ["What is 2+2?", "Name a prime number.", "Say hello politely.", "What colour is the sky?"]


@pytest.fixture(scope="module")
def trl_python():
    return str(trl_venv())


@pytest.fixture(scope="module")
def policy(tmp_path_factory, hh_items):
    from rm.model.reward_model import build_tiny_causal_lm

    texts = [p + " " + r for p, r in hh_items] + QUESTIONS
    return str(build_tiny_causal_lm(tmp_path_factory.mktemp("policy") / "tiny-lm", texts))


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    """A real `bradley serve` process on 127.0.0.1 serving rm-tiny-a; stopped by its PID."""
    from service.client import ScoreClient

    folder = tmp_path_factory.mktemp("serve")
    db = make_db(folder / "serve.duckdb", tiny_models)
    port = free_port()
    log = open(folder / "server.log", "wb")
    env = {**os.environ, "BRADLEY_DEVICE": "cpu", "BRADLEY_TORCH_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", db, "serve", "--port",
                               str(port), "--model", "rm-tiny-a"], env=env, cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        ScoreClient(url).wait_ready(timeout=120)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def run_trl(python: str, script: str, spec: dict, tmp_path) -> dict:
    (tmp_path / "script.py").write_text(script)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([python, str(tmp_path / "script.py"), json.dumps(spec)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape", ["standard", "conversational"])
@pytest.mark.timeout(1800)  # the first run builds the cached venv (minutes)
def test_grpo_trainer_scores_through_the_live_server(shape, trl_python, policy, served, offline,
                                                     tmp_path):
    from service.client import completion_text

    rows = [{"prompt": q if shape == "standard" else [{"role": "user", "content": q}]}
            for q in QUESTIONS]
    spec = {"root": str(ROOT), "url": served, "policy": policy, "rows": rows, "out": str(tmp_path)}
    result = run_trl(trl_python, GRPO_SCRIPT, spec, tmp_path)
    assert result["steps"] == 2
    prompts = [p for c in result["calls"] for p in c["prompts"]]
    completions = [completion_text(x) for c in result["calls"] for x in c["completions"]]
    got = [r for c in result["calls"] for r in c["rewards"]]
    assert len(got) >= 8 and all(isinstance(p, str if shape == "standard" else list) for p in prompts)
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, completions), abs=1e-5)


@pytest.fixture(scope="module")
def mixed_exports(tmp_path_factory, shared_data):
    """`bradley export --format trl` (auto and --as text) of hh-rlhf text pairs + chat pairs."""
    from tests.service.conftest import HH_FILE

    folder = tmp_path_factory.mktemp("exports")
    with gzip.open(shared_data / HH_FILE, "rt", encoding="utf-8") as f:
        hh = [json.loads(line) for line, _ in zip(f, range(12), strict=False)]
    (folder / "hh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hh))
    chat = [{"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant",
             "content": f"A careful answer to: {q}"}], "rejected": [{"role": "assistant",
             "content": "no"}]} for q in QUESTIONS]
    (folder / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    db = str(folder / "mixed.duckdb")
    cli = [sys.executable, "-m", "service.cli", "--db", db]
    for name, fmt in (("hh.jsonl", "hh"), ("chat.jsonl", "trl")):
        subprocess.run(cli + ["ingest", str(folder / name), "--format", fmt], check=True, cwd=ROOT,
                       capture_output=True)
    outs = {}
    for shape in ("auto", "text"):
        outs[shape] = folder / f"pairs-{shape}.jsonl"
        subprocess.run(cli + ["export", "--format", "trl", str(outs[shape]), "--as", shape],
                       check=True, cwd=ROOT, capture_output=True)
    return outs


def test_export_of_a_mixed_store_has_one_shape(mixed_exports):
    auto = [json.loads(line) for line in mixed_exports["auto"].read_text().splitlines()]
    text = [json.loads(line) for line in mixed_exports["text"].read_text().splitlines()]
    assert len(auto) == len(text) == 16
    assert all(isinstance(r["prompt"], list) and isinstance(r["chosen"], list) for r in auto)
    assert all(isinstance(r["prompt"], str) and isinstance(r["chosen"], str) for r in text)
    hh_turns = [r["prompt"] for r in auto if len(r["prompt"]) > 1]
    assert hh_turns and all([m["role"] for m in p] == ["user", "assistant"] * (len(p) // 2) + ["user"]
                            * (len(p) % 2) for p in hh_turns)


@pytest.mark.timeout(1800)  # the first run builds the cached venv (minutes)
def test_dpo_and_reward_trainers_take_the_export(trl_python, policy, tiny_models, mixed_exports,
                                                tmp_path):
    jobs = [[kind, str(path)] for kind in ("dpo", "reward") for path in mixed_exports.values()]
    spec = {"root": str(ROOT), "policy": policy, "rm": tiny_models["rm-tiny-a"], "jobs": jobs,
            "out": str(tmp_path)}
    steps = run_trl(trl_python, PAIRS_SCRIPT, spec, tmp_path)
    assert list(steps.values()) == [2, 2, 2, 2]
