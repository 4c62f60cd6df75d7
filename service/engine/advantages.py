"""Group-relative advantages for GRPO-style trainers, computed where the rewards are, and the group
statistics that say whether a batch carries any signal.

A request with `group_size=G` holds consecutive groups of G completions of the same prompt. For the
rewards r_1..r_G of one group:

- `grpo` (Shao et al. 2024, DeepSeekMath, eq. 3 "outcome supervision"): A_i = (r_i - mean(r)) / (std(r) + eps),
  eps = 1e-4; `std_ddof=1` (the sample standard deviation, as TRL's GRPOTrainer and verl compute it)
  by default, `std_ddof=0` reproduces worked examples that use the population std.
- `dr_grpo` (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"):
  A_i = r_i - mean(r); dividing by the std up-weights groups whose rewards barely differ.

A group whose rewards are all equal is *degenerate*: every advantage is exactly 0, so it gives the
policy no gradient; the response flags such groups so a trainer can resample or skip them. "Equal"
allows a spread of 1e-6 x max(1, |r|): the same text scored in two differently shaped float32
forwards can differ in the 8th digit, and dividing that by eps would invent a signal.

    >>> adv, degenerate = group_advantages([1.0, 2.0, 3.0, 5.0, 5.0, 5.0], group_size=3)
    >>> [round(a, 4) for a in adv], degenerate
    ([-0.9999, 0.0, 0.9999, 0.0, 0.0, 0.0], [False, True])
    >>> group_advantages([1.0, 2.0, 3.0, 5.0], group_size=2, method="dr_grpo")
    ([-0.5, 0.5, -1.0, 1.0], [False, False])

**What the std division does to a format bonus** (gsm8k's +0.1 for a well-formed `#### N`). With
ddof 1, the group (0, 0.1, 0, 0), where nobody is right and one answer is merely well formed, gives
that answer +1.497, about what the one *correct* answer in (1.1, 0.1, 0.1, 0.1) gets (+1.4997):
GRPO rescales every group to unit spread, so a 0.1 bonus in a group with nothing else to tell apart
weighs as much as correctness. Dr. GRPO keeps the scale: +0.075 against +0.75, the bonus stays a
tenth of the answer. Under GRPO a small shaping bonus is not small; drop it once the format is
learned, use Dr. GRPO, or filter such groups (`dynamic_sampling`: their accuracy is all equal).

    >>> [round(a, 4) for a in group_advantages([0, 0.1, 0, 0], 4)[0]][1]
    1.497
    >>> [round(a, 4) for a in group_advantages([0, 0.1, 0, 0], 4, "dr_grpo")[0]][1]
    0.075

**Group statistics.** When every completion of a prompt succeeds with probability p, a group of G is
all-equal (all right or all wrong, no signal) with probability p^G + (1-p)^G. Reported: the observed
share, the prediction from the batch's mean accuracy p̄, and a per-prompt prediction from each
prompt's running pass rate. The function is convex, so on prompts of mixed difficulty the mean-p
prediction underestimates: half the prompts at p = 0.2 and half at 0.8 give 0.4112 all-equal groups
at G = 4, while p̄ = 0.5 predicts 0.125.

    >>> [round(float(predicted_all_equal(p, g)), 4) for p, g in ((0.5, 4), (0.9, 4), (0.97, 4), (0.9, 16))]
    [0.125, 0.6562, 0.8853, 0.1853]
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

GRPO_EPS = 1e-4
EQUAL_RTOL = 1e-6
PASS_RATE_PROMPTS = 100_000  # running pass rates kept (least recently seen prompts are forgotten)


def _grpo(rewards: np.ndarray, ddof: int = 1) -> np.ndarray:
    centered = rewards - rewards.mean(axis=1, keepdims=True)
    if rewards.shape[1] <= ddof:  # too few completions per prompt for this std: nothing to divide by
        return centered
    return centered / (rewards.std(axis=1, ddof=ddof, keepdims=True) + GRPO_EPS)


def _dr_grpo(rewards: np.ndarray, ddof: int = 1) -> np.ndarray:
    return rewards - rewards.mean(axis=1, keepdims=True)


ADVANTAGES: dict[str, Callable[..., np.ndarray]] = {"grpo": _grpo, "dr_grpo": _dr_grpo}


def _check_groups(n: int, group_size: int) -> None:
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size {group_size} must be positive and divide the number of "
                         f"items ({n}); send whole groups of consecutive completions")


def all_equal(grouped: np.ndarray) -> np.ndarray:
    """Per row: are its values equal within 1e-6 x max(1, |r|)?"""
    scale = np.maximum(1.0, np.abs(grouped).max(axis=1))
    return np.ptp(grouped, axis=1) <= EQUAL_RTOL * scale


def group_advantages(rewards: Sequence[float], group_size: int, method: str = "grpo",
                     std_ddof: int = 1) -> tuple[list[float], list[bool]]:
    """Advantages of consecutive groups of `group_size` rewards, and which groups are degenerate.

    >>> [round(a, 4) for a in group_advantages([1, 0, 0, 1], 4, std_ddof=0)[0]]
    [0.9998, -0.9998, -0.9998, 0.9998]
    """
    if method not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {sorted(ADVANTAGES)}, not {method!r}")
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof must be 0 or 1, not {std_ddof!r}")
    _check_groups(len(rewards), group_size)
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    degenerate = all_equal(grouped)
    advantages = ADVANTAGES[method](grouped, ddof=std_ddof)
    advantages[degenerate] = 0.0  # exact zero, not eps-divided rounding noise
    return advantages.ravel().tolist(), degenerate.tolist()


def predicted_all_equal(p, group_size: int):
    """Probability that G Bernoulli(p) draws are all equal: p^G + (1-p)^G (p may be an array)."""
    p = np.asarray(p, dtype=np.float64)
    return p ** group_size + (1.0 - p) ** group_size


class PassRates:
    """Running pass rate per prompt (passes / attempts over every batch seen), bounded LRU.

    >>> rates = PassRates()
    >>> rates.update(["q1", "q1"], [[True, False], [True, True]])
    [0.75, 0.75]
    """

    def __init__(self, max_prompts: int = PASS_RATE_PROMPTS):
        self.max_prompts = max_prompts
        self._seen: OrderedDict[bytes, tuple[int, int]] = OrderedDict()

    @staticmethod
    def key(prompt) -> bytes:
        return hashlib.blake2b(repr(prompt).encode(), digest_size=16).digest()

    def update(self, prompts: Sequence, correct_groups: Sequence[Sequence[bool]]) -> list[float]:
        """Add each group's results to its prompt's tally; return each group's prompt's rate after
        the whole batch (a prompt may appear in several groups of one batch)."""
        keys = [self.key(p) for p in prompts]
        for key, group in zip(keys, correct_groups, strict=True):
            passes, tries = self._seen.pop(key, (0, 0))
            self._seen[key] = (passes + int(sum(group)), tries + len(group))
        while len(self._seen) > self.max_prompts:
            self._seen.popitem(last=False)
        return [self._seen[k][0] / self._seen[k][1] for k in keys]


def group_stats(rewards: Sequence[float], correct: Sequence[bool | None], group_size: int,
                pass_rates: Sequence[float] | None = None) -> dict:
    """The signal in a batch of groups. `correct[i]` is None where no verifier applies; accuracy
    figures use only groups whose items all have a verdict.

    - `all_equal_share`: share of groups whose rewards are all equal (zero advantage everywhere);
    - `accuracy_all_equal_share`: share whose correctness is all equal (DAPO's filter drops these);
    - `mean_accuracy` p̄ and `predicted_all_equal` = p̄^G + (1-p̄)^G;
    - `predicted_all_equal_per_prompt`: mean of p_j^G + (1-p_j)^G over groups, p_j the running pass
      rate of group j's prompt (when `pass_rates` is given).

    >>> s = group_stats([0, 0.1, 0, 0, 1.1, 0.1, 0.1, 0.1], [False] * 4 + [True] + [False] * 3, 4)
    >>> s["all_equal_share"], s["accuracy_all_equal_share"], s["mean_accuracy"]
    (0.0, 0.5, 0.125)
    """
    _check_groups(len(rewards), group_size)
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    stats: dict = {"groups": len(grouped), "group_size": group_size,
                   "all_equal_share": float(all_equal(grouped).mean())}
    verdicts = np.asarray([np.nan if c is None else float(c) for c in correct]).reshape(grouped.shape)
    judged = ~np.isnan(verdicts).any(axis=1)
    if judged.any():
        acc = verdicts[judged]
        p_bar = float(acc.mean())
        stats.update(judged_groups=int(judged.sum()), mean_accuracy=p_bar,
                     accuracy_all_equal_share=float(all_equal(acc).mean()),
                     predicted_all_equal=float(predicted_all_equal(p_bar, group_size)))
        if pass_rates is not None:
            rates = np.asarray(pass_rates, dtype=np.float64)[judged]
            stats["predicted_all_equal_per_prompt"] = float(
                predicted_all_equal(rates, group_size).mean())
    return stats


def keep_flags(rewards: Sequence[float], correct: Sequence[bool | None], group_size: int) -> list[bool]:
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2): keep a group only when its accuracy varies.
    Judged on correctness, not reward: (0, 0.1, 0, 0) varies in reward yet nobody is right. Groups
    without verdicts fall back to their rewards.

    >>> keep_flags([1.1] * 4 + [0, 0.1, 0, 0], [True] * 4 + [False] * 4, 4)
    [False, False]
    """
    _check_groups(len(rewards), group_size)
    keep = ~all_equal(np.asarray(rewards, dtype=np.float64).reshape(-1, group_size))
    for g in range(len(keep)):
        verdicts = correct[g * group_size:(g + 1) * group_size]
        if all(v is not None for v in verdicts):
            keep[g] = len(set(verdicts)) > 1
    return keep.tolist()

