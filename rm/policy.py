"""Preference optimization of a causal-LM policy: sequence log-probs, the reference cache and the
objective for the shared training loop (rm/train.py). Data preparation is rm/po_data.py; the
`bradley train po` run (`run_po`) is rm/po_train.py.

Sequence log-prob of a response y to a prompt x: log π(y | x) = Σ_t log π(y_t | x, y_<t), summed
over response tokens only (prompt and padding masked; the logits at position i predict token i+1);
rm/po_data.py tokenizes prompt and response jointly and marks where the response starts.

Reference log-probs are computed once per (reference weights, template, response) with the
initial policy itself, before training, and cached in the store's `ref_logps` table: no reference
model is resident while training, and a second run on the same data does no reference pass.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rm import device as devices
from rm import losses
from rm.po_data import Encoded, collate


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


# --- identities and log-probs ------------------------------------------------------------


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over the parameter names, dtypes and bytes: the identity of a reference model."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:24]


def sequence_logps(logits: torch.Tensor, input_ids: torch.Tensor,
                   response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over response tokens of log softmax(logits[t−1])[y_t], and the number of those tokens.

    Shift by one: position t−1's logits score token t, so response_mask is read from index 1.

    >>> import torch
    >>> logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.1, 0.9]]]))
    >>> ids, mask = torch.tensor([[0, 1, 0]]), torch.tensor([[0, 1, 1]])
    >>> s, n = sequence_logps(logits, ids, mask)   # log 0.5 + log 0.25
    >>> round(s.item(), 4), n.item()
    (-2.0794, 2)
    """
    labels = input_ids[:, 1:].masked_fill(response_mask[:, 1:] == 0, -100)
    flat = logits[:, :-1].reshape(-1, logits.size(-1)).float()
    token_logps = -F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100, reduction="none")
    token_logps = token_logps.view(labels.shape)
    return token_logps.sum(-1), response_mask[:, 1:].sum(-1)


def forward_logps(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the model over the batch's sequences → (sum log-prob, n response tokens).

    Logits are computed only from the position before the earliest response token on
    (`logits_to_keep`): the LM head and the softmax skip the prompt, which for a large vocabulary
    is much of the step's time and memory.
    """
    ids = batch["input_ids"]
    out = model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False,
                logits_to_keep=batch.get("logits_to_keep", 0))
    offset = ids.size(1) - out.logits.size(1)
    return sequence_logps(out.logits, ids[:, offset:], batch["response_mask"][:, offset:])


# --- the reference cache ----------------------------------------------------------------------


def reference_logps(model, sequences: dict[str, Encoded], pad_id: int, *, store=None,
                    model_hash: str = "", template: str = "", max_tokens: int = 4096,
                    device: torch.device | str = "cpu", progress: bool = False) -> tuple[dict, int]:
    """(logp, n_tokens) per sequence key under `model`, from the store's cache where present.

    Missing keys are computed under inference mode, longest first so padding stays low, in
    batches of at most `max_tokens` padded tokens (memory follows tokens, not sequences), and
    written back. Returns the mapping and how many sequences had to be computed.
    """
    cached = store.ref_logps(model_hash, template, list(sequences)) if store is not None else {}
    missing = sorted((k for k in sequences if k not in cached), key=lambda k: -len(sequences[k].ids))
    computed = _compute_logps(model, sequences, missing, pad_id, max_tokens, device, progress)
    if store is not None and computed:
        store.put_ref_logps(model_hash, template, [(k, lp, n) for k, (lp, n) in computed.items()])
    return {**cached, **computed}, len(computed)


def token_chunks(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive index chunks of longest-first `lengths` whose padded size fits `max_tokens`.

    >>> token_chunks([8, 8, 5, 4, 4, 1], max_tokens=16)
    [[0, 1], [2, 3, 4], [5]]
    """
    chunks: list[list[int]] = []
    for i in range(len(lengths)):
        if chunks and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= max_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def _compute_logps(model, sequences, keys, pad_id, max_tokens, device, progress) -> dict:
    out: dict[str, tuple[float, int]] = {}
    if not keys:
        return out
    from tqdm import tqdm

    was_training = model.training
    model.eval()
    lengths = [len(sequences[k].ids) for k in keys]
    chunks = [[keys[i] for i in c] for c in token_chunks(lengths, max_tokens)]
    # the same autocast as training, so that at step 1 the policy's log-probs equal these
    with torch.inference_mode(), devices.autocast(torch.device(device)):
        for chunk in tqdm(chunks, desc="reference log-probs", disable=None if progress else True,
                          file=sys.stderr):
            batch = {k: v.to(device) if torch.is_tensor(v) else v
                     for k, v in collate([sequences[c] for c in chunk], pad_id).items()}
            logps, n = forward_logps(model, batch)
            out.update(zip(chunk, zip(logps.tolist(), n.tolist(), strict=True), strict=True))
    model.train(was_training)
    return out


# --- the objective ----------------------------------------------------------------------------


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
    """objective(model, batch) → (mean loss, metrics) for rm/train.py's loop.

    Metrics: loss; implicit rewards β·(log π − log π_ref) of chosen and rejected (desirable and
    undesirable for KTO), their margin and the share of examples where chosen's is higher
    (accuracy); `logp_chosen`, the mean per-token log-prob of chosen responses; `kl`, the k3
    estimator e^{−ρ̄} − 1 + ρ̄ ≥ 0 (Schulman 2020) of the per-token log-ratio ρ̄ on the data's
    responses — an off-policy proxy for KL(π_θ ‖ π_ref), not an on-policy estimate.
    """
    _check(cfg)

    def objective(model, batch):
        logps, n = forward_logps(model, batch)
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


def run_po(args) -> dict | None:
    """`bradley train po` (rm/po_train.py): the metrics on rank 0, None on other torchrun ranks."""
    from rm.po_train import run

    return run(args)
