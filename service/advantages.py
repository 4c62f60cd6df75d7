"""Group-relative advantages for GRPO-style trainers, computed where the rewards are.

A request with `group_size=G` holds consecutive groups of G completions of the same prompt. For the
rewards r_1..r_G of one group:

- `grpo` (Shao et al. 2024, DeepSeekMath, eq. 3 "outcome supervision"): A_i = (r_i - mean(r)) / (std(r) + eps),
  with the sample standard deviation (ddof=1) and eps = 1e-4, as TRL's GRPOTrainer computes it.
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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

GRPO_EPS = 1e-4
EQUAL_RTOL = 1e-6


def _grpo(rewards: np.ndarray) -> np.ndarray:
    centered = rewards - rewards.mean(axis=1, keepdims=True)
    if rewards.shape[1] < 2:  # one completion per prompt: no spread to normalise by
        return centered
    return centered / (rewards.std(axis=1, ddof=1, keepdims=True) + GRPO_EPS)


def _dr_grpo(rewards: np.ndarray) -> np.ndarray:
    return rewards - rewards.mean(axis=1, keepdims=True)


ADVANTAGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"grpo": _grpo, "dr_grpo": _dr_grpo}


def group_advantages(rewards: Sequence[float], group_size: int,
                     method: str = "grpo") -> tuple[list[float], list[bool]]:
    """Advantages of consecutive groups of `group_size` rewards, and which groups are degenerate."""
    if method not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {sorted(ADVANTAGES)}, not {method!r}")
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"group_size {group_size} must be positive and divide the number of "
                         f"items ({len(rewards)}); send whole groups of consecutive completions")
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    scale = np.maximum(1.0, np.abs(grouped).max(axis=1))
    degenerate = np.ptp(grouped, axis=1) <= EQUAL_RTOL * scale
    advantages = ADVANTAGES[method](grouped)
    advantages[degenerate] = 0.0  # exact zero, not eps-divided rounding noise
    return advantages.ravel().tolist(), degenerate.tolist()
