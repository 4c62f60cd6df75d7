"""Loss functions against hand-computed values (issues 4 and 6) and the sign of every gradient."""

import math

import pytest
import torch

from rm.train import losses

t = torch.tensor


def test_bradley_terry_worked_check():
    # A hand computation: rewards 2 and 1 → P = σ(1) = 0.731, loss = −ln 0.731 = 0.313.
    loss = losses.bradley_terry_loss(t([2.0]), t([1.0]))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1))), abs=1e-6)
    assert round(loss.item(), 3) == 0.313


def test_bradley_terry_margin_shifts_the_difference():
    # margin 0.5: −log σ(1 − 0.5) = log(1 + e^-0.5) = 0.47408
    assert losses.bradley_terry_loss(t([2.0]), t([1.0]), margin=t([0.5])).item() == pytest.approx(
        0.474077, abs=1e-5)


def test_soft_label_floor_is_entropy_and_tie_is_half():
    p = 0.8
    d = math.log(p / (1 - p))  # σ(d) = p̂: the minimiser
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # 0.50040
    assert losses.soft_label_loss(t([d]), t([0.0]), t([p])).item() == pytest.approx(entropy, abs=1e-6)
    # a tie (p̂ = 0.5) is minimised at equal rewards, with loss ln 2
    assert losses.soft_label_loss(t([1.0]), t([1.0]), t([0.5])).item() == pytest.approx(math.log(2))
    # away from the minimiser the loss is larger
    assert losses.soft_label_loss(t([d + 1]), t([0.0]), t([p])).item() > entropy


def test_soft_label_gradient_vanishes_at_vote_share():
    d = torch.tensor([math.log(3.0)], requires_grad=True)  # σ(d) = 0.75
    losses.soft_label_loss(d, torch.zeros(1), t([0.75])).sum().backward()
    assert abs(d.grad.item()) < 1e-6


def test_reward_centering_value():
    # λ·(r_c + r_r)²: 0.5·(3 + 1)² = 8
    assert losses.reward_centering(t([3.0]), t([1.0]), coef=0.5).item() == pytest.approx(8.0)


def test_dpo_seed_values():
    zero = torch.zeros(1)
    assert losses.dpo_loss(zero, zero, zero, zero).item() == pytest.approx(0.693147, abs=1e-6)
    # chosen +2, rejected −3, β = 0.1 → margin βΔ = 0.5, loss −log σ(0.5) = 0.474077
    up = losses.dpo_loss(t([2.0]), t([-3.0]), zero, zero, beta=0.1).item()
    down = losses.dpo_loss(t([-1.0]), t([-6.0]), zero, zero, beta=0.1).item()
    assert up == pytest.approx(0.474077, abs=1e-5)
    assert down == pytest.approx(up, abs=1e-6)


def test_dpo_label_smoothing_and_robust():
    zero = torch.zeros(1)
    a = 0.5  # βΔ
    ls = losses.dpo_loss(t([5.0]), zero, zero, zero, beta=0.1, label_smoothing=0.1).item()
    expected = 0.9 * math.log(1 + math.exp(-a)) + 0.1 * math.log(1 + math.exp(a))
    assert ls == pytest.approx(expected, abs=1e-6)
    rob = losses.dpo_loss(t([5.0]), zero, zero, zero, beta=0.1, label_smoothing=0.1, robust=True).item()
    expected = (0.9 * math.log(1 + math.exp(-a)) - 0.1 * math.log(1 + math.exp(a))) / 0.8
    assert rob == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.dpo_loss(zero, zero, zero, zero, label_smoothing=0.5)


def test_ipo_seed_value():
    zero = torch.zeros(1)
    for beta in (0.1, 0.5):
        assert losses.ipo_loss(zero, zero, zero, zero, beta=beta).item() == pytest.approx(
            1 / (4 * beta**2), rel=1e-6)
    # Δ = 2 with β = 0.5: (2 − 1)² = 1
    assert losses.ipo_loss(t([1.0]), t([-1.0]), zero, zero, beta=0.5).item() == pytest.approx(1.0)


def test_kto_seed_value_and_reference_point():
    z = torch.zeros(4)
    desirable = t([True, False, True, False])
    assert losses.kto_loss(z, z, desirable).tolist() == [0.5] * 4
    # r = 1, z0 = 0, β = 1: desirable 1 − σ(1) = 0.268941, undesirable 1 − σ(−1) = 0.731059
    vals = losses.kto_loss(t([1.0, 1.0]), t([0.0, 0.0]), t([True, False]), z0=0.0, beta=1.0)
    assert vals.tolist() == pytest.approx([0.268941, 0.731059], abs=1e-6)
    # weights scale each side
    vals = losses.kto_loss(t([1.0, 1.0]), t([0.0, 0.0]), t([True, False]), beta=1.0,
                           desirable_weight=2.0, undesirable_weight=0.5)
    assert vals.tolist() == pytest.approx([0.537883, 0.365529], abs=1e-6)


def test_kto_reference_point_has_no_gradient_and_handles_batch_of_one():
    kl = torch.tensor([0.5], requires_grad=True)
    z0 = losses.kto_reference_point(kl, torch.zeros(1))
    assert z0.item() == 0.5 and not z0.requires_grad
    assert losses.kto_reference_point(torch.empty(0), torch.empty(0)).item() == 0.0
    assert losses.kto_reference_point(t([-1.0]), t([0.0])).item() == 0.0


def test_simpo_value():
    # β = 2, γ = 0.5, means −1 and −2: −log σ(2·1 − 0.5) = log(1 + e^-1.5) = 0.201413
    assert losses.simpo_loss(t([-1.0]), t([-2.0]), beta=2.0, gamma=0.5).item() == pytest.approx(
        0.201413, abs=1e-6)


def test_orpo_value():
    # p_w = 0.5 (odds 1), p_l = 0.25 (odds 1/3): ratio ln 3, NLL ln 2
    lw, ll = math.log(0.5), math.log(0.25)
    expected = math.log(2) - 0.2 * math.log(1 / (1 + math.exp(-math.log(3))))  # ln2 − 0.2 ln 0.75
    assert losses.orpo_loss(t([lw]), t([ll]), lam=0.2).item() == pytest.approx(expected, abs=1e-6)


def _grads(fn, n_inputs):
    xs = [torch.tensor([-2.0], requires_grad=True) for _ in range(n_inputs)]
    fn(*xs).sum().backward()
    return [x.grad.item() for x in xs]


PAIRED = {
    "dpo": lambda c, r: losses.dpo_loss(c, r, t([-2.0]), t([-2.0])),
    "dpo_smoothed": lambda c, r: losses.dpo_loss(c, r, t([-2.0]), t([-2.0]), label_smoothing=0.1),
    "dpo_robust": lambda c, r: losses.dpo_loss(c, r, t([-2.0]), t([-2.0]), label_smoothing=0.1,
                                               robust=True),
    "ipo": lambda c, r: losses.ipo_loss(c, r, t([-2.0]), t([-2.0])),
    "simpo": lambda c, r: losses.simpo_loss(c, r),
    "orpo": lambda c, r: losses.orpo_loss(c, r),
    "bt": lambda c, r: losses.bradley_terry_loss(c, r),
    "soft": lambda c, r: losses.soft_label_loss(c, r, t([0.9])),
}


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_gradient_raises_chosen_and_lowers_rejected(name):
    g_chosen, g_rejected = _grads(PAIRED[name], 2)
    # descent moves against the gradient: chosen up (negative grad), rejected down (positive grad)
    assert g_chosen < 0 < g_rejected


@pytest.mark.parametrize("desirable,sign", [(True, -1), (False, 1)])
def test_kto_gradient_sign(desirable, sign):
    logps = torch.tensor([-2.0], requires_grad=True)
    losses.kto_loss(logps, t([-2.0]), t([desirable])).sum().backward()
    assert sign * logps.grad.item() > 0


def test_ref_logps_get_no_gradient_role():
    # the reference enters only through Δ: moving it the other way mirrors the policy's gradient
    ref_c = torch.tensor([-2.0], requires_grad=True)
    losses.dpo_loss(t([-2.0]), t([-2.0]), ref_c, t([-2.0])).sum().backward()
    assert ref_c.grad.item() > 0
