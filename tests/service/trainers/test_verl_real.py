"""verl 0.9.1's own reward code, unchanged, calling bradley: its custom-reward loader
(verl.trainer.ppo.reward.get_custom_reward_fn: `reward.custom_reward_function.path/name/reward_kwargs`,
loading service/client.py by file path and merging `reward_kwargs` into every call) feeding its naive and batch reward managers
(verl.workers.reward_manager), on a DataProto built as verl's rollout leaves it: left-padded prompt
ids, right-padded response ids ending in EOS, one attention mask over both, and per item
`data_source`, `reward_model.ground_truth` and verl's GSM8K-style `extra_info` with the question.

verl runs in a venv of the tests' own (tests/cached_venv.py: verl installed with --no-deps, plus the
few packages its reward modules import; built once, then cached in ~/.cache/bradley-tests/verl-*/),
against a live server in this process. The call shapes are also reproduced without verl in
tests/service/trainers/test_trainer_protocols.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.cached_venv import verl_venv
from tests.service.conftest import ROOT

QUESTIONS = ["What is 2+2? Think step by step.", "Name the capital of France."]
ANSWER = "The answer is 4."

VERL_SCRIPT = r'''
import json, os, sys
a = json.loads(sys.argv[1])
os.environ["BRADLEY_URL"] = a["url"]
import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager import BatchRewardManager, NaiveRewardManager

tok = AutoTokenizer.from_pretrained(a["tokenizer"])
prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in a["questions"]]
response = tok(a["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
width, pad = max(map(len, prompts)), tok.pad_token_id
rows = len(prompts)
prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
response_ids = torch.tensor([response + [pad] * 3] * rows)
mask = torch.cat([(prompt_ids != pad).long(), torch.tensor([[1] * len(response) + [0] * 3] * rows)], 1)

def data(with_prompt=True):
    infos = [{"split": "train", "index": i, "answer": "4"} | ({"question": q} if with_prompt else {})
             for i, q in enumerate(a["questions"])]
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask,
                 "input_ids": torch.cat([prompt_ids, response_ids], 1)},
        # a source without a checker on the server, so the reward model judges (not gsm8k's verifier)
        non_tensors={"data_source": np.array(["chat"] * rows, dtype=object),
                     "reward_model": np.array([{"ground_truth": "4"}] * rows, dtype=object),
                     "extra_info": np.array(infos, dtype=object)})

def loader(name, kwargs):
    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": a["client"], "name": name, "reward_kwargs": kwargs}}})
    return get_custom_reward_fn(cfg)

out = {}
naive = NaiveRewardManager(tok, num_examine=0, compute_score=loader("compute_score", {"temperature": 0.7}))
out["naive"] = naive(data()).sum(-1).tolist()
batch = BatchRewardManager(tok, num_examine=0, compute_score=loader("compute_score_batch", {}),
                           reward_router_address="127.0.0.1:1")
out["batch"] = batch(data()).sum(-1).tolist()
try:
    naive(data(with_prompt=False))
    out["no_prompt"] = "scored"
except ValueError as exc:
    out["no_prompt"] = str(exc)
print(json.dumps(out))
'''


@pytest.mark.timeout(1800)  # the first run builds the cached venv (minutes)
def test_verl_reward_managers_score_through_bradley(live, offline, tmp_path):
    python = str(verl_venv())
    (tmp_path / "verl_script.py").write_text(VERL_SCRIPT)
    spec = {"url": live.url, "client": str(ROOT / "service" / "client.py"),
            "tokenizer": offline["rm-tiny-a"].path, "questions": QUESTIONS, "answer": ANSWER}
    env = {k: v for k, v in os.environ.items() if k != "BRADLEY_ALLOW_EMPTY_PROMPT"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([python, str(tmp_path / "verl_script.py"), json.dumps(spec)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    expected = offline["rm-tiny-a"].score(QUESTIONS, [ANSWER] * 2)
    assert out["naive"] == pytest.approx(expected, abs=1e-5)
    assert out["batch"] == pytest.approx(expected, abs=1e-5)
    assert abs(out["naive"][0] - out["naive"][1]) > 1e-4  # same answer, different questions
    assert "extra_info has no prompt" in out["no_prompt"]
