"""A small client for the scoring service, synchronous and asyncio, plus ready adapters for trainers.

    client = ScoreClient("http://127.0.0.1:8000")
    client.score(["What is 2+2?"] * 2, ["4", "5"])            # -> [1.3, -0.4]

Adapters:
- TRL GRPO: `GRPOTrainer(reward_funcs=[trl_reward_func("http://host:8000")], ...)`; TRL calls it as
  `reward_func(prompts=..., completions=..., **dataset_columns)` with plain or conversational data.
- verl: `custom_reward_function.path=<this file> custom_reward_function.name=compute_score`; the
  server comes from BRADLEY_URL (default http://127.0.0.1:8000), the key from BRADLEY_API_KEY, and
  the prompt from `extra_info["prompt"]` when the dataset puts it there.

Transient failures (connection errors, 503 while the server is busy or restarting) are retried with
exponential back-off; a 4xx raises ClientError carrying the server's message and field at once.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time

import httpx

RETRY_STATUSES = {502, 503, 504}


class ClientError(ValueError):
    """The server refused the request; `status` and `field` come from its error JSON."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.field = status, field


def score_body(prompts, responses, group_size=None, advantage=None) -> dict:
    """The /score request for parallel lists of prompts (text or messages) and responses.

    >>> score_body(["2+2?"], ["4"], group_size=1)
    {'items': [{'prompt': '2+2?', 'response': '4'}], 'group_size': 1}
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; pass one each")
    body: dict = {"items": [{"prompt": p, "response": r} for p, r in zip(prompts, responses, strict=True)]}
    if group_size is not None:
        body["group_size"] = group_size
    if advantage is not None:
        body["advantage"] = advantage
    return body


def _check(response: httpx.Response) -> dict:
    if response.status_code < 400:
        return response.json()
    try:
        err = response.json()
        message, field = err.get("error", response.text), err.get("field")
    except ValueError:
        message, field = response.text[:500], None
    raise ClientError(response.status_code, message, field)


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class ScoreClient:
    """Blocking client; one keep-alive connection pool. Use as a context manager or call close()."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 180.0, retries: int = 5):
        self.url, self.retries = url.rstrip("/"), retries
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=_headers(api_key))

    def __enter__(self) -> ScoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs) -> dict:
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return _check(response)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            time.sleep(min(0.2 * 2 ** attempt, 5.0))
        raise AssertionError("unreachable")

    def score(self, prompts, responses, group_size=None, advantage=None) -> list[float]:
        return self.score_full(prompts, responses, group_size, advantage)["scores"]

    def score_full(self, prompts, responses, group_size=None, advantage=None) -> dict:
        """The whole /score answer: scores, model, and advantages when group_size is given."""
        return self.request("POST", "/score", json=score_body(prompts, responses, group_size, advantage))

    def get_reward(self, queries: list[str], prompts: list[str] | None = None) -> list[float]:
        body = {"query": queries} | ({"prompts": prompts} if prompts is not None else {})
        return self.request("POST", "/get_reward", json=body)["rewards"]

    def upload(self, kind: str, records: list[dict]) -> dict:
        """kind: judgments | pairs | feedback."""
        return self.request("POST", f"/{kind}", json=records)

    def models(self) -> list[dict]:
        return self.request("GET", "/models")["models"]

    def load_model(self, model_id: str) -> dict:
        return self.request("POST", f"/models/{model_id}/load")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll /readyz until a model is loaded; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._http.get("/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.url} was not ready within {timeout:.0f} s")


class AsyncScoreClient:
    """The same calls for asyncio trainers and load generators."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 180.0, retries: int = 5,
                 max_connections: int = 100):
        self.url, self.retries = url.rstrip("/"), retries
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=_headers(api_key),
                                       limits=limits)

    async def __aenter__(self) -> AsyncScoreClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kwargs) -> dict:
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(method, path, **kwargs)
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return _check(response)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))
        raise AssertionError("unreachable")

    async def score(self, prompts, responses, group_size=None, advantage=None) -> list[float]:
        body = score_body(prompts, responses, group_size, advantage)
        return (await self.request("POST", "/score", json=body))["scores"]

    async def get_reward(self, queries: list[str], prompts: list[str] | None = None) -> list[float]:
        body = {"query": queries} | ({"prompts": prompts} if prompts is not None else {})
        return (await self.request("POST", "/get_reward", json=body))["rewards"]


# --- trainer adapters ---------------------------------------------------------------------------


def completion_text(completion) -> str:
    """TRL completions are text, or (conversational) a list of messages: keep the assistant text.

    >>> completion_text([{"role": "assistant", "content": "4"}])
    '4'
    """
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")


def trl_reward_func(url: str, api_key: str | None = None, timeout: float = 180.0,
                    ground_truth_key: str = "ground_truth", data_source: str | None = None,
                    verifier: str | None = None):
    """A TRL GRPO reward function scoring through the service: `f(prompts, completions, **kw)`.
    When the dataset has a `ground_truth_key` column, TRL passes it along and it is forwarded, so the
    server's verifiers (named by `verifier` or `data_source`, else the server default) score it."""
    client = ScoreClient(url, api_key=api_key, timeout=timeout)

    def bradley_reward(prompts, completions, **kwargs) -> list[float]:
        texts = [completion_text(c) for c in completions]
        truths = kwargs.get(ground_truth_key)
        if truths is None:
            return client.score(list(prompts), texts)
        body = with_ground_truth(score_body(list(prompts), texts), truths, data_source, verifier)
        return client.request("POST", "/score", json=body)["scores"]

    bradley_reward.client = client  # so a caller can close it
    return bradley_reward


# --- ground truth for the server's verifiers (issue 19) ------------------------------------------


def with_ground_truth(body: dict, ground_truths, data_source=None, verifier=None) -> dict:
    """Add `ground_truth` (and `data_source` / `verifier`) to each item of a /score body; an item
    whose ground truth is None is left to the reward model.

    >>> with_ground_truth(score_body(["q"], ["#### 4"]), ["4"], data_source="openai/gsm8k")["items"]
    [{'prompt': 'q', 'response': '#### 4', 'ground_truth': '4', 'data_source': 'openai/gsm8k'}]
    """
    if len(ground_truths) != len(body["items"]):
        raise ValueError(f"{len(ground_truths)} ground truths for {len(body['items'])} items")
    for item, truth in zip(body["items"], ground_truths, strict=True):
        if truth is not None:
            item["ground_truth"] = truth
            item.update({k: v for k, v in (("data_source", data_source), ("verifier", verifier))
                         if v is not None})
    return body


@functools.lru_cache(maxsize=8)
def _shared_client(url: str, api_key: str | None) -> ScoreClient:
    return ScoreClient(url, api_key=api_key)


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl's custom reward function signature: the reward of `solution_str` for the prompt in
    `extra_info["prompt"]` (empty when absent). `ground_truth` and `data_source` are forwarded, so
    the server's verifier for that source scores it (BRADLEY_VERIFIER names one explicitly, and
    the server's BRADLEY_REWARD_WEIGHTS mixes in the reward model); with no ground truth the reward
    model alone judges the text."""
    client = _shared_client(os.environ.get("BRADLEY_URL", "http://127.0.0.1:8000"),
                            os.environ.get("BRADLEY_API_KEY"))
    prompt = (extra_info or {}).get("prompt", "") if isinstance(extra_info, dict) else ""
    if ground_truth is None:
        return client.score([prompt], [solution_str])[0]
    verifier = os.environ.get("BRADLEY_VERIFIER")
    body = with_ground_truth(score_body([prompt], [solution_str]), [ground_truth],
                             None if verifier else data_source, verifier)
    return client.request("POST", "/score", json=body)["scores"][0]
