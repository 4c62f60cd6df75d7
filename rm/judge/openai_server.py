"""`openai:URL`: an LLM judge behind an OpenAI-compatible HTTP server (llama.cpp, vLLM, OpenAI).

First choice, `POST {URL}/completions` with `max_tokens: 1, logprobs: K` on the same judge prompt a
local judge reads: P(first) is the two labels' probability mass among the returned top log-probs,
normalised over the two (tokens compared after stripping spaces, so " A" and "A" both count). The
response shape is the legacy completions one, `choices[0].logprobs.top_logprobs[0]` = {token: logp}
(llama-cpp-python 0.3 `llama_cpp/llama_types.py` CompletionLogprobs; OpenAI's legacy API).

When a server returns no log-probs, or neither label is among them, the judge asks
`POST {URL}/chat/completions` for a verdict ending in `[[A]]`, `[[B]]` or `[[C]]` (a tie; the MT-Bench
pairwise judge's format, Zheng et al. 2023) and parses it strictly: exactly one such marker, else
the answer is counted as a failure and stored as nothing (None), never guessed.

The API key comes from BRADLEY_JUDGE_API_KEY (sent as a Bearer token when set). Each request has a
timeout; 429, 5xx, timeouts and refused connections are retried with exponential backoff
(0.5 s, 1 s, 2 s, ...), and at most `concurrency` requests run at once. A server that never answers
raises JudgeError after the last try, so the caller writes nothing.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from rm.judge.local import Item, JudgeError, Template

RETRY_STATUS = {429, 500, 502, 503, 504}
VERDICT = re.compile(r"\[\[([ABC])\]\]")
VERDICT_PROBABILITY = {"A": 1.0, "B": 0.0, "C": 0.5}
VERDICT_INSTRUCTION = ("\n\nAfter any reasoning, end your reply with [[A]] if the first response is "
                       "better, [[B]] if the second is better, or [[C]] for a tie.")


def parse_verdict(text: str) -> float | None:
    """P(first) from a strict [[A]]/[[B]]/[[C]] verdict; None when absent or ambiguous.

    >>> parse_verdict("Both are fine, but [[B]]"), parse_verdict("[[C]]"), parse_verdict("A")
    (0.0, 0.5, None)
    >>> parse_verdict("[[A]] ... no, [[B]]") is None
    True
    """
    found = set(VERDICT.findall(text or ""))
    return VERDICT_PROBABILITY[found.pop()] if len(found) == 1 else None


def label_mass(top: dict, labels: Sequence[str]) -> float | None:
    """P(first label) normalised over the two labels from a {token: logprob} map; None if both absent.

    >>> round(label_mass({" A": math.log(0.3), "B": math.log(0.1), "C": -1.0}, ("A", "B")), 6)
    0.75
    """
    mass = [sum(math.exp(lp) for tok, lp in top.items() if tok.strip() == label) for label in labels]
    total = mass[0] + mass[1]
    return mass[0] / total if total > 0 else None


class OpenAIJudge:
    def __init__(self, url: str, template: Template, labels: Sequence[str] = ("A", "B"),
                 timeout: float = 30.0, retries: int = 3, concurrency: int = 4, model: str | None = None,
                 top_logprobs: int = 10, backoff: float = 0.5):
        if not url.startswith(("http://", "https://")):
            raise JudgeError(f"openai:{url}: the URL must start with http:// or https://")
        self.url, self.template, self.labels = url.rstrip("/"), template, tuple(labels)
        self.timeout, self.retries, self.concurrency = timeout, retries, concurrency
        self.model, self.top_logprobs, self.backoff = model or "judge", top_logprobs, backoff
        self.name = url
        self.forwards = 0
        key = os.environ.get("BRADLEY_JUDGE_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers,
                                   limits=httpx.Limits(max_connections=concurrency))

    def close(self) -> None:
        self.client.close()

    def prefer(self, items: Sequence[Item]) -> list[float | None]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self.one, items))

    def one(self, item: Item) -> float | None:
        prompt, first, second, principle = item
        head, tail = self.template(prompt, first, second)
        text = head + tail.replace("{principle}", principle)
        body = {"model": self.model, "prompt": text, "max_tokens": 1, "temperature": 0,
                "logprobs": self.top_logprobs}
        choice = self._post("/completions", body)["choices"][0]
        top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0]
        p = label_mass(top, self.labels) if isinstance(top, dict) else None
        if p is not None:
            return p
        return self._chat_verdict(text)

    def _chat_verdict(self, text: str) -> float | None:
        body = {"model": self.model, "temperature": 0, "max_tokens": 256,
                "messages": [{"role": "user", "content": _without_answer_cue(text) + VERDICT_INSTRUCTION}]}
        choice = self._post("/chat/completions", body)["choices"][0]
        return parse_verdict((choice.get("message") or {}).get("content") or "")

    def _post(self, path: str, body: dict) -> dict:
        last = "no answer"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self.client.post(self.url + path, json=body)
            except httpx.TimeoutException:
                last = f"no answer within {self.timeout:g} s"
                continue
            except httpx.TransportError as exc:
                last = f"cannot connect ({type(exc).__name__}: {exc})"
                continue
            self.forwards += 1
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise JudgeError(f"openai:{self.url}{path}: HTTP {response.status_code}: "
                                 f"{response.text[:200]}")
            try:
                data = response.json()
                data["choices"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                return {"choices": [{}]}  # not an OpenAI answer: a failure for this item, not a guess
            return data
        raise JudgeError(f"openai:{self.url}{path}: {last} after {self.retries + 1} tries; "
                         "is the server running? (check the URL, or raise --timeout)")


def _without_answer_cue(text: str) -> str:
    """Drop a trailing 'The answer is: (' style cue meant for log-prob reading."""
    return re.sub(r"\n[^\n]*\(\s*$", "", text.rstrip())
