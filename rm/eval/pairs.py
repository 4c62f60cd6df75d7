"""How well a reward model orders pairs, and warning signs (`bradley eval MODEL [--data FILE]`, whose
edge in service/cli/eval.py resolves the model and reads the snapshot).

Statistics (pure functions on arrays of chosen and rejected rewards r_c, r_r):
* accuracy: share of pairs with r_c > r_r (equal rewards count ½); pairs whose vote share p̂ is
  exactly ½ (a tie) have no right answer and are left out. Also per subset (RewardBench style).
* ece: expected calibration error of q = σ(r_c − r_r) against p̂ over 10 equal-width bins
  (Naeini et al. 2015; Guo et al. 2017), each pair counted in both orientations (q, p̂) and
  (1 − q, 1 − p̂) because which side is called "chosen" is arbitrary.
* length_spearman: Spearman correlation of reward with response length in characters over all
  responses: a reward that mostly tracks length is a reward-hacking warning (Singhal et al. 2023).

Data: with `--data`, TRL/RewardBench rows (`prompt, chosen, rejected`, optional `subset`), LLMBar
(`input, output_1, output_2, label`), or hh-rlhf transcripts (`chosen, rejected` only); a JSON list,
JSONL, optionally gzipped, or a folder of such files (each file's name is its subset). Without it,
the validation split of the model's own snapshot, split exactly as training split it.

    >>> accuracy(np.array([2.0, 0.0, 1.0]), np.array([1.0, 1.0, 1.0]))
    0.5
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np

N_BINS = 10


def accuracy(chosen: np.ndarray, rejected: np.ndarray, p_chosen: np.ndarray | None = None):
    """Share of decided pairs ordered right; None when every pair is a tie.

    >>> accuracy(np.array([1.0, 1.0]), np.array([0.0, 2.0]), np.array([1.0, 0.5]))
    1.0
    """
    decided = np.ones(len(chosen), bool) if p_chosen is None else np.asarray(p_chosen) != 0.5
    if not decided.any():
        return None
    right = (chosen > rejected) + 0.5 * (chosen == rejected)
    return float(right[decided].mean())


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def expected_calibration_error(chosen: np.ndarray, rejected: np.ndarray, p_chosen: np.ndarray,
                               n_bins: int = N_BINS) -> float | None:
    """Σ_b (n_b / N)·|mean q − mean p̂| over bins of q, both orientations of every pair.

    Worked example: rewards (2, 0) and (0, 0), both p̂ = 1 → q = 0.881 and 0.5; with the flipped
    copies (0.119, 0) and (0.5, 0) the 0.5 bin is exact and the two outer bins are off by 0.119:
    ECE = 2 · ¼ · 0.119 = 0.0596.

    >>> round(expected_calibration_error(np.array([2.0, 0.0]), np.zeros(2), np.ones(2)), 4)
    0.0596
    """
    if len(chosen) == 0:
        return None
    q = sigmoid(np.asarray(chosen) - np.asarray(rejected))
    q, p = np.concatenate([q, 1.0 - q]), np.concatenate([p_chosen, 1.0 - np.asarray(p_chosen)])
    bins = np.minimum((q * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in np.unique(bins):
        inside = bins == b
        total += inside.mean() * abs(q[inside].mean() - p[inside].mean())
    return float(total)


def length_correlation(rewards: np.ndarray, lengths: np.ndarray) -> float | None:
    """Spearman ρ of reward with length; None when either is constant.

    Ranks (1, 2, 3) against (1, 3, 2): ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 12/24 = 0.5.

    >>> length_correlation(np.array([1.0, 2.0, 3.0]), np.array([10, 30, 20]))
    0.5
    """
    from scipy.stats import spearmanr

    if len(rewards) < 2 or np.ptp(rewards) == 0 or np.ptp(lengths) == 0:
        return None
    return float(spearmanr(rewards, lengths).statistic)


def summarize(chosen, rejected, p_chosen, subsets, len_chosen, len_rejected) -> dict:
    """Every statistic of one evaluation as JSON-ready values."""
    chosen, rejected = np.asarray(chosen, float), np.asarray(rejected, float)
    p_chosen, subsets = np.asarray(p_chosen, float), np.asarray(subsets, dtype=object)
    lengths = np.concatenate([len_chosen, len_rejected])
    per_subset = {}
    for name in sorted(set(subsets.tolist())):
        inside = subsets == name
        per_subset[name] = {"n": int(inside.sum()),
                            "accuracy": accuracy(chosen[inside], rejected[inside], p_chosen[inside])}
    return {"n_pairs": len(chosen), "n_ties": int((p_chosen == 0.5).sum()),
            "accuracy": accuracy(chosen, rejected, p_chosen), "per_subset": per_subset,
            "ece": expected_calibration_error(chosen, rejected, p_chosen),
            "length_spearman": length_correlation(np.concatenate([chosen, rejected]), lengths),
            "chosen_longer_share": float(np.mean(np.asarray(len_chosen) > np.asarray(len_rejected)))
            if len(chosen) else None,
            "mean_margin": float(np.mean(chosen - rejected)) if len(chosen) else None}


# --- data files -------------------------------------------------------------------------------


def _llmbar(row: dict) -> dict:
    if str(row["label"]) not in ("1", "2"):
        raise ValueError(f"LLMBar label must be 1 or 2, got {row['label']!r}")
    good, bad = ("output_1", "output_2") if str(row["label"]) == "1" else ("output_2", "output_1")
    return {"prompt": row["input"], "chosen": row[good], "rejected": row[bad]}


def _hh(row: dict) -> dict:
    """hh-rlhf: the prompt is the transcript both sides share, up to its last '\n\nAssistant:'."""
    marker = "\n\nAssistant:"
    shared = os.path.commonprefix([row["chosen"], row["rejected"]])
    cut = shared.rfind(marker) + len(marker)
    if cut < len(marker):
        raise ValueError("hh-rlhf row: chosen and rejected share no transcript up to an Assistant turn")
    return {"prompt": row["chosen"][:cut].strip(), "chosen": row["chosen"][cut:].strip(),
            "rejected": row["rejected"][cut:].strip()}


ROW_FORMATS = {  # the keys that identify a format → how to read a row of it
    ("input", "label", "output_1", "output_2"): _llmbar,
    ("chosen", "prompt", "rejected"): dict,
    ("chosen", "rejected"): _hh,
}


def _normalize(row: dict, subset: str) -> dict:
    for keys, read in ROW_FORMATS.items():
        if all(k in row for k in keys):
            out = read(row)
            return {"prompt": out["prompt"], "chosen": out["chosen"], "rejected": out["rejected"],
                    "subset": str(row.get("subset") or subset), "p_chosen": 1.0}
    raise ValueError(f"unrecognized row with keys {sorted(row)}; expected prompt/chosen/rejected, "
                     "LLMBar input/output_1/output_2/label, or hh-rlhf chosen/rejected")


def _read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        return json.loads(stripped)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_pairs_file(path: str | Path) -> list[dict]:
    """Rows `prompt, chosen, rejected, subset, p_chosen` from a file or a folder of files."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".jsonl", ".gz")))
        if not files:
            raise ValueError(f"{path} holds no .json/.jsonl(.gz) files to evaluate on")
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"--data {path}: no such file or folder")
    rows = []
    for file in files:
        subset = file.name.split(".")[0]
        try:
            rows += [_normalize(r, subset) for r in _read_rows(file)]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{file}: not JSON or JSONL ({exc})") from None
    return rows


# --- running it -------------------------------------------------------------------------------


def evaluate_rows(model, rows: list[dict], batch_size: int = 16) -> dict:
    """Score both sides of every row with a RewardModel and summarize."""
    from rm.train.reward_data import row_prompt

    if not rows:
        raise ValueError("nothing to evaluate: no pairs")
    prompts = [row_prompt(r) for r in rows]
    scores = model.score(prompts + prompts, [r["chosen"] for r in rows] + [r["rejected"] for r in rows],
                         batch_size=batch_size)
    n = len(rows)
    return summarize(scores[:n], scores[n:], [r.get("p_chosen", 1.0) for r in rows],
                     [r.get("subset") or "all" for r in rows],
                     [len(r["chosen"]) for r in rows], [len(r["rejected"]) for r in rows])


def validation_split(rows: list[dict], val_fraction: float) -> list[dict]:
    """The pairs of a snapshot that training held out (the same prompt-hash split, rm/train/reward_data.py)."""
    from rm.train.reward_data import split_of

    return [{**r, "subset": "validation"} for r in rows if split_of(r["prompt_id"], val_fraction) == "val"]
