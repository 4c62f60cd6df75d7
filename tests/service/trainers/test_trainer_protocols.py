"""verl's and OpenRLHF's calls into bradley, made the way their own code makes them, and the
fidelity of every route: one (prompt, response) gets one reward however it travels.

verl (volcengine/verl at b178a3cd56f58b2d502255daba591e92833930a7): its reward loader
(verl/trainer/ppo/reward.py: get_custom_reward_fn) loads `custom_reward_function.path` by file path
(verl/utils/import_utils.py: load_extern_object) and wraps the function as
`partial(_call_with_kwargs, raw_fn, reward_kwargs)`, which merges reward_kwargs into the call.
The naive manager (verl/workers/reward_manager/naive.py) calls it per item as
`compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`, having added `num_turns`
and `rollout_reward_scores` to extra_info; the batch manager (verl/workers/reward_manager/batch.py)
calls `compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=, **reward_kwargs)`.
verl's GSM8K preprocessing (examples/data_preprocess/gsm8k.py) keeps the question in
`extra_info["question"]`. verl itself is not installed (its package imports ray, tensordict and
torch at module level), so these shapes are reproduced here.

OpenRLHF (OpenRLHF/OpenRLHF at 3c3be6234e0cb353e76bb8019947db9dfe99fca7): SingleTurnAgentExecutor
(openrlhf/utils/agent.py) tokenizes the prompt with `add_special_tokens=False` (already chat-templated
with --apply_chat_template), may keep only its last tokens (`prompt_token_ids[-max_prompt_length:]`),
decodes prompt + generated ids with `skip_special_tokens=False` (so the EOS stays) and POSTs
`{"query": [...], "prompts": [...], "labels": [...]}` to the remote RM (`_fetch_rewards_via_http`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import urllib.request
from functools import partial

import pytest

from service.client import ScoreClient, compute_score, compute_score_batch, trl_reward_func
from tests.service.conftest import ROOT, free_port, make_db, start_live, stop_live

CLIENT_FILE = ROOT / "service" / "client.py"
QUESTION, ANSWER = "What is 2+2? Think step by step.", "The answer is 4."


def load_by_path():
    """What verl's load_extern_object does: import the file as a module of its own."""
    spec = importlib.util.spec_from_file_location("custom_module", CLIENT_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):  # verl's _call_with_kwargs, restated
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


def verl_extra_info(question: str, index: int) -> dict:
    """verl's GSM8K extra_info plus what its naive manager adds before calling."""
    return {"split": "train", "index": index, "answer": "4", "question": question,
            "num_turns": None, "rollout_reward_scores": {}}


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def score_requests(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    found = re.search(r'^bradley_responses_total\{route="/score",status="200"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def verl_env(live, monkeypatch):
    monkeypatch.setenv("BRADLEY_URL", live.url)
    monkeypatch.delenv("BRADLEY_ALLOW_EMPTY_PROMPT", raising=False)
    return live.url


def test_verl_naive_manager_two_questions_same_answer_differ(verl_env, offline):
    fn = partial(call_with_kwargs, load_by_path().compute_score, {"temperature": 0.7})
    other = "Name the capital of France."
    # a data source the server has no checker for: the reward model judges (openai/gsm8k would
    # go to the gsm8k verifier, tests/service/trainers/test_client.py)
    got = [fn(data_source="chat", solution_str=ANSWER, ground_truth="4",
              extra_info=verl_extra_info(q, i)) for i, q in enumerate((QUESTION, other))]
    expected = offline["rm-tiny-a"].score([QUESTION, other], [ANSWER, ANSWER])
    assert got == pytest.approx(expected, abs=1e-5)
    assert abs(got[0] - got[1]) > 1e-4  # the question matters


@pytest.mark.parametrize("key", ["prompt", "question", "problem", "query"])
def test_verl_prompt_keys(verl_env, offline, key):
    got = compute_score(data_source="x", solution_str=ANSWER, ground_truth=None,
                        extra_info={key: QUESTION, "index": 0})
    assert got == pytest.approx(offline["rm-tiny-a"].score([QUESTION], [ANSWER])[0], abs=1e-5)


def test_verl_without_a_prompt_raises_unless_allowed(verl_env, monkeypatch, offline):
    module = load_by_path()
    with pytest.raises(ValueError, match="extra_info has no prompt under prompt, question"):
        module.compute_score(data_source="x", solution_str=ANSWER, ground_truth="4",
                             extra_info={"split": "train", "index": 0})
    with pytest.raises(ValueError, match="BRADLEY_ALLOW_EMPTY_PROMPT"):
        module.compute_score(data_source="x", solution_str=ANSWER, ground_truth="4", extra_info=None)
    monkeypatch.setenv("BRADLEY_ALLOW_EMPTY_PROMPT", "1")
    got = module.compute_score(data_source="x", solution_str=ANSWER, ground_truth="4", extra_info={})
    assert got == pytest.approx(offline["rm-tiny-a"].score([""], [ANSWER])[0], abs=1e-5)


def test_verl_batch_manager_one_request_per_batch(verl_env, offline, hh_items):
    items = hh_items[:6]
    fn = partial(call_with_kwargs, load_by_path().compute_score_batch,
                 {"reward_router_address": "127.0.0.1:1", "max_resp_len": 64})
    before = score_requests(verl_env)
    got = fn(data_sources=["hh"] * 6, solution_strs=[r for _, r in items],
             ground_truths=[None] * 6, extra_infos=[{"prompt": p, "index": i}
                                                    for i, (p, _) in enumerate(items)])
    assert score_requests(verl_env) - before == 1
    assert got == pytest.approx(offline["rm-tiny-a"].score([p for p, _ in items],
                                                           [r for _, r in items]), abs=1e-5)


def test_client_file_runs_on_the_bare_standard_library(live, offline):
    """`python -I -S`: no site-packages at all, as a trainer venv without bradley's dependencies."""
    code = (f"import importlib.util, os; os.environ['BRADLEY_URL'] = {live.url!r}; "
            f"spec = importlib.util.spec_from_file_location('m', {str(CLIENT_FILE)!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"print(m.compute_score(solution_str={ANSWER!r}, extra_info={{'question': {QUESTION!r}}}))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(offline["rm-tiny-a"].score([QUESTION], [ANSWER])[0],
                                               abs=1e-5)


def openrlhf_query(tokenizer, prompt_text: str, response: str, keep_last: int | None = None):
    """(prompt, query) as SingleTurnAgentExecutor builds them from token ids."""
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    if keep_last is not None:
        prompt_ids = prompt_ids[-keep_last:]
    action_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_text, tokenizer.decode(prompt_ids + action_ids, skip_special_tokens=False)


def test_fidelity_every_route_gives_one_reward(live, offline, monkeypatch):
    rm = offline["rm-tiny-a"]
    tok = rm.tokenizer
    expected = rm.score([QUESTION], [ANSWER])[0]
    templated = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                        add_generation_prompt=True)
    monkeypatch.setenv("BRADLEY_URL", live.url)
    with ScoreClient(live.url) as client:
        got = {
            "/score": client.score([QUESTION], [ANSWER])[0],
            "/get_reward plain": client.get_reward([QUESTION + ANSWER], [QUESTION])[0],
            "/get_reward plain + eos": client.get_reward([QUESTION + ANSWER + tok.eos_token],
                                                         [QUESTION])[0],
            "/get_reward templated + eos": client.get_reward(
                [openrlhf_query(tok, templated, ANSWER)[1]], [templated])[0],
            "/get_reward templated, no prompts": client.get_reward(
                [openrlhf_query(tok, templated, ANSWER)[1]])[0],
            "trl_reward_func": trl_reward_func(live.url)([QUESTION], [ANSWER])[0],
            "trl_reward_func conversational": trl_reward_func(live.url)(
                [[{"role": "user", "content": QUESTION}]], [[{"role": "assistant", "content": ANSWER}]])[0],
            "compute_score": compute_score("chat", ANSWER, "4", {"question": QUESTION}),
            "compute_score_batch": compute_score_batch(["chat"], [ANSWER], ["4"],
                                                       [{"question": QUESTION}])[0],
        }
    assert got == {k: pytest.approx(expected, abs=1e-5) for k in got}


def test_openrlhf_templated_prompt_is_not_wrapped_twice(live, offline):
    rm = offline["rm-tiny-a"]
    tok = rm.tokenizer
    questions = [QUESTION, "Name a prime number."]
    templated = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True) for q in questions]
    pairs = [openrlhf_query(tok, t, ANSWER) for t in templated]
    assert pairs[0][1].endswith(ANSWER + tok.eos_token)
    status, out = post(live.url, "/get_reward", {"query": [q for _, q in pairs],
                                                "prompts": [p for p, _ in pairs], "labels": ["4", "7"]})
    assert status == 200
    assert out["rewards"] == pytest.approx(rm.score(questions, [ANSWER] * 2), abs=1e-5)
    assert out["extra_logs"]["unsplit"] == [0.0, 0.0]
    assert out["extra_logs"]["response_chars"] == [float(len(ANSWER))] * 2


def test_openrlhf_left_truncated_prompt_and_unsplittable_queries(live, offline):
    rm = offline["rm-tiny-a"]
    tok = rm.tokenizer
    templated = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                        add_generation_prompt=True)
    prompt, query = openrlhf_query(tok, templated, ANSWER, keep_last=12)  # left-truncated, header kept
    assert not query.startswith(prompt)
    status, out = post(live.url, "/get_reward", {"query": [query, "plain text, no prompt"],
                                                "prompts": [prompt, "another prompt"]})
    assert status == 200
    head = query[:query.rindex("<|assistant|>\n") + len("<|assistant|>\n")]
    from rm.model.template import Templated

    assert out["rewards"][0] == pytest.approx(rm.score([Templated(head)], [ANSWER])[0], abs=1e-5)
    assert out["extra_logs"]["unsplit"] == [0.0, 1.0]
    metrics = urllib.request.urlopen(f"{live.url}/metrics", timeout=10).read().decode()
    assert re.search(r'^bradley_get_reward_splits_total\{how="unsplit"\} [1-9]', metrics, re.M)
    assert re.search(r'^bradley_get_reward_splits_total\{how="template_marker"\} [1-9]', metrics, re.M)


def test_strict_get_reward_refuses_what_it_cannot_split(tmp_path, tiny_models):
    from service.api.settings import load_settings

    db = make_db(tmp_path / "strict.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", port=free_port(), device="cpu",
                             strict_get_reward=True)
    server = start_live(settings)
    try:
        ok, _ = post(server.url, "/get_reward", {"query": ["Q? A."], "prompts": ["Q?"]})
        status, out = post(server.url, "/get_reward", {"query": ["Q? A.", "zzz"],
                                                      "prompts": ["Q?", "not a prefix"]})
    finally:
        stop_live(server)
    assert ok == 200
    assert status == 422 and out["field"] == "query[1]" and "1 of 2 queries" in out["error"]
