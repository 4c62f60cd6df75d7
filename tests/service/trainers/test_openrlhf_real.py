"""OpenRLHF 0.11.2's own rollout-and-reward code, unchanged, calling bradley's /get_reward:
`SingleTurnAgentExecutor.execute` (openrlhf/utils/agent.py) tokenizes the chat-templated prompt
without special tokens, left-truncates it to fit `max_length`, asks the engine for a continuation,
decodes prompt + continuation with `skip_special_tokens=False` (the EOS stays) and POSTs
`{"query", "prompts", "labels"}` with aiohttp to `--remote_rm_url`.

OpenRLHF runs in a venv of the tests' own (tests/cached_venv.py: openrlhf --no-deps + torch,
transformers, aiohttp). Its `openrlhf.utils` package imports DeepSpeed and wandb on import, so
agent.py is loaded by file path with its one module-level helper, `init_logger`, given as the
standard logging module's getLogger; the generation engine (vLLM in a real run) is replaced by one
that returns fixed token ids. Everything between the prompt and the reward is OpenRLHF's code.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rm.model.template import Templated
from tests.cached_venv import openrlhf_venv

QUESTION, ANSWER = "What is 2+2? Think step by step.", "The answer is 4."

SCRIPT = r'''
import asyncio, importlib.util, json, logging, sys, sysconfig, types
a = json.loads(sys.argv[1])
helper = types.ModuleType("openrlhf.utils.logging_utils")
helper.init_logger = logging.getLogger
sys.modules["openrlhf.utils.logging_utils"] = helper
path = sysconfig.get_paths()["purelib"] + "/openrlhf/utils/agent.py"
spec = importlib.util.spec_from_file_location("openrlhf_agent", path)
agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent)
from types import SimpleNamespace
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(a["tokenizer"])
prompt = tok.apply_chat_template([{"role": "user", "content": a["question"]}], tokenize=False,
                                 add_generation_prompt=True)
action = tok(a["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

class Engine:  # stands in for vLLM: the policy "generates" the answer and its EOS
    async def generate(self, prompt_token_ids, params, multi_modal_data=None):
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=action, finish_reason="stop",
                                                        logprobs=None)])

async def main():
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=a["url"] + "/get_reward")
    out = {}
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    for name, max_length in (("full", 512), ("truncated", 12 + len(action))):
        params = SimpleNamespace(max_tokens=len(action), logprobs=None)
        result = await executor.execute(prompt, "4", params, max_length, tok, Engine())
        query = tok.decode(result["observation_tokens"], skip_special_tokens=False)
        out[name] = {"reward": result["reward"], "extra_logs": result["extra_logs"], "query": query}
    out["n_prompt"] = n_prompt
    return out

print(json.dumps(asyncio.run(main())))
'''


@pytest.mark.timeout(1800)  # the first run builds the cached venv (minutes)
def test_openrlhf_executor_gets_the_reward_of_what_it_trained_on(live, offline, tmp_path):
    python = str(openrlhf_venv())
    (tmp_path / "openrlhf_script.py").write_text(SCRIPT)
    rm = offline["rm-tiny-a"]
    spec = {"url": live.url, "tokenizer": rm.path, "question": QUESTION, "answer": ANSWER}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([python, str(tmp_path / "openrlhf_script.py"), json.dumps(spec)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    full, cut = out["full"], out["truncated"]
    assert full["query"].endswith(ANSWER + rm.tokenizer.eos_token) and out["n_prompt"] > 12
    assert full["reward"] == pytest.approx(rm.score([QUESTION], [ANSWER]), abs=1e-5)
    assert full["extra_logs"]["unsplit"] == [0.0]
    # the prompt lost its head: scored as OpenRLHF trained on it, cut after the assistant header
    marker = "<|assistant|>\n"
    head = cut["query"][:cut["query"].rindex(marker) + len(marker)]
    assert not cut["query"].startswith("<|user|>")
    assert cut["reward"] == pytest.approx(rm.score([Templated(head)], [ANSWER]), abs=1e-5)
    assert cut["extra_logs"]["unsplit"] == [0.0]
