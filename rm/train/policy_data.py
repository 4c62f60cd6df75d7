"""Preference data for policy training: snapshot rows → jointly tokenized sequences → batches.

A policy is scored on log π(y | x) over the response tokens only, so each sequence keeps the index
where its response starts. Prompt and response are tokenized **together** and the boundary is read
from the joint tokenization's character offsets: tokenizing them apart and concatenating gives
other tokens at the seam than the model sees at generation time (trl#1679). A token that straddles
the seam counts as response.

The text layout is rm/model/tokenizer.py's, shared with the reward model and /score: the chat template
with the assistant turn when the tokenizer has one, else `prompt \\n\\n response <eos>`. Sequences
longer than `max_length` lose prompt tokens from the left (rm.model.tokenizer.truncate_left); nothing is
dropped, and the count of truncated sequences is reported. Splits and length-grouped batches are
rm/train/reward_data.py's, so a policy and a reward model trained on one snapshot see the same validation prompts.

Sequences are keyed by response id (or, for KTO's mismatched pairs, by a hash of prompt id and
response id): the key of the reference log-prob cache.

    >>> seqs = [Encoded((1, 5, 2), start=2), Encoded((1, 2), start=1)]
    >>> batch = collate(seqs, pad_id=0)
    >>> batch["response_mask"].tolist(), batch["logits_to_keep"]
    ([[0, 0, 1], [0, 1, 0]], 3)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rm.model.template import render as render_text
from rm.model.tokenizer import truncate_left
from rm.train.reward_data import length_grouped_batches, row_prompt, shard, split_of

TEMPLATE_FORMAT = 1  # bump when the text layout here changes: it invalidates cached ref log-probs


class PolicyDataError(ValueError):
    """The snapshot cannot feed the chosen objective; the message says what to add or change."""


@dataclass(frozen=True)
class Encoded:
    """One prompt+response token sequence; `start` is the index of the first response token."""

    ids: tuple[int, ...]
    start: int


def render(tokenizer, prompt: str | list[dict], response: str) -> tuple[str, str, bool]:
    """(prompt part, full text, add special tokens?) in rm/model/template.py's layout: the chat
    template with the assistant turn when there is one, else `prompt \\n\\n response <eos>`."""
    head, full = render_text(tokenizer, prompt, response)
    return head, full, not getattr(tokenizer, "chat_template", None)  # templates carry their own bos


def encode(tokenizer, prompt: str | list[dict], response: str,
           max_length: int) -> tuple[Encoded, bool]:
    """Tokenize prompt+response jointly; returns the sequence and whether it was truncated."""
    head, full, specials = render(tokenizer, prompt, response)
    enc = tokenizer(full, return_offsets_mapping=True, add_special_tokens=specials)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    start = next((i for i, (a, b) in enumerate(offsets) if b > a and b > len(head)), len(ids))
    start = max(start, 1)  # the first token has no prediction; it belongs to the prompt
    keep = 1 if ids and ids[0] == tokenizer.bos_token_id else 0
    ids, start, truncated = truncate_left(ids, start, max_length, keep_head=keep)
    return Encoded(tuple(ids), start), truncated


def template_hash(tokenizer, max_length: int) -> str:
    """Everything besides the weights and the text that changes a cached log-prob."""
    spec = {"format": TEMPLATE_FORMAT, "chat_template": getattr(tokenizer, "chat_template", None),
            "eos": tokenizer.eos_token, "bos": tokenizer.bos_token, "vocab": len(tokenizer),
            "max_length": max_length, "class": type(tokenizer).__name__}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:24]


def collate(seqs: Sequence[Encoded], pad_id: int) -> dict:
    """Right-padded input_ids, attention_mask and response_mask for a list of sequences, and
    `logits_to_keep`: the positions from the one before the earliest response token to the end."""
    width = max(len(s.ids) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    response = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s.ids)] = torch.tensor(s.ids)
        attention[i, : len(s.ids)] = 1
        response[i, s.start: len(s.ids)] = 1
    keep = width - min(s.start for s in seqs) + 1
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response,
            "logits_to_keep": keep}


# --- examples and batches ---------------------------------------------------------------------


@dataclass
class PoData:
    """Tokenized sequences by key, and the examples that index them with their prompt ids."""

    sequences: dict[str, Encoded]
    examples: list[tuple]  # paired: (chosen_key, rejected_key); kto: (key, desirable, kl_key)
    prompt_ids: list[str]
    paired: bool
    stats: dict = field(default_factory=dict)

    def split(self, val_fraction: float) -> tuple[list[int], list[int]]:
        """Example indices (train, val) by prompt hash, as the reward model splits (rm/train/reward_data.py)."""
        sides = [split_of(pid, val_fraction) for pid in self.prompt_ids]
        return ([i for i, s in enumerate(sides) if s == "train"],
                [i for i, s in enumerate(sides) if s == "val"])


def pair_data(rows: Iterable[dict], tokenizer, max_length: int) -> PoData:
    """Resolved pairs → sequences keyed by response id; exact ties (p̂ = 0.5) have no side: skipped."""
    data = PoData({}, [], [], True, {"pairs": 0, "ties_skipped": 0, "truncated": 0})
    for row in rows:
        if _is_tie(row):
            data.stats["ties_skipped"] += 1
            continue
        prompt = row_prompt(row)
        for key, text in ((row["chosen_id"], row["chosen"]), (row["rejected_id"], row["rejected"])):
            _add(data, key, tokenizer, prompt, text, max_length)
        data.examples.append((row["chosen_id"], row["rejected_id"]))
        data.prompt_ids.append(row["prompt_id"])
    data.stats["pairs"] = len(data.examples)
    if not data.examples:
        raise PolicyDataError("no usable pairs in the snapshot (every pair is an exact tie or the "
                              "store is empty); ingest judgments first with `bradley ingest`")
    return data


def kto_data(feedback_rows: Iterable[dict], pair_rows: Iterable[dict], tokenizer,
             max_length: int) -> PoData:
    """Unpaired completions: the feedback table plus every pair split into desirable (chosen) and
    undesirable (rejected). Each completion is matched with the next completion of a different
    prompt (x, y'): the mismatched pair whose log-ratio estimates KL for z0, even in a batch of one."""
    items = [(r["prompt_id"], row_prompt(r), r["response_id"], r["completion"], bool(r["label"]))
             for r in feedback_rows]
    for r in pair_rows:
        if not _is_tie(r):
            items.append((r["prompt_id"], row_prompt(r), r["chosen_id"], r["chosen"], True))
            items.append((r["prompt_id"], row_prompt(r), r["rejected_id"], r["rejected"], False))
    if len({it[0] for it in items}) < 2:
        raise PolicyDataError("KTO needs completions for at least two different prompts to estimate "
                              "its reference point z0 from mismatched prompt-completion pairs")
    data = PoData({}, [], [], False, {"completions": len(items), "truncated": 0})
    for i, (pid, prompt, rid, text, label) in enumerate(items):
        other = next(items[(i + j) % len(items)] for j in range(1, len(items))
                     if items[(i + j) % len(items)][0] != pid)
        kl_key = hashlib.sha256(f"kl\x1f{pid}\x1f{other[2]}".encode()).hexdigest()[:24]
        _add(data, rid, tokenizer, prompt, text, max_length)
        _add(data, kl_key, tokenizer, prompt, other[3], max_length)
        data.examples.append((rid, label, kl_key))
        data.prompt_ids.append(pid)
    return data


def _is_tie(row: dict) -> bool:
    return row.get("p_chosen") is not None and abs(row["p_chosen"] - 0.5) < 1e-9


def _add(data: PoData, key, tokenizer, prompt, text, max_length) -> None:
    if key not in data.sequences:
        data.sequences[key], cut = encode(tokenizer, prompt, text, max_length)
        data.stats["truncated"] += int(cut)


def batches(data: PoData, indices: Sequence[int], batch_size: int, seed: int = 0, rank: int = 0,
            world_size: int = 1, shuffle: bool = True) -> list[list[int]]:
    """Length-grouped batches of example indices (rm/train/reward_data.py's recipe), this rank's share."""
    lengths = np.array([max(len(data.sequences[data.examples[i][0]].ids),
                            len(data.sequences[data.examples[i][-1]].ids)) for i in indices])
    groups = length_grouped_batches(lengths, batch_size, seed, shuffle)
    return [[indices[int(j)] for j in g] for g in shard(groups, rank, world_size)]


def collate_examples(data: PoData, ref: dict, idx: Sequence[int], pad_id: int) -> dict:
    """One batch: the chosen rows then the rejected rows (paired), or the completions then their
    mismatched KL rows (KTO), with the cached reference log-probs of every row."""
    exs = [data.examples[i] for i in idx]
    keys = [e[0] for e in exs] + [e[-1] for e in exs]
    batch = collate([data.sequences[k] for k in keys], pad_id)
    batch["ref_logps"] = torch.tensor([ref[k][0] for k in keys], dtype=torch.float32)
    if not data.paired:
        batch["desirable"] = torch.tensor([e[1] for e in exs], dtype=torch.bool)
    return batch
