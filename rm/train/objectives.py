"""The objectives the shared loop (rm/train/loop.py) trains: `objective(model, batch) -> (loss, metrics)`,
built from the pure loss functions of rm/train/losses.py.

- Reward models (`bt_objective`): Bradley–Terry, −log σ(r_c − r_r − m) (Bradley & Terry 1952;
  Ouyang et al. 2022, eq. 1), or the binary cross-entropy against the vote share p̂, plus optional
  reward centering λ·(r_c + r_r)². Chosen and rejected go through one forward.
- Policies (`po_objective`): DPO, IPO, KTO, SimPO, ORPO on sequence log-probs (rm/train/logps.py) against
  cached reference log-probs carried in the batch.

    >>> import torch
    >>> class Fixed(torch.nn.Module):
    ...     def forward(self, input_ids, attention_mask):
    ...         return torch.tensor([2.0, 1.0])
    >>> batch = {"input_ids": None, "attention_mask": None, "p_chosen": torch.ones(1)}
    >>> round(bt_objective()(Fixed(), batch)[0].item(), 3)  # σ(1) = 0.731 → −log 0.731
    0.313
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import rm.train.logps as logprobs
from rm.train import losses

# --- reward models -------------------------------------------------------------------------------


def bt_objective(soft_labels: bool = False, use_margin: bool = False, center: float = 0.0):
    """objective(model, batch) for reward models: Bradley–Terry (or soft-label BCE against p̂),
    optional margin and reward centering (rm/train/losses.py); chosen and rejected in one forward."""
    if soft_labels and use_margin:
        raise ValueError("--soft-labels and --margin do not combine: the soft target p̂ already "
                         "carries how clear the preference was; pick one")

    def objective(model, batch):
        rewards = model(batch["input_ids"], batch["attention_mask"])
        b = rewards.shape[0] // 2
        chosen, rejected = rewards[:b], rewards[b:]
        if soft_labels:
            per_pair = losses.LOSSES["soft"](chosen, rejected, batch["p_chosen"])
        else:
            per_pair = losses.LOSSES["bt"](chosen, rejected, batch["margin"] if use_margin else None)
        if center:
            per_pair = per_pair + losses.LOSSES["center"](chosen, rejected, center)
        loss = per_pair.mean()
        return loss, _bt_metrics(loss, chosen.detach(), rejected.detach(), batch["p_chosen"])

    return objective


def _bt_metrics(loss, chosen, rejected, p_chosen) -> dict:
    decided = p_chosen != 0.5  # a tied vote has no right answer: out of the accuracy
    right = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
    return {"n": chosen.numel(), "loss": float(loss.detach()),
            "accuracy": (float(right[decided].sum()), float(decided.sum())),
            "margin": float((chosen - rejected).mean())}


# --- policies ---------------------------------------------------------------------------------


@dataclass
class PoConfig:
    """The objective and its hyper-parameters (`bradley train po` flags of the same names)."""

    loss: str = "dpo"
    beta: float = 0.1
    gamma: float = 0.5
    lam: float = 0.1
    label_smoothing: float = 0.0
    robust: bool = False
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0


def _check(cfg: PoConfig) -> None:
    if cfg.loss not in ("dpo", "ipo", "kto", "simpo", "orpo"):
        raise ValueError(f"unknown preference loss {cfg.loss!r}; use one of dpo, ipo, kto, simpo, orpo")
    if cfg.beta <= 0:
        raise ValueError(f"beta must be positive, got {cfg.beta}; 0.1 is the usual DPO value")
    if not 0.0 <= cfg.label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {cfg.label_smoothing}")
    if cfg.desirable_weight <= 0 or cfg.undesirable_weight <= 0:
        raise ValueError("KTO's desirable and undesirable weights must be positive")


def _paired_terms(cfg: PoConfig, logps, ref, n) -> dict[str, Callable[[], torch.Tensor]]:
    b = logps.size(0) // 2
    pc, pr, rc, rr = logps[:b], logps[b:], ref[:b], ref[b:]
    nc, nr = n[:b].clamp(min=1), n[b:].clamp(min=1)
    return {
        "dpo": lambda: losses.dpo_loss(pc, pr, rc, rr, cfg.beta, cfg.label_smoothing, cfg.robust),
        "ipo": lambda: losses.ipo_loss(pc / nc, pr / nr, rc / nc, rr / nr, cfg.beta),
        "simpo": lambda: losses.simpo_loss(pc / nc, pr / nr, cfg.beta, cfg.gamma),
        "orpo": lambda: losses.orpo_loss(pc / nc, pr / nr, cfg.lam),
    }


def _kto_z0(kl_logps: torch.Tensor, kl_ref: torch.Tensor) -> torch.Tensor:
    z0 = losses.kto_reference_point(kl_logps, kl_ref)
    # training steps run in lockstep on every rank; validation does not, so it stays local
    if torch.is_grad_enabled() and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(z0, op=torch.distributed.ReduceOp.AVG)
    return z0


def po_objective(cfg: PoConfig) -> Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]:
    """objective(model, batch) → (mean loss, metrics) for rm/train/loop.py's loop.

    Metrics: loss; implicit rewards β·(log π − log π_ref) of chosen and rejected (desirable and
    undesirable for KTO), their margin and the share of examples where chosen's is higher
    (accuracy); `logp_chosen`, the mean per-token log-prob of chosen responses; `kl`, the k3
    estimator e^{−ρ̄} − 1 + ρ̄ ≥ 0 (Schulman 2020) of the per-token log-ratio ρ̄ on the data's
    responses — an off-policy proxy for KL(π_θ ‖ π_ref), not an on-policy estimate.
    """
    _check(cfg)

    def objective(model, batch):
        logps, n = logprobs.forward_logps(model, batch)
        ref = batch["ref_logps"].to(logps.device)
        if "desirable" in batch:
            per_example, chosen, rho_w, rho_l = _kto_step(cfg, batch["desirable"].to(logps.device),
                                                          logps, ref, n)
        else:
            per_example = _paired_terms(cfg, logps, ref, n)[cfg.loss]()
            b = logps.size(0) // 2
            chosen = logps[:b] / n[:b].clamp(min=1)
            rho_w, rho_l = logps[:b] - ref[:b], logps[b:] - ref[b:]
        loss = per_example.mean()
        return loss, _metrics(cfg, loss, chosen, rho_w, rho_l, (logps - ref) / n.clamp(min=1))

    return objective


def _kto_step(cfg, desirable, logps, ref, n):
    b = desirable.numel()
    z0 = _kto_z0(logps[b:], ref[b:])
    per_example = losses.kto_loss(logps[:b], ref[:b], desirable, z0, cfg.beta,
                                  cfg.desirable_weight, cfg.undesirable_weight)
    rho = logps[:b] - ref[:b]
    chosen = (logps[:b] / n[:b].clamp(min=1))[desirable]
    return per_example, chosen, rho[desirable], rho[~desirable]


def _mean(t: torch.Tensor) -> float:
    return float(t.mean()) if t.numel() else 0.0


def _metrics(cfg, loss, chosen_logps, rho_w, rho_l, rho_bar) -> dict:
    """Paired losses compare each chosen with its rejected; KTO compares group means."""
    with torch.no_grad():
        rw, rl = cfg.beta * rho_w.detach(), cfg.beta * rho_l.detach()
        paired = cfg.loss != "kto"
        return {
            "loss": float(loss),
            "reward_chosen": _mean(rw),
            "reward_rejected": _mean(rl),
            "margin": _mean(rw - rl) if paired else _mean(rw) - _mean(rl),
            "accuracy": _mean((rw > rl).float()) if paired
            else _mean(torch.cat([(rw > 0).float(), (rl < 0).float()])),
            "logp_chosen": _mean(chosen_logps.detach()),  # per token
            "kl": max(0.0, _mean(torch.exp(-rho_bar) - 1 + rho_bar)),  # ≥ 0 up to rounding
        }
