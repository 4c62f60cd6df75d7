"""Prometheus metrics of one app instance (a registry per app: no import-time singletons), and the
running reward-length correlation of served scores, a cheap early warning of reward hacking: a
policy that learns "longer scores higher" drives this towards 1.

The correlation is Pearson's r over every (response length, finite score) served since the model was
loaded, kept as co-moments and merged batch by batch with the pairwise update of Chan, Golub &
LeVeque (1979), which stays exact in one pass, holding at most PENDING_PAIRS pairs between merges:

    n = n_a + n_b,  d_x = mean_x_b - mean_x_a,  C = C_a + C_b + d_x * d_y * n_a * n_b / n,
    r = C_xy / sqrt(M2_x * M2_y)

    >>> m = merge_moments(merge_moments(Moments(), [1, 2], [2, 4]), [3], [7])
    >>> round(pearson(m), 4)   # same as np.corrcoef([1, 2, 3], [2, 4, 7])[0, 1]
    0.9934
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from service.engine.watch import WatchGauges

PENDING_PAIRS = 4096  # served (length, score) pairs kept before they are merged into the moments
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
GROUP_GAUGES = {"reward": "all_equal_share", "accuracy": "accuracy_all_equal_share",
                "predicted": "predicted_all_equal",
                "predicted_per_prompt": "predicted_all_equal_per_prompt"}
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Moments:
    n: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    m2_x: float = 0.0
    m2_y: float = 0.0
    c_xy: float = 0.0


def merge_moments(a: Moments, xs: Sequence[float], ys: Sequence[float]) -> Moments:
    """Moments of a's pairs plus the pairs (xs[i], ys[i])."""
    n_b = len(xs)
    if n_b == 0:
        return a
    mx, my = sum(xs) / n_b, sum(ys) / n_b
    b = Moments(n_b, mx, my, sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys),
                sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)))
    n = a.n + n_b
    dx, dy = b.mean_x - a.mean_x, b.mean_y - a.mean_y
    w = a.n * n_b / n
    return Moments(n, a.mean_x + dx * n_b / n, a.mean_y + dy * n_b / n, a.m2_x + b.m2_x + dx * dx * w,
                   a.m2_y + b.m2_y + dy * dy * w, a.c_xy + b.c_xy + dx * dy * w)


def pearson(m: Moments) -> float:
    """Pearson's r of the merged pairs; NaN until both variables vary."""
    denominator = math.sqrt(m.m2_x * m.m2_y)
    return m.c_xy / denominator if denominator > 0 else math.nan


class Metrics:
    """Every `bradley_*` metric of one app; `render()` is the /metrics body."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.request_seconds = Histogram("bradley_request_seconds", "HTTP request latency by route",
                                         ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.responses = Counter("bradley_responses", "HTTP responses by route and status",
                                 ["route", "status"], registry=r)
        self.forward_rows = Histogram("bradley_forward_rows", "rows per model forward (batch size)",
                                      buckets=ROWS_BUCKETS, registry=r)
        self.forward_seconds = Histogram("bradley_forward_seconds", "model forward time",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_items = Gauge("bradley_queue_items", "items waiting for the model", registry=r)
        # the alert rules divide by these, so thresholds need not repeat the settings
        self.queue_limit = Gauge("bradley_queue_limit_items",
                                 "BRADLEY_MAX_QUEUE_ITEMS: past it /score answers 503", registry=r)
        self.model_ready = Gauge("bradley_model_ready", "1 while a model is loaded (/readyz 200)",
                                 registry=r)
        self.read_only = Gauge("bradley_read_only", "1 on a scorer that refuses writes", registry=r)
        self.items = Counter("bradley_scored_items", "items scored (rate() gives items/s)", registry=r)
        self.tokens = Counter("bradley_scored_tokens", "tokens scored (rate() gives tokens/s)",
                              registry=r)
        self.padded_tokens = Counter("bradley_padded_tokens", "tokens including padding", registry=r)
        self.model = Info("bradley_model", "the model /score serves", registry=r)
        self.model_swaps = Counter("bradley_model_loads", "models loaded (start-up and hot swaps)",
                                   registry=r)
        self.ingest_rows = Counter("bradley_ingest_rows", "rows uploaded over HTTP",
                                   ["route", "result"], registry=r)
        self.ingest_batches = Counter("bradley_ingest_batches", "uploads by outcome",
                                      ["route", "outcome"], registry=r)
        self.length_corr = Gauge("bradley_reward_length_correlation",
                                 "Pearson r of response length (characters) and served score since "
                                 "the model was loaded", registry=r)
        self.verifier_calls = Counter("bradley_verifier_calls", "verifier calls by verifier and "
                                      "status (ok, no_answer, unparseable_gold, timeout, error)",
                                      ["verifier", "status"], registry=r)
        self.group_shares = Gauge("bradley_group_all_equal_share", "last /score batch with "
                                  "group_size: share of groups that are all equal (kind=reward, "
                                  "accuracy), and its predictions (kind=predicted: p^G + (1-p)^G "
                                  "from mean accuracy; predicted_per_prompt: from running pass "
                                  "rates)", ["kind"], registry=r)
        self.get_reward_splits = Counter(
            "bradley_get_reward_splits", "/get_reward queries by how they were split into prompt and "
            "response (unsplit: scored as a response without its prompt)", ["how"], registry=r)
        self.prompt_cache = Gauge(
            "bradley_prompt_cache_lookups", "prompt-part cache look-ups of the served model since it "
            "was loaded, by result (a hit: a prompt not rendered and tokenized again)", ["result"],
            registry=r)
        self.started = Gauge("bradley_start_time_seconds", "process start (unix time)", registry=r)
        self.watch = WatchGauges(r)  # the reward-hacking watch's (service/engine/watch.py)
        self.started.set(time.time())
        # on_scores runs on the event loop, on_model in a hot swap's worker thread: one lock
        self._pairs_lock = threading.Lock()
        self._moments, self._lengths, self._scores = Moments(), [], []
        self._model_id = None  # whose scores the correlation is of
        self.length_corr.set_function(self._length_corr)

    def on_forward(self, rows: int, tokens: int, padded: int, seconds: float) -> None:
        self.forward_rows.observe(rows)
        self.forward_seconds.observe(seconds)
        self.items.inc(rows)
        self.tokens.inc(tokens)
        self.padded_tokens.inc(padded)

    def on_model(self, model_id: str, prompts=None) -> None:
        """A model was installed; `prompts` is its rm.model.prompt_cache.PromptCache, read at
        scrape."""
        # the id only: /metrics is readable without a key, and a path describes the operator's disk
        self.model.info({"model_id": model_id})
        if prompts is not None:
            self.prompt_cache.labels("hit").set_function(lambda: prompts.hits)
            self.prompt_cache.labels("miss").set_function(lambda: prompts.misses)
        self.model_swaps.inc()
        with self._pairs_lock:
            self._moments, self._lengths, self._scores = Moments(), [], []
            self._model_id = model_id

    def on_scores(self, model_id: str, responses: Sequence[str], scores: Sequence[float]) -> None:
        """Kept, and merged into the moments when /metrics is read or PENDING_PAIRS wait: merging
        per request was a visible share of the event loop's work on small /score requests. Scores
        of a model swapped out while they were computed are left out."""
        with self._pairs_lock:
            if model_id != self._model_id:
                return
            self._lengths.extend(map(len, responses))
            self._scores.extend(scores)
            if len(self._lengths) >= PENDING_PAIRS:
                self._merge_pending()

    def _merge_pending(self) -> None:
        """Under `_pairs_lock`. A NaN or infinite score (a diverged model) is left out, rather than
        making the correlation NaN until the next model."""
        finite = [(x, y) for x, y in zip(self._lengths, self._scores, strict=True) if math.isfinite(y)]
        self._moments = merge_moments(self._moments, [x for x, _ in finite], [y for _, y in finite])
        self._lengths, self._scores = [], []

    def _length_corr(self) -> float:
        with self._pairs_lock:
            self._merge_pending()
            return pearson(self._moments)

    def on_check(self, verifier: str, status: str, n: int = 1) -> None:
        self.verifier_calls.labels(verifier, status).inc(n)

    def on_group_stats(self, stats: dict) -> None:
        for kind, key in GROUP_GAUGES.items():
            if key in stats:
                self.group_shares.labels(kind).set(stats[key])

    def on_ingest(self, route: str, rows_ok: int, rows_rejected: int, outcome: str) -> None:
        self.ingest_rows.labels(route, "ok").inc(rows_ok)
        self.ingest_rows.labels(route, "rejected").inc(rows_rejected)
        self.ingest_batches.labels(route, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
