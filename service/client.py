"""A small client for the scoring service, plus ready adapters for trainers. Standard library only:
trainers import this file, or load it by path (verl), from environments that hold torch and their
own packages and nothing of bradley's server (the async client uses httpx when it is installed).

    client = ScoreClient("http://127.0.0.1:8000")
    client.score(["What is 2+2?"] * 2, ["4", "5"])            # -> [1.3, -0.4]

Adapters, with the trainers' exact command lines in docs/trainers.md: `trl_reward_func` (TRL's GRPO
reward function), `compute_score` and `compute_score_batch` (verl's custom reward function; the server
from BRADLEY_URL, the key from BRADLEY_API_KEY, the prompt from `extra_info` under the first of
PROMPT_KEYS, and without one they raise unless BRADLEY_ALLOW_EMPTY_PROMPT=1); OpenRLHF needs none
(`--remote_rm_url http://host:8000/get_reward`).

Per-item fields that a verifier may use (FORWARDED: ground_truth, verifier, data_source) travel with
each item when the trainer supplies them; keywords that mean nothing here are accepted and ignored.
Transient failures (connection errors, 502/503/504) are retried with exponential back-off; a 4xx
raises ClientError carrying the server's message and field at once. Env BRADLEY_RUN names the run.
A batch larger than one request may hold goes as several, of whole groups, by the server's
GET /limits (asked once); a body over the limit is refused here as 413 naming it."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

RETRY_STATUSES = {502, 503, 504}
MAX_ITEMS = 4096  # the server's default items per request; larger calls are sent in parallel chunks
CHECKED_BODY_BYTES = 1024  # the smallest body limit a server takes: smaller bodies always fit
PROMPT_KEYS = ("prompt", "question", "problem", "query")  # where verl's extra_info keeps the prompt
FORWARDED = ("ground_truth", "verifier", "data_source")


class ClientError(ValueError):
    """The server refused the request; `status` and `field` come from its error JSON."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.field = status, field


class MissingPrompt(ValueError):
    """A verl item carries no prompt, so a reward model cannot judge it."""


def score_body(prompts, responses, group_size=None, advantage=None, extras=None) -> dict:
    """The /score request for parallel lists of prompts (text or messages) and responses; `extras`
    maps a FORWARDED field to one value per item (None values are left out).

    >>> score_body(["2+2?"], ["4"], group_size=1, extras={"ground_truth": ["4"]})
    {'items': [{'prompt': '2+2?', 'response': '4', 'ground_truth': '4'}], 'group_size': 1}
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; pass one each")
    items = [{"prompt": p, "response": r} for p, r in zip(prompts, responses, strict=True)]
    for key, values in (extras or {}).items():
        for item, value in zip(items, values, strict=True):
            if value is not None:
                item[key] = value
    options = {"group_size": group_size, "advantage": advantage}
    return {"items": items, **{k: v for k, v in options.items() if v is not None}}


def get_reward_body(queries, prompts=None, labels=None) -> dict:
    """OpenRLHF's /get_reward body: the queries, with prompts and labels where given."""
    named = {"query": queries, "prompts": prompts, "labels": labels}
    return {key: list(values) for key, values in named.items() if values is not None}


def request_chunks(sizes: list[tuple[int, int]], group_size: int | None, max_items: int,
                   max_chars: int | None, max_bytes: int | None) -> list[tuple[int, int]]:
    """(start, end) runs of whole groups, each within `max_items` items, `max_chars` characters
    and `max_bytes` bytes of JSON (None: no bound); `sizes` is (characters, JSON bytes) per item. A
    group over a bound alone goes alone (the server's refusal then names it).

    >>> request_chunks([(10, 30)] * 6, 2, 100, 45, None)   # 4 items of 10 characters fit in 45
    [(0, 4), (4, 6)]
    """
    group = group_size or 1
    chunks, start, chars, size = [], 0, 0, 2
    for first in range(0, len(sizes), group):
        part = sizes[first:first + group]
        more_chars, more_bytes = sum(c for c, _ in part), sum(b for _, b in part)
        over = (first + len(part) - start > max_items
                or max_chars is not None and chars + more_chars > max_chars
                or max_bytes is not None and size + more_bytes > max_bytes)
        if over and first > start:
            chunks.append((start, first))
            start, chars, size = first, 0, 2
        chars, size = chars + more_chars, size + more_bytes
    if start < len(sizes) or not chunks:
        chunks.append((start, len(sizes)))
    return chunks


def _item_size(prompt, response: str, extras: dict, i: int) -> tuple[int, int]:
    """(characters the server counts, bytes of the item's JSON) of item i."""
    chars = len(response) + (len(prompt) if isinstance(prompt, str)
                             else sum(len(m.get("content", "")) for m in prompt))
    item = {"prompt": prompt, "response": response, **{k: v[i] for k, v in extras.items()}}
    return chars, len(json.dumps(item)) + 2


def _error(status: int, raw: bytes) -> ClientError:
    try:
        err = json.loads(raw)
        return ClientError(status, err.get("error", raw.decode("utf-8", "replace")), err.get("field"))
    except (ValueError, AttributeError):
        return ClientError(status, raw[:500].decode("utf-8", "replace"))


def _identity(api_key: str | None, run: str | None) -> dict:
    """The key's bearer header and the run's X-Bradley-Run (default env BRADLEY_RUN), where given."""
    run = run or os.environ.get("BRADLEY_RUN")
    return ({"Authorization": f"Bearer {api_key}"} if api_key else {}) | ({"X-Bradley-Run": run} if run else {})


class ScoreClient:
    """Blocking client over urllib; safe to share between threads. Context manager for symmetry.
    `run` (default env BRADLEY_RUN) names the training run in X-Bradley-Run for the server's watch."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 180.0, retries: int = 5,
                 workers: int = 4, run: str | None = None):
        self.url, self.timeout, self.retries = url.rstrip("/"), timeout, retries
        self._headers = {"Content-Type": "application/json"} | _identity(api_key, run)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bradley-client")
        self.workers, self._limits, self._limits_lock = workers, None, threading.Lock()

    def __enter__(self) -> ScoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _once(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def limits(self) -> dict:
        """The server's GET /limits for this caller, asked once ({} from a server without the
        route; an unreachable server is asked again next time)."""
        with self._limits_lock:
            if self._limits is None:
                try:
                    status, content = self._once("GET", "/limits", None, min(self.timeout, 10.0))
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    return {}
                self._limits = json.loads(content) if status == 200 else {}
            return self._limits

    def request(self, method: str, path: str, json_body=None, raw: bool = False):
        """The decoded JSON answer (`raw=True`: its bytes); a 4xx raises ClientError, and so does
        a body over the server's limit, before it is sent."""
        body = None if json_body is None else json.dumps(json_body).encode("utf-8")
        self._check_size(body)
        for attempt in range(self.retries + 1):
            try:
                status, content = self._once(method, path, body, self.timeout)
                if status not in RETRY_STATUSES or attempt == self.retries:
                    if status >= 400:
                        raise _error(status, content)
                    return content if raw else json.loads(content)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == self.retries:
                    raise
            time.sleep(min(0.2 * 2 ** attempt, 5.0))
        raise AssertionError("unreachable")

    def _check_size(self, body: bytes | None) -> None:
        if body is None or len(body) <= CHECKED_BODY_BYTES:
            return
        limit = self.limits().get("max_body_bytes")
        if limit and len(body) > limit:
            raise ClientError(413, f"the request body is {len(body):,} bytes, over the server's "
                              f"limit of {limit:,} (BRADLEY_MAX_BODY_BYTES); send less at once",
                              "body")

    def score(self, prompts, responses, group_size=None, advantage=None, extras=None) -> list[float]:
        """Scores in input order. A batch over what one request may hold (MAX_ITEMS items, the
        server's /limits) goes as several requests of whole groups, in parallel where the server
        allows a caller that many at once."""
        prompts, responses, extras = list(prompts), list(responses), extras or {}
        ranges = self._request_ranges(prompts, responses, group_size, extras)
        if len(ranges) == 1:
            return self.score_full(prompts, responses, group_size, advantage, extras)["scores"]

        def part(bounds):
            a, b = bounds
            return self.score_full(prompts[a:b], responses[a:b], group_size, advantage,
                                   {k: v[a:b] for k, v in extras.items()})["scores"]

        allowed = self.limits().get("max_concurrent") or self.workers
        parts = self._pool.map(part, ranges) if allowed >= self.workers else map(part, ranges)
        return [s for scores in parts for s in scores]

    def _request_ranges(self, prompts, responses, group_size, extras) -> list[tuple[int, int]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; pass one each")
        limits = self.limits() if len(prompts) > 1 else {}
        max_items = min(MAX_ITEMS, limits.get("max_items_per_request") or MAX_ITEMS)
        max_chars, max_bytes = limits.get("max_request_chars"), limits.get("max_body_bytes")
        if max_chars is None and max_bytes is None and len(prompts) <= max_items:
            return [(0, len(prompts))]
        sizes = [_item_size(p, r, extras, i) for i, (p, r) in enumerate(zip(prompts, responses,
                                                                             strict=True))]
        return request_chunks(sizes, group_size, max_items, max_chars,
                              None if max_bytes is None else max_bytes - 256)  # the body's other keys

    def score_full(self, prompts, responses, group_size=None, advantage=None, extras=None) -> dict:
        """The whole /score answer: scores, model, and advantages when group_size is given."""
        return self.request("POST", "/score",
                            score_body(prompts, responses, group_size, advantage, extras))

    def get_reward_full(self, queries: list[str], prompts: list[str] | None = None,
                        labels: list | None = None) -> dict:
        """OpenRLHF's remote-RM call: {"rewards", "scores", "extra_logs"}."""
        return self.request("POST", "/get_reward", get_reward_body(queries, prompts, labels))

    def get_reward(self, queries: list[str], prompts: list[str] | None = None,
                   labels: list | None = None) -> list[float]:
        return self.get_reward_full(queries, prompts, labels)["rewards"]

    def upload(self, kind: str, records: list[dict]) -> dict:
        """kind: judgments | pairs | feedback."""
        return self.request("POST", f"/{kind}", records)

    def models(self) -> list[dict]:
        return self.request("GET", "/models")["models"]

    def load_model(self, model_id: str) -> dict:
        return self.request("POST", f"/models/{model_id}/load")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll /readyz until a model is loaded; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._once("GET", "/readyz", None, 2.0)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.url} was not ready within {timeout:.0f} s")


class AsyncScoreClient:
    """The same calls for asyncio trainers and load generators: over httpx when it is installed
    (one pooled connection set), else the blocking client in worker threads."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 180.0, retries: int = 5,
                 max_connections: int = 100, run: str | None = None):
        self.url, self.retries = url.rstrip("/"), retries
        try:
            import httpx
        except ImportError:
            self._http, self._sync = None, ScoreClient(url, api_key, timeout, retries, run=run)
            return
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=_identity(api_key, run),
                                       limits=limits)
        self._transport_error = httpx.TransportError

    async def __aenter__(self) -> AsyncScoreClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        else:
            self._sync.close()

    async def request(self, method: str, path: str, json_body=None) -> dict:
        if self._http is None:
            return await asyncio.to_thread(self._sync.request, method, path, json_body)
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(method, path, json=json_body)
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    if response.status_code >= 400:
                        raise _error(response.status_code, response.content)
                    return response.json()
            except self._transport_error:
                if attempt == self.retries:
                    raise
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))
        raise AssertionError("unreachable")

    async def score(self, prompts, responses, group_size=None, advantage=None, extras=None) -> list[float]:
        body = score_body(prompts, responses, group_size, advantage, extras)
        return (await self.request("POST", "/score", body))["scores"]

    async def get_reward(self, queries: list[str], prompts: list[str] | None = None,
                         labels: list | None = None) -> list[float]:
        return (await self.request("POST", "/get_reward", get_reward_body(queries, prompts, labels)))["rewards"]


# --- trainer adapters ---------------------------------------------------------------------------


def completion_text(completion) -> str:
    """TRL completions are text, or (conversational) a list of messages: keep the assistant text.

    >>> completion_text([{"role": "assistant", "content": "4"}])
    '4'
    """
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")


def _forwarded(columns: dict, n: int) -> dict:
    """The FORWARDED per-item columns among a trainer's keyword arguments (lists of length n)."""
    return {k: list(v) for k, v in columns.items()
            if k in FORWARDED and isinstance(v, list | tuple) and len(v) == n}


def trl_reward_func(url: str | None = None, api_key: str | None = None, timeout: float = 180.0):
    """A TRL GRPO reward function scoring through the service: `f(prompts, completions, **columns)`.
    `url` and `api_key` default to BRADLEY_URL and BRADLEY_API_KEY."""
    client = ScoreClient(url or _env_url(), api_key=api_key or os.environ.get("BRADLEY_API_KEY"),
                         timeout=timeout)

    def bradley_reward(prompts, completions, **columns) -> list[float]:
        prompts = list(prompts)
        return client.score(prompts, [completion_text(c) for c in completions],
                            extras=_forwarded(columns, len(prompts)))

    bradley_reward.client = client  # so a caller can close it
    bradley_reward.__name__ = "bradley_reward"  # TRL logs rewards under the function's name
    return bradley_reward


def _env_url() -> str:
    return os.environ.get("BRADLEY_URL", "http://127.0.0.1:8000")


@functools.lru_cache(maxsize=8)
def _shared_client(url: str, api_key: str | None) -> ScoreClient:
    return ScoreClient(url, api_key=api_key)


def prompt_of(extra_info) -> str | list[dict]:
    """The prompt in a verl item's `extra_info`: the first of PROMPT_KEYS that holds text or messages.
    Raises MissingPrompt (naming the keys) unless BRADLEY_ALLOW_EMPTY_PROMPT=1, then returns "".

    >>> prompt_of({"split": "train", "index": 3, "question": "What is 2+2?"})
    'What is 2+2?'
    """
    info = extra_info if isinstance(extra_info, dict) else {}
    for key in PROMPT_KEYS:
        value = info.get(key)
        value = value.tolist() if hasattr(value, "tolist") else value  # parquet lists: numpy arrays
        if isinstance(value, str) and value or isinstance(value, list) and value:
            return value
    if os.environ.get("BRADLEY_ALLOW_EMPTY_PROMPT") == "1":
        return ""
    raise MissingPrompt(
        f"extra_info has no prompt under {', '.join(PROMPT_KEYS)} (keys: {sorted(info)}); add the "
        "question to extra_info in your data preprocessing, or set BRADLEY_ALLOW_EMPTY_PROMPT=1 to "
        "score responses without their prompt")


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None,
                  **kwargs) -> float:
    """verl's custom reward function (naive reward manager): the reward of `solution_str` for the
    prompt in `extra_info` (see prompt_of). Extra keywords (reward_kwargs, the reward loop's own) are
    accepted; ground_truth and data_source travel with the item for verifiers."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info])[0]


def compute_score_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None,
                        **kwargs) -> list[float]:
    """verl's batch reward manager calls this with the whole batch: one HTTP request per batch."""
    responses = list(solution_strs or [])
    n = len(responses)
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    prompts = [prompt_of(info) for info in infos]
    extras = {"ground_truth": list(ground_truths) if ground_truths is not None else [None] * n,
              "data_source": list(data_sources) if data_sources is not None else [None] * n}
    extras = {k: [v if isinstance(v, str | int | float) else None for v in vs]
              for k, vs in extras.items()}
    client = _shared_client(_env_url(), os.environ.get("BRADLEY_API_KEY"))
    return client.score(prompts, responses, extras=extras)
