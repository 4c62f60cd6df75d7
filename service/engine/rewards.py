"""Rewards that combine the reward model with rule verifiers (rm/verify/rules.py), for /score and
/get_reward.

An item may carry `ground_truth` (a string, a number, or a list of tests for `code`) and name its
checker with `verifier` (a name, or `{"name": ..., **options}`) or `data_source` (verl's field; the
map is `rm.verify.rules.DATA_SOURCES`: openai/gsm8k -> gsm8k, HuggingFaceH4/MATH-500 -> math,
openai/openai_humaneval -> code, ...). A data source that is not in the map has no checker here:
the reward model judges the item. Ground truth with neither uses BRADLEY_DEFAULT_VERIFIER (unset:
no verifier, so OpenRLHF's `labels` and verl's ground truth leave a plain reward-model server as it
was; set it, e.g. to gsm8k, to grade label-only protocols).

    reward_i = w_rm * rm_i + w_k * verifier_k(response_i, ground_truth_i)

Weights come from the request (`"weights": {"rm": 0, "gsm8k": 1}`), then the server's
BRADLEY_REWARD_WEIGHTS (`rm=0.5,gsm8k=1`), then the defaults: an item with ground truth is
verifier-only (w_rm 0, w_k 1), an item without it is RM-only (w_rm 1). A weight of 0 still reports
the component (the RM is run when `rm` is named at all and a model is loaded) without training on
it. A server with no model answers verifier-only requests; one that needs the RM answers 503.

    >>> weights_setting("rm=0.5, gsm8k=1")
    {'rm': 0.5, 'gsm8k': 1.0}
    >>> item_weights({"rm": 0.5}, "gsm8k"), item_weights({}, None), item_weights({}, "math")
    ((0.5, 1.0), (1.0, 0.0), (0.0, 1.0))
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from rm.verify.rules import (
    DATA_SOURCES,
    STATUSES,
    VERIFIERS,
    Check,
    VerifierError,
    available,
    resolve,
)
from service.api.payloads import PayloadError, check_text, finite_number, plain_strings
from service.engine.advantages import group_advantages, group_stats, keep_flags

MAX_TESTS = 1000


class CheckSpec(NamedTuple):
    """What one item is checked by and against: its verifier, ground truth and options (a
    NamedTuple: one is built per item of every request)."""
    verifier: str
    ground_truth: object
    options: dict | None = None


def weights_setting(text: str) -> dict[str, float]:
    """BRADLEY_REWARD_WEIGHTS, `name=weight` pairs separated by commas."""
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        number = _float(value)
        if not name.strip() or number is None:
            raise ValueError(f"BRADLEY_REWARD_WEIGHTS: {part!r} is not name=number (e.g. rm=0,gsm8k=1)")
        weights[name.strip()] = number
    return weights


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def item_weights(weights: dict[str, float], verifier: str | None) -> tuple[float, float]:
    """(w_rm, w_verifier) for an item checked by `verifier` (None: no ground truth)."""
    if verifier is None:
        return weights.get("rm", 1.0), 0.0
    return weights.get("rm", 0.0), weights.get(verifier, 1.0)


# -- parsing --------------------------------------------------------------------------------------


def parse_weights(value, names: set[str]) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PayloadError("weights", "must be an object such as {\"rm\": 0, \"gsm8k\": 1}")
    for key, w in value.items():
        if key != "rm" and key not in names:
            raise PayloadError(f"weights.{key}", f"unknown component; use rm or one of {sorted(names)}")
        if not finite_number(w):
            raise PayloadError(f"weights.{key}", "must be a finite number")
    return {k: float(w) for k, w in value.items()}


def _ground_truth(value, where: str, limits):
    if isinstance(value, bool):
        raise PayloadError(where, "must be a string, a number or a list of test strings, not bool")
    if isinstance(value, int | float):
        if not finite_number(value):
            raise PayloadError(where, "must be a finite number")
        return value
    if isinstance(value, list):
        if not value or len(value) > MAX_TESTS:
            raise PayloadError(where, f"a list of 1..{MAX_TESTS} test strings")
        return [check_text(t, f"{where}[{j}]", limits) for j, t in enumerate(value)]
    return check_text(value, where, limits)


def _verifier(item: dict, where: str, default: str, names: set[str], checked: set[str]
              ) -> tuple[str | None, dict | None]:
    spec, options = item.get("verifier"), None
    if isinstance(spec, dict):
        options = {k: v for k, v in spec.items() if k != "name"}
        spec = spec.get("name")
        if any(isinstance(v, dict | list) for v in options.values()):
            raise PayloadError(f"{where}.verifier", "options must be strings, numbers or booleans")
    if spec is not None and not isinstance(spec, str):
        raise PayloadError(f"{where}.verifier", "must be a verifier name or {\"name\": ..., options}")
    source = item.get("data_source")
    if source is not None and not isinstance(source, str):
        raise PayloadError(f"{where}.data_source", "must be a string")
    if spec is None and source is not None and source not in DATA_SOURCES:
        return None, None  # a dataset this server has no checker for: the reward model judges it
    name = resolve(spec, source) if spec is not None or source is not None else (default or None)
    if name is None:
        return None, None
    if name not in checked:
        _available(name, f"{where}.verifier", names)
        checked.add(name)
    return name, options or None


def _available(name: str, where: str, names: set[str]) -> None:
    if name not in names:
        raise PayloadError(where, f"unknown verifier {name!r}; use one of {sorted(names)}")
    try:
        if name in VERIFIERS:  # plugins (BRADLEY_VERIFIER_PLUGINS) live in the workers only
            available(name)
    except VerifierError as exc:  # a known checker this server does not run: not the caller's typo
        raise PayloadError(where, str(exc), 501) from None


def parse_checks(items: list, limits, names: set[str], default: str,
                 where: str = "items[{i}]", truth_field: str = "{where}.ground_truth"
                 ) -> list[CheckSpec | None]:
    """Per item: its CheckSpec when it has ground truth (not null, not ""), else None. `where` and
    `truth_field` shape the field names in errors (/get_reward reports `labels[3]`); they are
    formatted only for an item that needs its checks (a string ground truth within the size
    limit does not). A verifier named by a string or a data source is resolved once per request."""
    shared = _one_checker(items, limits, names, default, where)
    if shared is not None:
        return shared
    checks: list[CheckSpec | None] = []
    checked: set[str] = set()  # verifier names already found available in this request
    resolved: dict = {}  # (verifier, data_source) -> (name, None), for string or absent names
    longest = limits.max_text_chars
    for i, item in enumerate(items):
        truth = item.get("ground_truth") if isinstance(item, dict) else None
        if truth is None or truth == "":
            checks.append(None)
            continue
        if type(truth) is not str or len(truth) > longest:
            truth = _ground_truth(truth, truth_field.format(where=where.format(i=i)), limits)
        spec, source = item.get("verifier"), item.get("data_source")
        plain = type(spec) in _PLAIN and type(source) in _PLAIN  # hashable, nothing else decides
        found = resolved.get((spec, source)) if plain else None
        if found is None:
            found = _verifier(item, where.format(i=i), default, names, checked)
            if plain:
                resolved[spec, source] = found
        name, options = found
        checks.append(_new(CheckSpec, (name, truth, options)) if name is not None else None)
    return checks


def _one_checker(items: list, limits, names: set[str], default: str, where: str
                 ) -> list[CheckSpec | None] | None:
    """parse_checks in passes that run in C, for the usual request: every item holds a string
    ground truth within the limit, and all name the same verifier and data source (strings or
    absent). None for any other request: the loop decides, and words any error."""
    truths = plain_strings(items, "ground_truth", limits.max_text_chars)
    if truths is None or "" in truths:
        return None
    try:
        specs, sources = (set(map(dict.get, items, repeat(key))) for key in ("verifier", "data_source"))
    except TypeError:  # a {"name": ..., options} verifier: not hashable
        return None
    if len(specs) != 1 or len(sources) != 1:
        return None
    name, options = _verifier(items[0], where.format(i=0), default, names, set())
    if name is None:
        return [None] * len(items)
    return list(map(_new, repeat(CheckSpec), zip(repeat(name), truths, repeat(options))))


_new = tuple.__new__  # builds a CheckSpec in C; CheckSpec(...) runs NamedTuple's Python-level __new__
_PLAIN = (str, type(None))  # a verifier named by a string, or absent; a data source likewise


def label_checks(value: dict, n: int, limits, names: set[str], default: str) -> list[CheckSpec | None]:
    """/get_reward: `labels[i]` is item i's ground truth (OpenRLHF's `--label_key` column); an
    optional top-level `verifier` or `data_source` names the checker for all of them."""
    labels = value.get("labels")
    if labels is None:
        return [None] * n
    labels = labels if isinstance(labels, list) else [labels]
    if len(labels) != n:
        raise PayloadError("labels", f"must be a list as long as query ({n})")
    shared = {k: value[k] for k in ("verifier", "data_source") if value.get(k) is not None}
    items = [{"ground_truth": label, **shared} for label in labels]
    return parse_checks(items, limits, names, default, where="labels[{i}]", truth_field="{where}")


# -- combining ------------------------------------------------------------------------------------


@dataclass
class Combined:
    rewards: list[float]
    model: str | None
    rm: list[float] | None
    results: list[Check | None]  # each item's verifier result (None: not checked)
    checks: list[CheckSpec | None] = field(repr=False)

    @property
    def correct(self) -> list[bool | None]:
        return [v.correct if v else None for v in self.results]

    def status_counts(self) -> dict[str, int]:
        return _in_order(Counter(v.status for v in self.results if v))

    def item_logs(self) -> dict[str, list[float]]:
        """/get_reward's extra_logs: numbers per item, because OpenRLHF averages each key over the
        samples it logs. The mean of `verifier_reward` (0 where no verifier applies) and of `rm`
        are the component means; `status_<s>` is 1.0 where item i got status s, so its mean is
        that status's share and its sum the count (all five keys, always, for stable charts)."""
        logs = {"verifier_reward": [v.reward if v else 0.0 for v in self.results]}
        if self.rm is not None:
            logs["rm"] = list(self.rm)
        for status in STATUSES:
            logs[f"status_{status}"] = [float(v is not None and v.status == status)
                                        for v in self.results]
        return logs

    def reply(self) -> dict:
        """The /score response body (before any group fields)."""
        return {"scores": self.rewards, "model": self.model, **self.item_fields()}

    def item_fields(self) -> dict:
        """Per-item verifier results for the /score response."""
        if self.results and all(self.results):  # every item checked: columns transposed in C
            rewards, correct, _, status, extracted, _ = map(list, zip(*self.results, strict=True))
            return {"verifier": verifier_names(self.checks), "verifier_rewards": rewards,
                    "correct": correct, "status": status, "extracted": extracted,
                    "rm_scores": self.rm, "status_counts": _in_order(Counter(status))}
        return {"verifier": verifier_names(self.checks),
                "verifier_rewards": [v.reward if v else None for v in self.results],
                "correct": self.correct, "status": [v.status if v else None for v in self.results],
                "extracted": [v.extracted if v else None for v in self.results],
                "rm_scores": self.rm, "status_counts": self.status_counts()}


def _in_order(counts: Counter) -> dict[str, int]:
    return {s: counts[s] for s in STATUSES if counts[s]}


def verifier_names(checks: list[CheckSpec | None]) -> list[str | None]:
    """Each item's verifier (None: no check), in C when every item has one."""
    return list(map(_VERIFIER, checks)) if all(checks) else [c and c.verifier for c in checks]


_VERIFIER = itemgetter(0)  # of a CheckSpec


def weigh(merged: dict[str, float], checks: list[CheckSpec | None], model_loaded: bool
          ) -> tuple[list[tuple[float, float]], bool]:
    """Per item (w_rm, w_verifier), and whether the RM runs: a nonzero RM weight anywhere, or `rm`
    named at all while a model is loaded (a weight of 0 logs it without training on it)."""
    names = verifier_names(checks)
    by_name = {name: item_weights(merged, name) for name in set(names)}
    wants_rm = any(w_rm != 0 for w_rm, _ in by_name.values()) or ("rm" in merged and model_loaded)
    return list(map(by_name.__getitem__, names)), wants_rm


def assemble(checks: list[CheckSpec | None], per_item: list[tuple[float, float]],
             results: list[Check | None], rm: list[float] | None, model: str | None) -> Combined:
    """reward_i = w_rm * rm_i + w_verifier * result_i.reward, from results aligned with items."""
    rm_part = rm if rm is not None else [0.0] * len(results)
    rewards = [w_rm * r + (w_v * v.reward if v else 0.0)
               for (w_rm, w_v), r, v in zip(per_item, rm_part, results, strict=True)]
    return Combined(rewards, model, rm, results, checks)


async def combine(svc, prompts: list, responses: list[str], checks: list[CheckSpec | None],
                  weights: dict[str, float] | None, options=None) -> Combined:
    """Run the verifiers (worker processes) and, where needed, the RM (batcher) concurrently.
    `options`: the RM's service/engine/ensemble.ScoreOptions (run, aggregation)."""
    per_item, wants_rm = weigh({**svc.reward_weights, **(weights or {})}, checks,
                               svc.current is not None)
    calls = [(c.verifier, r, c.ground_truth, c.options)
             for c, r in zip(checks, responses, strict=True) if c is not None]
    verify_task = svc.verifiers.averify(calls) if calls else _nothing()
    model = rm = None
    if wants_rm:
        scored, results = await asyncio.gather(svc.score_detail(prompts, responses, options),
                                               verify_task)
        model, rm = scored.model, scored.scores
    else:  # verifier-only: no second task to schedule
        results = await verify_task
    it = iter(results)
    per_item_results = [next(it) if c is not None else None for c in checks]
    return assemble(checks, per_item, per_item_results, rm, model)


async def _nothing():
    return []


# -- groups ---------------------------------------------------------------------------------------


def group_fields(svc, req, rewards: list[float], correct: list[bool | None]) -> dict:
    """`advantages`, `degenerate_groups`, `group_stats` (and `keep` with dynamic sampling) of a
    /score request with `group_size`; updates the running pass rates and the Prometheus gauges."""
    size = req.group_size
    advantages, degenerate = group_advantages(rewards, size, req.advantage, req.std_ddof)
    starts = range(0, len(rewards), size)
    judged = [all(c is not None for c in correct[g:g + size]) for g in starts]
    rates = None
    if any(judged):
        kept = [g for g, j in zip(starts, judged, strict=True) if j]
        seen = iter(svc.pass_rates.update([req.prompts[g] for g in kept],
                                          [correct[g:g + size] for g in kept]))
        rates = [next(seen) if j else math.nan for j in judged]
    stats = group_stats(rewards, correct, size, rates)
    svc.metrics.on_group_stats(stats)
    out = {"advantages": advantages, "degenerate_groups": degenerate, "group_stats": stats}
    if req.dynamic_sampling:
        out["keep"] = keep_flags(rewards, correct, size)
    return out
