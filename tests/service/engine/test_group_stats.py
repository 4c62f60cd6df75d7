"""GRPO / Dr. GRPO advantages, all-equal group statistics and DAPO's dynamic-sampling flags
(service/engine/advantages.py): the issue's acceptance 6, 7 and the keep flags of 8."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.advantages import (
    PassRates,
    group_advantages,
    group_stats,
    keep_flags,
    predicted_all_equal,
)


def _adv(rewards, method="grpo", ddof=1):
    return group_advantages(rewards, len(rewards), method, std_ddof=ddof)[0]


def test_two_right_two_wrong():
    assert _adv([1, 0, 0, 1], ddof=0) == pytest.approx([0.9998, -0.9998, -0.9998, 0.9998], abs=1e-4)
    assert _adv([1, 0, 0, 1]) == pytest.approx([0.8659, -0.8659, -0.8659, 0.8659], abs=1e-4)
    assert _adv([1, 0, 0, 1], "dr_grpo") == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_three_right_one_wrong():
    assert _adv([1, 1, 1, 0], ddof=0)[3] == pytest.approx(-1.7317, abs=1e-4)
    assert _adv([1, 1, 1, 0])[3] == pytest.approx(-1.4997, abs=1e-4)
    assert _adv([1, 1, 1, 0], "dr_grpo")[3] == pytest.approx(-0.75)


def test_a_format_bonus_weighs_as_much_as_correctness_under_grpo_but_not_dr_grpo():
    format_only, one_right = [0, 0.1, 0, 0], [1.1, 0.1, 0.1, 0.1]
    assert _adv(format_only)[1] == pytest.approx(1.497, abs=1e-3)
    assert _adv(one_right)[0] == pytest.approx(1.4997, abs=1e-4)
    assert _adv(format_only)[1] == pytest.approx(_adv(one_right)[0], abs=3e-3)
    assert _adv(format_only, "dr_grpo")[1] == pytest.approx(0.075)
    assert _adv(one_right, "dr_grpo")[0] == pytest.approx(0.75)


def test_ddof_is_checked():
    with pytest.raises(ValueError, match="std_ddof"):
        group_advantages([1, 0], 2, std_ddof=2)


@pytest.mark.parametrize(("p", "g", "share"), [
    (0.5, 4, 0.125), (0.9, 4, 0.6562), (0.97, 4, 0.8853), (0.9, 16, 0.1853), (0.9, 8, 0.4305)])
def test_predicted_all_equal_share(p, g, share):
    assert float(predicted_all_equal(p, g)) == pytest.approx(share, abs=1e-4)


def _bernoulli_groups(p_per_group, g, rng):
    correct = rng.random((len(p_per_group), g)) < np.asarray(p_per_group)[:, None]
    return correct.ravel().tolist()


def test_simulated_groups_match_the_prediction():
    rng = np.random.default_rng(19)
    for p, g in ((0.5, 4), (0.9, 4), (0.9, 8)):
        correct = _bernoulli_groups([p] * 20_000, g, rng)
        stats = group_stats([float(c) for c in correct], correct, g)
        assert stats["accuracy_all_equal_share"] == pytest.approx(float(predicted_all_equal(p, g)),
                                                                  abs=0.01)
        assert stats["all_equal_share"] == stats["accuracy_all_equal_share"]


def test_mixed_difficulty_the_per_prompt_prediction_is_right_and_the_mean_p_one_is_not():
    rng = np.random.default_rng(7)
    prompts = [f"q{i}" for i in range(200)]
    p_true = [0.2] * 100 + [0.8] * 100
    rates, g = PassRates(), 4
    for _ in range(50):  # the same prompts recur over 50 steps; running pass rates converge
        correct = _bernoulli_groups(p_true, g, rng)
        pass_rates = rates.update(prompts, [correct[i * g:(i + 1) * g] for i in range(200)])
    batches = []
    for _ in range(50):
        correct = _bernoulli_groups(p_true, g, rng)
        batches.append(group_stats([float(c) for c in correct], correct, g, pass_rates))
    mean = {key: np.mean([b[key] for b in batches]) for key in batches[0]}
    assert mean["accuracy_all_equal_share"] == pytest.approx(0.411, abs=0.01)
    assert mean["mean_accuracy"] == pytest.approx(0.5, abs=0.01)
    assert mean["predicted_all_equal"] == pytest.approx(0.125, abs=0.01)  # reported, and wrong
    assert mean["predicted_all_equal_per_prompt"] == pytest.approx(0.4112, abs=0.01)


def test_pass_rates_forget_the_least_recent_prompt():
    rates = PassRates(max_prompts=2)
    rates.update(["a", "b"], [[True], [False]])
    rates.update(["c"], [[True, True]])
    assert rates.update(["a"], [[False]]) == [0.0]  # "a" was forgotten, counted afresh


def test_dynamic_sampling_judges_accuracy_not_reward():
    rewards = [1.1] * 4 + [0.1] * 4 + [0, 0.1, 0, 0] + [1.1, 0.1, 0.1, 0.1]
    correct = [True] * 4 + [False] * 4 + [False] * 4 + [True, False, False, False]
    assert keep_flags(rewards, correct, 4) == [False, False, False, True]
    stats = group_stats(rewards, correct, 4)
    assert stats["all_equal_share"] == 0.5 and stats["accuracy_all_equal_share"] == 0.75


def test_groups_without_verdicts_use_rewards():
    assert keep_flags([0.3, 0.3, 0.2, 0.5], [None] * 4, 2) == [False, True]
    assert "mean_accuracy" not in group_stats([0.3, 0.3], [None, None], 2)
