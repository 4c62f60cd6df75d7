"""Snapshot pairs → token ids → length-grouped batches of (chosen, rejected) in one forward.

* Split: a pair goes to validation when the hash of its prompt id falls under `val_fraction`, so a
  prompt is never on both sides and the split is the same on every rank and every run.
* Truncation: sequences longer than `max_length` lose prompt tokens from the left (rm/model/tokenizer.py);
  nothing is dropped, and the count is reported (TRL's RewardTrainer drops such pairs instead).
* Batches: indices are shuffled, cut into mega-batches of 50 batches, sorted by length inside each,
  then chunked, so a batch holds sequences of similar length (little padding) while the order over
  the epoch stays random. A batch's chosen rows come first, then its rejected rows: one forward.

    >>> split_of("p1", 0.5) in ("train", "val")
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from rm.model.tokenizer import encode_prompt_response

MEGA_BATCH = 50


def split_of(prompt_id: str, val_fraction: float) -> str:
    """'val' when sha256(prompt_id) maps below `val_fraction` of [0, 1), else 'train'.

    sha256("a") starts ca978112 → 0.79 → train; sha256("b") starts 3e23e816 → 0.24 → val:

    >>> [split_of(p, 0.5) for p in ("a", "b")]
    ['train', 'val']
    >>> split_of("a", 0.0)
    'train'
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    bucket = int(hashlib.sha256(prompt_id.encode()).hexdigest()[:8], 16) / 2**32
    return "val" if bucket < val_fraction else "train"


def row_prompt(row: dict):
    """The prompt of a pair row: its messages (a conversation) when present, else its text.

    >>> row_prompt({"prompt": "hi", "messages": None})
    'hi'
    >>> row_prompt({"prompt": "user: hi", "messages": '[{"role": "user", "content": "hi"}]'})
    [{'role': 'user', 'content': 'hi'}]
    """
    messages = row.get("messages")
    if isinstance(messages, str) and messages:
        messages = json.loads(messages)
    return messages if messages else row["prompt"]


@dataclass
class TokenizedPairs:
    """Token ids of each pair's two scored sequences plus its soft label and margin."""

    chosen: list[list[int]] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    p_chosen: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    n_truncated: int = 0

    def __len__(self) -> int:
        return len(self.chosen)

    def lengths(self) -> np.ndarray:
        return np.array([max(len(c), len(r)) for c, r in zip(self.chosen, self.rejected, strict=False)], dtype=np.int64)

    def subset(self, keep: list[int]) -> TokenizedPairs:
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        return TokenizedPairs(pick(self.chosen), pick(self.rejected), pick(self.p_chosen),
                              pick(self.margin), pick(self.prompt_ids), self.n_truncated)


def tokenize_pairs(tokenizer, rows: list[dict], max_length: int | None) -> TokenizedPairs:
    """Tokenize pair rows (`prompt`/`messages`, `chosen`, `rejected`, optional `p_chosen`,
    `margin`, `prompt_id`); `n_truncated` counts pairs where either side was cut."""
    out = TokenizedPairs()
    for i, row in enumerate(rows):
        prompt = row_prompt(row)
        chosen, _, cut_c = encode_prompt_response(tokenizer, prompt, row["chosen"], max_length)
        rejected, _, cut_r = encode_prompt_response(tokenizer, prompt, row["rejected"], max_length)
        out.chosen.append(chosen)
        out.rejected.append(rejected)
        p = row.get("p_chosen")
        out.p_chosen.append(1.0 if p is None else float(p))
        m = row.get("margin")
        out.margin.append(0.0 if m is None else float(m))
        out.prompt_ids.append(str(row.get("prompt_id") or i))
        out.n_truncated += int(cut_c or cut_r)
    return out


def split_pairs(pairs: TokenizedPairs, val_fraction: float) -> tuple[TokenizedPairs, TokenizedPairs]:
    """(train, val) by prompt hash; with val_fraction 0 the validation set is empty."""
    sides = [split_of(pid, val_fraction) for pid in pairs.prompt_ids]
    train = pairs.subset([i for i, s in enumerate(sides) if s == "train"])
    val = pairs.subset([i for i, s in enumerate(sides) if s == "val"])
    val.n_truncated = 0
    return train, val


def length_grouped_batches(lengths: np.ndarray, batch_size: int, seed: int,
                           shuffle: bool = True) -> list[np.ndarray]:
    """Index batches of similar length: shuffle, sort within mega-batches, chunk, shuffle batches.

    Without `shuffle` the batches are simply length-sorted (evaluation).

    >>> [b.tolist() for b in length_grouped_batches(np.array([5, 1, 4, 2]), 2, 0, shuffle=False)]
    [[1, 3], [2, 0]]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))
    span = batch_size * MEGA_BATCH
    groups = [order[i:i + span] for i in range(0, len(order), span)]
    sorted_order = np.concatenate([g[np.argsort(lengths[g], kind="stable")] for g in groups]) \
        if groups else order
    batches = [sorted_order[i:i + batch_size] for i in range(0, len(sorted_order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def shard(batches: list, rank: int, world_size: int) -> list:
    """Every world_size-th batch from `rank`, cut to the same count on every rank (DDP needs equal
    steps; at most world_size − 1 batches per epoch are left out).

    >>> shard(list(range(7)), 1, 3)
    [1, 4]
    """
    per_rank = len(batches) // world_size
    return batches[rank::world_size][:per_rank]


def collate_pairs(pairs: TokenizedPairs, index, pad_id: int, padding_side: str = "right") -> dict:
    """One batch: 2B padded rows (chosen then rejected), and the pairs' p_chosen and margin."""
    import torch

    from rm.model.padding import pad_batch

    index = [int(i) for i in index]
    seqs = [pairs.chosen[i] for i in index] + [pairs.rejected[i] for i in index]
    batch = pad_batch(seqs, pad_id, padding_side)
    batch["p_chosen"] = torch.tensor([pairs.p_chosen[i] for i in index], dtype=torch.float32)
    batch["margin"] = torch.tensor([pairs.margin[i] for i in index], dtype=torch.float32)
    return batch


def padding_share(batches: list, lengths: np.ndarray) -> float:
    """Share of padded tokens when each batch pads to its longest sequence.

    >>> padding_share([np.array([0, 1])], np.array([2, 4]))
    0.25
    """
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    return 1.0 - real / padded if padded else 0.0


def pair_margins(judgments, pairs) -> list[float]:
    """Per pair, the mean `strength` of the judgments that voted for its chosen response (0 when
    none carry one): the Bradley–Terry margin of Llama 2 (Touvron et al. 2023, eq. 2).

    >>> import pyarrow as pa
    >>> j = pa.table({"prompt_id": ["p", "p", "p"], "response_a": ["x", "y", "x"],
    ...               "response_b": ["y", "x", "y"], "winner": ["a", "b", "b"],
    ...               "strength": [1.0, 3.0, 5.0]})
    >>> pair_margins(j, pa.table({"prompt_id": ["p"], "chosen_id": ["x"], "rejected_id": ["y"]}))
    [2.0]
    """
    j = judgments.select(["prompt_id", "response_a", "response_b", "winner", "strength"]).to_pandas()
    j = j[(j["winner"] != "tie") & j["strength"].notna()]
    a_won = j["winner"] == "a"
    j = j.assign(chosen_id=j["response_a"].where(a_won, j["response_b"]),
                 rejected_id=j["response_b"].where(a_won, j["response_a"]))
    mean = j.groupby(["prompt_id", "chosen_id", "rejected_id"])["strength"].mean()
    keys = zip(pairs.column("prompt_id").to_pylist(), pairs.column("chosen_id").to_pylist(),
               pairs.column("rejected_id").to_pylist(), strict=False)
    lookup = mean.to_dict()
    return [float(lookup.get(k, 0.0)) for k in keys]
