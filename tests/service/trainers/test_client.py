"""The client and the trainer adapters against the live server."""

from __future__ import annotations

import asyncio

import pytest

from service.client import (
    AsyncScoreClient,
    ClientError,
    ScoreClient,
    compute_score,
    compute_score_batch,
    trl_reward_func,
)
from tests.service.conftest import API_KEY


def test_sync_client_scores_groups_and_openrlhf(live, hh_items, offline):
    prompts, responses = [p for p, _ in hh_items[:4]], [r for _, r in hh_items[:4]]
    expected = offline["rm-tiny-a"].score(prompts, responses)
    with ScoreClient(live.url) as client:
        client.wait_ready(timeout=30)
        assert client.score(prompts, responses) == pytest.approx(expected, abs=1e-5)
        full = client.score_full(prompts, responses, group_size=2, advantage="dr_grpo")
        assert full["advantages"][0] == pytest.approx((expected[0] - expected[1]) / 2, abs=1e-5)
        queries = [p + r for p, r in zip(prompts, responses, strict=True)]
        assert client.get_reward(queries, prompts) == pytest.approx(expected, abs=1e-5)
        assert {m["id"] for m in client.models()} >= {"rm-tiny-a", "rm-tiny-b"}


def test_client_errors_carry_status_and_field(live):
    with ScoreClient(live.url, retries=0) as client:
        with pytest.raises(ClientError) as info:
            client.score(["p"], [123])
        assert (info.value.status, info.value.field) == (422, "items[0].response")
        with pytest.raises(ClientError) as info:
            client.upload("judgments", [{"prompt": "p"}])
        assert info.value.status == 401


def test_upload_with_key(live, shared_data):
    row = {"prompt": "Is the sky blue?", "response_a": "Yes, on a clear day.", "response_b": "No.",
           "winner": "a", "rater": "human:client-test"}
    with ScoreClient(live.url, api_key=API_KEY) as client:
        assert client.upload("judgments", [row])["rows_ok"] == 1


def test_async_client(live, hh_items, offline):
    prompts, responses = [hh_items[5][0]] * 3, [r for _, r in hh_items[5:8]]

    async def main():
        async with AsyncScoreClient(live.url) as client:
            return await asyncio.gather(*(client.score([p], [r]) for p, r in
                                          zip(prompts, responses, strict=True)))

    got = [s[0] for s in asyncio.run(main())]
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, responses), abs=1e-5)


def test_trl_reward_func_takes_conversational_completions(live, offline):
    reward = trl_reward_func(live.url)
    prompts = [[{"role": "user", "content": "Say hi"}]] * 2
    completions = [[{"role": "assistant", "content": "hi"}], [{"role": "assistant", "content": "no"}]]
    got = reward(prompts=prompts, completions=completions, solution=["x", "y"])
    reward.client.close()
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, ["hi", "no"]), abs=1e-5)


def test_verl_compute_score_reads_the_url_from_the_environment(live, monkeypatch, offline):
    monkeypatch.setenv("BRADLEY_URL", live.url)
    got = compute_score("chat", "The answer is 4.", "4", {"prompt": "What is 2+2?"})
    assert got == pytest.approx(offline["rm-tiny-a"].score(["What is 2+2?"], ["The answer is 4."])[0],
                                abs=1e-5)


def test_verl_compute_score_forwards_ground_truth(live, monkeypatch):
    """verl calls compute_score(data_source, solution_str, ground_truth, extra_info) per sample and
    dispatches on data_source "openai/gsm8k" (volcengine/verl verl/utils/reward_score/__init__.py,
    default_compute_score, commit 03c3afd25c6ab4549b5886cfd883aac0dd001b52): the server's gsm8k
    verifier scores such items; a source it has no checker for is left to the reward model."""
    monkeypatch.setenv("BRADLEY_URL", live.url)
    assert compute_score("openai/gsm8k", "2+2=4\n#### 4", "4", {"prompt": "2+2?"}) == pytest.approx(1.1)
    assert compute_score("openai/gsm8k", "The answer is 4.", "4", {"prompt": "2+2?"}) == 0.0
    assert compute_score_batch(["openai/gsm8k", "HuggingFaceH4/MATH-500"], ["#### 7", r"\boxed{7}"],
                               ["7", "7"], [{"prompt": "q"}] * 2) == pytest.approx([1.1, 1.0])


def test_trl_reward_func_forwards_the_ground_truth_column(live):
    """TRL's GRPOTrainer passes every dataset column but prompt/completion to reward functions as
    keyword lists (huggingface/trl trl/trainer/grpo_trainer.py, the reward_kwargs of its reward
    computation)."""
    reward = trl_reward_func(live.url)
    got = reward(prompts=["q1", "q2", "q3"], completions=["#### 3", "#### 5", "x"],
                 ground_truth=["3", "4", "1"], data_source=["openai/gsm8k"] * 3)
    reward.client.close()
    assert got == pytest.approx([1.1, 0.1, 0.0])


def test_large_calls_go_as_parallel_chunks_of_whole_groups(live, hh_items, offline, monkeypatch):
    import service.client as client_module

    monkeypatch.setattr(client_module, "MAX_ITEMS", 5)  # chunks of 4: two whole groups of 2
    prompts, responses = [p for p, _ in hh_items[:10]], [r for _, r in hh_items[:10]]
    with ScoreClient(live.url) as client:
        got = client.score(prompts, responses, group_size=2)
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, responses), abs=1e-5)


def test_the_run_travels_as_a_header_for_the_watch(monkeypatch):
    from service.client import AsyncScoreClient, ScoreClient

    assert "X-Bradley-Run" not in ScoreClient("http://127.0.0.1:9")._headers
    assert ScoreClient("http://127.0.0.1:9", run="ppo-1")._headers["X-Bradley-Run"] == "ppo-1"
    monkeypatch.setenv("BRADLEY_RUN", "grpo-2")
    assert ScoreClient("http://127.0.0.1:9")._headers["X-Bradley-Run"] == "grpo-2"
    assert AsyncScoreClient("http://127.0.0.1:9")._http.headers["X-Bradley-Run"] == "grpo-2"
