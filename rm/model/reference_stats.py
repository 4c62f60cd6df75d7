"""What a reward model saw before serving: the reference a serving watch compares live traffic with.

Saved in the model folder as `reference_stats.json` (numbers) and `reference_stats.npz` (the latent
mean and covariance factors; read with `allow_pickle=False`, and not a `.safetensors` file, whose
bytes a registered model id's weight hash covers):

* the validation scores' mean, std and quantiles: the ruler served rewards are measured with, in
  validation stds from the validation mean (z), and what members of an ensemble are standardised by;
* the Pearson correlation of validation scores with response length (characters) and the mean
  response length: the baseline of the length-hacking signals (Singhal et al. 2023; ODIN, Chen et
  al. 2024);
* the mean μ and a covariance estimate Σ of the final hidden state that the reward head reads (the
  last token for decoders, [CLS] for encoders) over training items, and the 99th percentile of the
  Mahalanobis distance d(x) = √((x − μ)ᵀ Σ⁻¹ (x − μ)) of validation items: an item beyond it is
  out of distribution (InfoRM, Miao et al. 2024, flags latent outliers the same way).

Σ is low rank plus diagonal, Σ = U diag(λ) Uᵀ + D: the top `rank` principal directions of the
centred training states with their variances λ, and D the variance each coordinate has left
(floored at FLOOR × the mean variance), so that diag(Σ) is the per-coordinate variance. With
M = (diag(1/λ) + Uᵀ D⁻¹ U)⁻¹ = L Lᵀ, the Woodbury identity gives

    d(x)² = Σᵢ cᵢ² / Dᵢ − ‖Lᵀ Uᵀ D⁻¹ c‖²,   c = x − μ,

one [hidden] x [rank] product per item, on the device, inside the scoring forward. rank 0 is the
diagonal estimate. (bench/watch_covariance.py measures the choice; bench/RESULTS.md has figures.)

    >>> import torch
    >>> states = torch.randn(200, 6, generator=torch.Generator().manual_seed(0))
    >>> latent = fit_latent(states, rank=2)
    >>> round(float(latent.distance(states.mean(0, keepdim=True))[0]), 5)   # the mean itself
    0.0
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

STATS_JSON = "reference_stats.json"
STATS_ARRAYS = "reference_stats.npz"
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
DEFAULT_RANK = 32
MAX_FIT_ITEMS = 4096  # training items whose states estimate μ and Σ (a deterministic sample)
FLOOR = 1e-3  # residual variances below FLOOR x their mean are raised to it (few items, many dims)


class MissingReferenceStats(ValueError):
    """A model folder without reference statistics, where they are needed (ensembles, the watch)."""

    def __init__(self, model: str, folder: str, why: str):
        super().__init__(f"model {model} has no reference statistics ({folder}/{STATS_JSON}), "
                         f"which {why}; compute them with `bradley eval {folder} --reference-stats` "
                         "(the model's validation split, or --data FILE)")


class LatentDistance:
    """Mahalanobis distance to the training states under Σ = U diag(λ) Uᵀ + D (module docstring).
    Tensors live on one device; `to(device)` moves them."""

    def __init__(self, mean: torch.Tensor, variances: torch.Tensor, components: torch.Tensor,
                 eigenvalues: torch.Tensor):
        self.mean, self.variances = mean.float(), variances.float()
        self.components, self.eigenvalues = components.float(), eigenvalues.float()
        self._inverse_diag = 1.0 / self.variances
        self._correction = _woodbury_factor(variances, components, eigenvalues).float()

    @property
    def rank(self) -> int:
        return int(self.components.shape[1])

    def to(self, device) -> LatentDistance:
        return LatentDistance(self.mean.to(device), self.variances.to(device),
                              self.components.to(device), self.eigenvalues.to(device))

    def distance(self, states: torch.Tensor) -> torch.Tensor:
        """d(x) of each row of `states` [n, hidden], in float32 on the tensors' device: d² is a
        difference of two sums that bf16 (autocast's matmul inside a serving forward) would
        round to noise, so autocast is off here."""
        with torch.autocast(states.device.type, enabled=False):
            centred = states.float() - self.mean
            squared = (centred * centred * self._inverse_diag).sum(-1)
            if self.rank:
                squared = squared - (centred @ self._correction).square().sum(-1)
            return squared.clamp(min=0.0).sqrt()

    def covariance(self) -> torch.Tensor:
        """Σ itself [hidden, hidden] (tests and small checks; serving never builds it)."""
        u = self.components.double()
        return u @ torch.diag(self.eigenvalues.double()) @ u.T + torch.diag(self.variances.double())

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean.cpu().numpy(), "variances": self.variances.cpu().numpy(),
                "components": self.components.cpu().numpy(),
                "eigenvalues": self.eigenvalues.cpu().numpy()}


def _woodbury_factor(variances, components, eigenvalues) -> torch.Tensor:
    """D⁻¹ U L with L Lᵀ = (diag(1/λ) + Uᵀ D⁻¹ U)⁻¹, in float64 (it is computed once)."""
    if components.shape[1] == 0:
        return components.double()
    d_inv_u = components.double() / variances.double()[:, None]
    inner = torch.diag(1.0 / eigenvalues.double()) + components.double().T @ d_inv_u
    lower = torch.linalg.cholesky(torch.linalg.inv(inner))
    return d_inv_u @ lower


def fit_latent(states: torch.Tensor, rank: int = DEFAULT_RANK) -> LatentDistance:
    """μ and Σ = U diag(λ) Uᵀ + D from the rows of `states` [n, hidden]: U, λ the top `rank`
    principal directions and their (n − 1)-normalised variances, D what each coordinate's
    variance has left, floored (module docstring)."""
    x = states.double().cpu()
    n, dim = x.shape
    if n < 2:
        raise ValueError(f"{n} item(s) cannot estimate a covariance; pass at least 2 training items")
    mean = x.mean(0)
    centred = x - mean
    variances = centred.square().sum(0) / (n - 1)
    rank = max(0, min(rank, dim, n - 1))
    if rank:
        _, singular, vh = torch.linalg.svd(centred, full_matrices=False)
        components, eigenvalues = vh[:rank].T, singular[:rank].square() / (n - 1)
        keep = eigenvalues > 0
        components, eigenvalues = components[:, keep], eigenvalues[keep]
    else:
        components, eigenvalues = torch.zeros(dim, 0, dtype=torch.float64), torch.zeros(0)
    floor = FLOOR * float(variances.mean()) + 1e-12
    residual = variances - (components.square() * eigenvalues).sum(1)
    return LatentDistance(mean, residual.clamp(min=floor), components, eigenvalues)


@dataclass
class ReferenceStats:
    """What `reference_stats.json` holds, and the latent distance beside it."""

    score_mean: float
    score_std: float
    score_quantiles: dict[str, float]
    length_correlation: float | None
    response_chars_mean: float
    mahalanobis_p99: float
    n_val: int
    n_fit: int
    hidden_dim: int
    rank: int
    source: str = ""
    latent: LatentDistance | None = field(default=None, repr=False)

    @property
    def covariance_kind(self) -> str:
        return "low-rank+diagonal" if self.rank else "diagonal"

    def standardise(self, scores):
        """(score − validation mean) / validation std: rewards in validation stds."""
        return (np.asarray(scores, dtype=np.float64) - self.score_mean) / self.score_std

    def as_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "latent"}
        return {**out, "covariance": self.covariance_kind}


def collect(rm, items: list[tuple], batch_size: int = 32) -> tuple[np.ndarray, torch.Tensor]:
    """(scores [n], final hidden states [n, hidden] float32 on the CPU) of (prompt, response)
    items, from one forward per length-sorted batch."""
    ids = rm.encode([p for p, _ in items], [r for _, r in items])
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    scores, states = np.zeros(len(ids)), [None] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        values, hidden = rm.score_encoded([ids[i] for i in chunk],
                                          on_states=lambda s: s.float().cpu())
        for row, i in enumerate(chunk):
            scores[i], states[i] = values[row], hidden[row]
    return scores, torch.stack(states) if states else torch.zeros(0, 0)


def compute_reference_stats(rm, fit_items: list[tuple], val_items: list[tuple],
                            rank: int = DEFAULT_RANK, batch_size: int = 32,
                            source: str = "") -> ReferenceStats:
    """Reference statistics of a loaded RewardModel: μ, Σ from `fit_items` (training (prompt,
    response) items; at most MAX_FIT_ITEMS, evenly spaced), scores and distances of `val_items`."""
    if len(val_items) < 2:
        raise ValueError(f"{len(val_items)} validation item(s): the reference statistics need at "
                         "least 2; hold out more pairs (--val-fraction) or pass --data FILE")
    step = max(1, math.ceil(len(fit_items) / MAX_FIT_ITEMS))
    _, fit_states = collect(rm, fit_items[::step], batch_size)
    latent = fit_latent(fit_states, rank)
    scores, val_states = collect(rm, val_items, batch_size)
    distances = latent.distance(val_states).numpy()
    chars = np.array([len(r) for _, r in val_items], dtype=np.float64)
    return ReferenceStats(
        score_mean=float(scores.mean()), score_std=float(scores.std(ddof=1)) or 1.0,
        score_quantiles={str(q): float(v) for q, v in zip(QUANTILES, np.quantile(scores, QUANTILES),
                                                          strict=True)},
        length_correlation=pearson(scores, chars), response_chars_mean=float(chars.mean()),
        mahalanobis_p99=float(np.quantile(distances, 0.99)), n_val=len(val_items),
        n_fit=len(fit_states), hidden_dim=int(fit_states.shape[1]), rank=latent.rank,
        source=source, latent=latent)


def pearson(x, y) -> float | None:
    """Pearson's r; None when either side is constant.

    >>> pearson([1, 2, 3], [2, 4, 7])
    0.9933992677987828
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def write_reference_stats(folder, stats: ReferenceStats) -> Path:
    folder = Path(folder)
    np.savez(folder / STATS_ARRAYS, **stats.latent.arrays())
    (folder / STATS_JSON).write_text(json.dumps(stats.as_json(), indent=2))
    return folder / STATS_JSON


def read_reference_stats(folder) -> ReferenceStats | None:
    """The folder's reference statistics; None when it has none."""
    folder = Path(folder)
    if not (folder / STATS_JSON).is_file() or not (folder / STATS_ARRAYS).is_file():
        return None
    record = json.loads((folder / STATS_JSON).read_text())
    record.pop("covariance", None)
    with np.load(folder / STATS_ARRAYS, allow_pickle=False) as arrays:
        latent = LatentDistance(*(torch.from_numpy(arrays[k]) for k in
                                  ("mean", "variances", "components", "eigenvalues")))
    return ReferenceStats(**record, latent=latent)
