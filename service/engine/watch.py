"""The reward-hacking watch: signals over the last N scored items, per served model and per run.

During PPO/GRPO the policy learns whatever the reward model over-rewards, and the reward server sees
every response it is trained on. Per (model, run) the watch keeps a sliding window of the last
`window` items and reports, against the model's reference statistics (rm/model/reference_stats.py):

* reward mean and quantiles in validation stds from the validation mean (z): a policy pushing the
  reward model far beyond what it saw in validation (Gao et al. 2023 on over-optimisation);
* the Pearson correlation of reward with response length (characters) and the mean length, also as
  a ratio to validation's: most of PPO's reward gain can be length (Singhal et al. 2023; ODIN,
  Chen et al. 2024, tracks this correlation);
* the share of duplicate responses (1 − distinct / items): a collapsed policy repeats itself;
* the share of items whose final hidden state lies beyond validation's 99th-percentile Mahalanobis
  distance: out of the reward model's training distribution (InfoRM, Miao et al. 2024);
* the mean disagreement (std of standardised member scores) of an ensemble: members agree in
  distribution and diverge under policy shift (Eisenstein et al. 2023; Coste et al. 2024).

A run is named by the trainer (`run` in the body or the X-Bradley-Run header); each model keeps at
most `max_runs` names, in arrival order, and counts the rest as `other`, so the Prometheus series
stay bounded. Work on the event loop is one list append per request (`record`); a thread folds the
pending items into the windows, summarises them every `tick_s` seconds into the gauges, and every
`history_interval_s` seconds keeps a summary in a bounded history (GET /watch).

    >>> w = Window(4)
    >>> w.extend([0.0, 1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40, 50], [1, 2, 2, 3, 3], [0.0] * 5, None)
    >>> s = w.summary(ood_beyond=1.0, chars_reference=30.0)
    >>> s["items"], s["reward_z_mean"], s["duplicate_share"], s["response_chars_ratio"]
    (4, 2.5, 0.5, 1.1666666666666667)
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque

import numpy as np
from prometheus_client import Gauge

from service.api.payloads import PayloadError

DEFAULT_RUN, OTHER_RUN = "default", "other"
RUN_NAME = re.compile(r"[A-Za-z0-9_.:@/-]{1,64}")
MAX_PENDING_ITEMS = 200_000  # items waiting for the watch thread; beyond, records are dropped
SIGNALS = ("reward_z_mean", "reward_z_p05", "reward_z_p50", "reward_z_p95",
           "reward_length_correlation", "response_chars", "response_chars_ratio",
           "duplicate_share", "ood_share", "disagreement")


def run_of(value, headers) -> str:
    """The run a request belongs to: its body's `run`, else its X-Bradley-Run header, else
    `default`; a name of 1-64 letters, digits and `_.:@/-`."""
    run = value.get("run") if isinstance(value, dict) else None
    if run is None:
        run = headers.get("x-bradley-run")
    if run is None:
        return DEFAULT_RUN
    if not isinstance(run, str) or not RUN_NAME.fullmatch(run):
        raise PayloadError("run", "must be 1-64 letters, digits or _.:@/- (the training run's name, "
                                  "also sent as the X-Bradley-Run header)")
    return run


class Window:
    """The last `size` items of one (model, run)."""

    def __init__(self, size: int):
        self.z, self.chars, self.hashes = deque(maxlen=size), deque(maxlen=size), deque(maxlen=size)
        self.distances, self.disagreement = deque(maxlen=size), deque(maxlen=size)

    def extend(self, z, chars, hashes, distances, disagreement) -> None:
        self.z.extend(z)
        self.chars.extend(chars)
        self.hashes.extend(hashes)
        self.distances.extend(distances)
        self.disagreement.extend(disagreement if disagreement is not None else [np.nan] * len(z))

    def summary(self, ood_beyond: float, chars_reference: float) -> dict:
        z, chars = np.fromiter(self.z, float), np.fromiter(self.chars, float)
        finite = np.isfinite(z)
        p05, p50, p95 = np.quantile(z[finite], (0.05, 0.5, 0.95)) if finite.any() else [np.nan] * 3
        disagreement = np.fromiter(self.disagreement, float)
        return {
            "items": len(z), "reward_z_mean": _mean(z[finite]), "reward_z_p05": float(p05),
            "reward_z_p50": float(p50), "reward_z_p95": float(p95),
            "reward_length_correlation": _pearson(z[finite], chars[finite]),
            "response_chars": _mean(chars), "response_chars_ratio": _mean(chars) / chars_reference
            if chars_reference > 0 else np.nan,
            "duplicate_share": 1.0 - len(set(self.hashes)) / len(z) if len(z) else np.nan,
            "ood_share": _mean(np.fromiter(self.distances, float) > ood_beyond),
            "disagreement": _mean(disagreement) if not np.isnan(disagreement).all() else np.nan}


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else np.nan


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return np.nan
    return float(np.corrcoef(x, y)[0, 1])


class WatchGauges:
    """The watch's Prometheus gauges, labelled by model and run (reward_z by stat too)."""

    def __init__(self, registry):
        def gauge(name, doc, labels=("model", "run")):
            return Gauge(f"bradley_watch_{name}", doc, list(labels), registry=registry)

        self.items = gauge("items", "items in the watch's window (the last N scored)")
        self.reward_z = gauge("reward_z", "served reward in validation stds from the validation "
                              "mean over the window: stat=mean, p05, p50, p95",
                              ("model", "run", "stat"))
        self.signals = {
            "reward_length_correlation": gauge("reward_length_correlation", "Pearson r of reward and "
                                               "response length (characters) over the window"),
            "response_chars": gauge("response_chars", "mean response length (characters) over the "
                                    "window"),
            "response_chars_ratio": gauge("response_chars_ratio", "mean response length over the "
                                          "window / validation's"),
            "duplicate_share": gauge("duplicate_share", "1 - distinct responses / items, over the "
                                     "window"),
            "ood_share": gauge("ood_share", "share of the window's items beyond the validation 99th "
                               "percentile Mahalanobis distance (out of distribution)"),
            "disagreement": gauge("disagreement", "mean std of an ensemble's standardised member "
                                  "scores over the window (NaN for one model)")}
        self.reference_length_corr = gauge("reference_length_correlation", "Pearson r of reward and "
                                           "response length on the model's validation items",
                                           ("model",))

    def clear(self) -> None:
        for gauge in (self.items, self.reward_z, self.reference_length_corr, *self.signals.values()):
            gauge.clear()

    def set(self, model: str, run: str, summary: dict) -> None:
        self.items.labels(model, run).set(summary["items"])
        for stat in ("mean", "p05", "p50", "p95"):
            self.reward_z.labels(model, run, stat).set(summary[f"reward_z_{stat}"])
        for name, gauge in self.signals.items():
            gauge.labels(model, run).set(summary[name])


class Watch:
    """Windows, summaries, gauges and history of the served models (see the module docstring)."""

    def __init__(self, gauges: WatchGauges, window: int = 1024, max_runs: int = 8,
                 tick_s: float = 1.0, history_interval_s: float = 10.0, history_len: int = 360):
        self.window, self.max_runs, self.tick_s = window, max_runs, tick_s
        self.history_interval_s, self.history_len = history_interval_s, history_len
        self.gauges = gauges
        self._lock = threading.Lock()  # pending records and the installed models
        self._pending: list[tuple] = []
        self._pending_items = self.dropped = 0
        self._stats: dict[str, object] = {}  # model id -> ReferenceStats
        self._generation, self.reason = 0, "no model is loaded"
        self._windows: dict[tuple[str, str], Window] = {}
        self._runs: dict[str, list[str]] = {}
        self._summaries: dict[tuple[str, str], dict] = {}
        self._history: dict[tuple[str, str], deque] = {}
        self._changed: set[tuple[str, str]] = set()
        self._fold_lock = threading.Lock()  # the windows: the watch thread, or a refresh
        self._last_history = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watch:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._work, name="bradley-watch", daemon=True)
            self._thread.start()
        return self

    @property
    def watching(self) -> bool:
        return bool(self._stats)

    def install(self, stats: dict[str, object] | None, reason: str | None = None) -> None:
        """Watch these models ({id: ReferenceStats}) from now on; None: watch nothing, because
        `reason`. Windows and history of the models before are dropped."""
        with self._fold_lock, self._lock:
            self._stats, self.reason = dict(stats or {}), reason
            self._generation += 1
            self._pending, self._pending_items = [], 0
            self._windows, self._runs, self._summaries, self._history = {}, {}, {}, {}
            self._changed = set()
            self.gauges.clear()
            for model, ref in self._stats.items():
                self.gauges.reference_length_corr.labels(model).set(
                    np.nan if ref.length_correlation is None else ref.length_correlation)

    def record(self, run: str, responses: list[str], scored) -> None:
        """A scored request (service/engine/ensemble.py: Scored); on the event loop, so O(1)."""
        with self._lock:
            if not self._stats or self._pending_items > MAX_PENDING_ITEMS:
                self.dropped += len(responses) if self._stats else 0
                return
            self._pending.append((self._generation, run, responses, scored))
            self._pending_items += len(responses)

    def refresh(self) -> None:
        """Fold what is pending and summarise now (the watch thread does it every tick_s)."""
        with self._fold_lock:
            self._fold()
            self._summarise()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _work(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.refresh()

    def _fold(self) -> None:
        with self._lock:
            taken, self._pending, self._pending_items = self._pending, [], 0
            generation, stats = self._generation, self._stats
        for gen, run, responses, scored in taken:
            if gen != generation:
                continue
            chars, hashes = list(map(len, responses)), list(map(hash, responses))
            for model, ref in stats.items():
                if model not in scored.raw:
                    continue
                run_name = self._run_name(model, run)
                window = self._windows.setdefault((model, run_name), Window(self.window))
                distances = scored.distances.get(model) or [np.nan] * len(responses)
                window.extend(ref.standardise(scored.raw[model]), chars, hashes, distances,
                              scored.disagreement)
                self._changed.add((model, run_name))

    def _run_name(self, model: str, run: str) -> str:
        runs = self._runs.setdefault(model, [])
        if run in runs:
            return run
        if len(runs) < self.max_runs:
            runs.append(run)
            return run
        return OTHER_RUN

    def _summarise(self) -> None:
        now = time.time()
        for key in self._changed:
            ref = self._stats[key[0]]
            summary = self._windows[key].summary(ref.mahalanobis_p99, ref.response_chars_mean)
            self._summaries[key] = summary
            self.gauges.set(*key, summary)
        self._changed = set()
        if now - self._last_history >= self.history_interval_s:
            self._last_history = now
            for key, summary in self._summaries.items():
                self._history.setdefault(key, deque(maxlen=self.history_len)).append(
                    {"time": round(now, 3), **summary})

    def snapshot(self, history: bool = True) -> dict:
        """GET /watch: per model its reference and per run the current window (and history)."""
        with self._fold_lock:
            models = {}
            for model, ref in self._stats.items():
                runs = {run: {"current": _json(self._summaries[model, run]),
                              **({"history": [_json(h) for h in self._history.get((model, run), ())]}
                                 if history else {})}
                        for m, run in self._summaries if m == model}
                models[model] = {"reference": _reference(ref), "runs": runs}
        return {"watching": self.watching, "reason": None if self.watching else self.reason,
                "window": self.window, "max_runs": self.max_runs,
                "history_interval_s": self.history_interval_s, "dropped_items": self.dropped,
                "models": models}


def _reference(ref) -> dict:
    return {"score_mean": ref.score_mean, "score_std": ref.score_std,
            "length_correlation": ref.length_correlation,
            "response_chars_mean": ref.response_chars_mean, "mahalanobis_p99": ref.mahalanobis_p99,
            "covariance": ref.covariance_kind, "rank": ref.rank, "n_val": ref.n_val}


def _json(summary: dict) -> dict:
    """NaN (undefined: too few items, one model's disagreement) as null."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in summary.items()}
