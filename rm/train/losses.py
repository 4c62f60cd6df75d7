"""Loss functions for reward models and preference optimization: pure functions on torch tensors.

Every function takes 1-D tensors of shape [batch] and returns the **per-example** loss, shape
[batch]; the training loop takes `.mean()` (so gradient accumulation and padding-free batches weigh
examples, not batches). Nothing here looks at a model, a tokenizer or a device.

Vocabulary: `chosen_*` / `rejected_*` are the preferred and dispreferred responses of a pair
(y_w, y_l). For preference optimization, `*_logps` are sequence log-probabilities log π(y | x)
summed over response tokens, `*_mean_logps` their per-token mean, and `ref_*` the same under the
frozen reference model. With the log-ratios ρ = log π_θ(y) − log π_ref(y) the DPO margin is
Δ = ρ_w − ρ_l.

`LOSSES` maps a name to its function: `bt`, `soft`, `center` for reward models, `dpo`, `ipo`,
`kto`, `simpo`, `orpo` for policies (their arguments differ; rm/train/objectives.py adapts each).

    >>> import torch
    >>> sorted(LOSSES)
    ['bt', 'center', 'dpo', 'ipo', 'kto', 'orpo', 'simpo', 'soft']
    >>> round(LOSSES["bt"](torch.tensor([2.0]), torch.tensor([1.0])).item(), 3)
    0.313
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LN2 = math.log(2.0)


# --- reward models ----------------------------------------------------------------------------


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin: torch.Tensor | float | None = None) -> torch.Tensor:
    """Bradley–Terry negative log-likelihood, per example: −log σ(r_c − r_r − m).

    P(chosen ≻ rejected) = σ(r_c − r_r) (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1). The
    optional margin m (Llama 2, Touvron et al. 2023, eq. 2) asks for a larger gap on pairs the
    raters called clearly better. Worked check: rewards 2 and 1 → P = σ(1) = 0.731, loss 0.313.

    >>> import torch
    >>> loss = bradley_terry_loss(torch.tensor([2.0, 1.0]), torch.tensor([1.0, 1.0]))
    >>> [round(v, 3) for v in loss.tolist()]  # σ(1) = 0.731 → 0.313; a tie in reward → ln 2
    [0.313, 0.693]
    >>> round(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([1.0]), margin=1.0).item(), 4)
    0.6931
    """
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def soft_label_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                    p_chosen: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy against the vote share p̂, per example:
    −[p̂ log σ(d) + (1 − p̂) log σ(−d)] with d = r_c − r_r.

    Soft Bradley–Terry targets (the label-smoothing view of Wang et al. 2024, "Secrets of RLHF
    part II", §3). The minimum over d is at σ(d) = p̂ and equals the binary entropy H(p̂), so the
    loss floor of a data set is exactly its entropy floor. A tie is p̂ = 0.5 (floor ln 2); p̂ = 1
    gives the hard Bradley–Terry loss.

    >>> import torch
    >>> d = torch.log(torch.tensor([3.0]))              # σ(d) = 0.75
    >>> round(soft_label_loss(d, torch.zeros(1), torch.tensor([0.75])).item(), 4)  # H(0.75)
    0.5623
    >>> round(soft_label_loss(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([1.0])).item(), 3)
    0.313
    """
    diff = chosen_rewards - rejected_rewards
    p = p_chosen.to(diff.dtype)
    return -(p * F.logsigmoid(diff) + (1.0 - p) * F.logsigmoid(-diff))


def reward_centering(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                     coef: float) -> torch.Tensor:
    """Auxiliary penalty λ·(r_c + r_r)², per example; its batch mean is λ·mean((r_c + r_r)²).

    Bradley–Terry only fixes reward differences; this term pins the mean reward near zero so
    scores served to PPO/GRPO are comparable across models (Eisenstein et al. 2023, "Helping or
    herding?", §3; TRL's `center_rewards_coefficient`). Add it to the BT loss.

    >>> import torch
    >>> loss = reward_centering(torch.tensor([2.0, 1.0]), torch.tensor([1.0, -1.0]), coef=0.01)
    >>> [round(v, 4) for v in loss.tolist()]
    [0.09, 0.0]
    """
    return coef * (chosen_rewards + rejected_rewards) ** 2


# --- preference optimization ------------------------------------------------------------------


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
             beta: float = 0.1, label_smoothing: float = 0.0, robust: bool = False) -> torch.Tensor:
    """Direct Preference Optimization, per example: −log σ(βΔ) with Δ = ρ_w − ρ_l (Rafailov et
    al. 2023, eq. 7), log-probs summed over response tokens.

    With label smoothing ε (the share of flipped labels): conservative DPO (Mitchell 2023, "cDPO")
    −(1 − ε) log σ(βΔ) − ε log σ(−βΔ); with `robust=True`, the unbiased robust DPO of Chowdhury
    et al. 2024 (eq. 7): [−(1 − ε) log σ(βΔ) + ε log σ(−βΔ)] / (1 − 2ε).

    Worked check: chosen log-prob up 2, rejected down 3, β = 0.1 → βΔ = 0.5, loss 0.474; the same
    when both fall (by 1 and 6). At π_θ = π_ref the loss is ln 2.

    >>> import torch
    >>> t = torch.tensor
    >>> round(dpo_loss(t([2.0]), t([-3.0]), t([0.0]), t([0.0]), beta=0.1).item(), 3)
    0.474
    >>> round(dpo_loss(t([-11.0]), t([-16.0]), t([-10.0]), t([-10.0]), beta=0.1).item(), 3)
    0.474
    >>> round(dpo_loss(t([-5.0]), t([-7.0]), t([-5.0]), t([-7.0])).item(), 4)
    0.6931
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}; "
                         "it is the assumed share of flipped labels")
    logits = beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))
    eps = label_smoothing
    if robust:
        return (-(1 - eps) * F.logsigmoid(logits) + eps * F.logsigmoid(-logits)) / (1 - 2 * eps)
    return -(1 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)


def ipo_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor,
             ref_chosen_mean_logps: torch.Tensor, ref_rejected_mean_logps: torch.Tensor,
             beta: float = 0.1) -> torch.Tensor:
    """Identity Preference Optimization, per example: (Δ − 1/(2β))² (Azar et al. 2023, eq. 17,
    with τ = β).

    Δ is built from **per-token-mean** log-probs (mean over response tokens, as TRL's
    `loss_type="ipo"` does), not sums, so long answers do not dominate the squared error. At
    π_θ = π_ref, Δ = 0 and the loss is 1/(4β²) (25 for β = 0.1).

    >>> import torch
    >>> z = torch.zeros(1)
    >>> round(ipo_loss(z, z, z, z, beta=0.1).item(), 4)
    25.0
    >>> ipo_loss(torch.tensor([5.0]), z, z, z, beta=0.1).item()  # Δ = 1/(2β): at the target
    0.0
    """
    delta = (chosen_mean_logps - ref_chosen_mean_logps) - (rejected_mean_logps - ref_rejected_mean_logps)
    return (delta - 1.0 / (2.0 * beta)) ** 2


def kto_reference_point(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0 = max(0, mean(log π_θ(y'|x) − log π_ref(y'|x))), without gradient.

    The pairs (x, y') are mismatched: a prompt with another example's completion, an estimate of
    KL(π_θ ‖ π_ref) (Ethayarajh et al. 2024, eq. 8; TRL's KTOTrainer). An empty batch gives 0, and
    each example brings its own mismatched pair (rm/train/policy_data.py pairs it across the data set), so a
    batch of one still has an estimate.

    >>> import torch
    >>> kto_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])).item()
    0.5
    >>> kto_reference_point(torch.tensor([-3.0]), torch.tensor([-2.0])).item()  # clamped at 0
    0.0
    """
    if kl_logps.numel() == 0:
        return kl_logps.new_zeros(())
    return (kl_logps - ref_kl_logps).mean().clamp(min=0).detach()


def kto_loss(logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             z0: torch.Tensor | float = 0.0, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> torch.Tensor:
    """Kahneman–Tversky Optimization on unpaired completions, per example (Ethayarajh et al. 2024,
    eq. 8): with r = log π_θ(y|x) − log π_ref(y|x),
    λ_D (1 − σ(β(r − z0))) for a desirable y and λ_U (1 − σ(β(z0 − r))) for an undesirable one.

    z0 comes from `kto_reference_point` (no gradient). With π_θ = π_ref, r = z0 = 0 and every
    example's loss is 0.5 with unit weights.

    >>> import torch
    >>> z = torch.zeros(2)
    >>> kto_loss(z, z, torch.tensor([True, False])).tolist()
    [0.5, 0.5]
    """
    r = logps - ref_logps
    good = 1.0 - torch.sigmoid(beta * (r - z0))
    bad = 1.0 - torch.sigmoid(beta * (z0 - r))
    desirable = desirable.to(torch.bool)
    return torch.where(desirable, desirable_weight * good, undesirable_weight * bad)


def simpo_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor,
               beta: float = 2.0, gamma: float = 0.5) -> torch.Tensor:
    """Simple Preference Optimization, no reference model, per example (Meng et al. 2024, eq. 6):
    −log σ(β(mean log π(y_w) − mean log π(y_l)) − γ), means over response tokens.

    >>> import torch
    >>> round(simpo_loss(torch.tensor([-1.0]), torch.tensor([-1.25]), beta=2.0, gamma=0.5).item(), 4)
    0.6931
    """
    return -F.logsigmoid(beta * (chosen_mean_logps - rejected_mean_logps) - gamma)


def log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    """log(p / (1 − p)) for p = exp(mean log-prob), computed stably: ℓ − log(1 − e^ℓ).

    >>> import torch
    >>> round(log_odds(torch.log(torch.tensor([0.75]))).item(), 4)  # log 3
    1.0986
    """
    # Clamp below 0 so a (numerically) certain sequence does not produce log(0).
    mean_logps = mean_logps.clamp(max=-1e-6)
    return mean_logps - torch.log1p(-torch.exp(mean_logps))


def orpo_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor,
              lam: float = 0.1) -> torch.Tensor:
    """Odds-Ratio Preference Optimization, no reference model, per example (Hong et al. 2024,
    eqs. 6–7): −mean log π(y_w) − λ log σ(log odds(y_w) − log odds(y_l)), with odds from the
    per-token-mean probabilities; the first term is the chosen answer's per-token NLL (SFT term).

    >>> import torch
    >>> p = torch.log(torch.tensor([0.5]))      # odds 1 for both → ratio term λ ln 2
    >>> round(orpo_loss(p, p, lam=0.1).item(), 4)  # ln 2 + 0.1 ln 2
    0.7625
    """
    ratio = log_odds(chosen_mean_logps) - log_odds(rejected_mean_logps)
    return -chosen_mean_logps - lam * F.logsigmoid(ratio)


LOSSES = {
    "bt": bradley_terry_loss,
    "soft": soft_label_loss,
    "center": reward_centering,
    "dpo": dpo_loss,
    "ipo": ipo_loss,
    "kto": kto_loss,
    "simpo": simpo_loss,
    "orpo": orpo_loss,
}
