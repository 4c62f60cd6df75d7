"""Packed forwards: a causal decoder scores many rows as one unpadded row, attention kept per row.

A padded forward computes every row to the batch's longest: the rows /score's batcher gets from
64 waiting single-sample requests differ in length, and on a CPU, where a padded token costs as
much as a real one, a third or more of such a forward was padding (tiny model, 8 random hh-rlhf
rows). Packed, the rows are laid end to end in one row of sum(lengths) tokens, so the embeddings,
projections and MLP see only real tokens; position ids restart at 0 at each row, and attention
runs row by row, each row causal over its own tokens only (the layout flash-attention's varlen
kernels take, there as cumulative sequence lengths).

Hugging Face models pick their attention function by name from transformers' registries (its
documented extension point, `AttentionInterface`): `install` registers ours under `NAME` and sets it
on one model. Outside `rows(...)`, it and its mask function are transformers' own SDPA ones, so
every other forward of that model (masked scoring, the probe) computes what it did before. Inside,
no mask is built (a dense [T, T] block-diagonal mask would cost more than the padding it saves)
and each row's queries attend to its own keys (for these position ids transformers itself would
build that dense mask):

    out[a:b] = softmax(q[a:b] k[a:b]^T / sqrt(d) + causal) v[a:b]   for each row's span [a, b)

Only for configs whose layers all attend fully (no sliding window: a row longer than the window
would see past it here). `RewardModel` also checks, on probe rows, that packed scores equal the
rows scored alone before it scores packed.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import numpy as np
import torch
import torch.nn.functional as F

from rm.model.padding import flat_ids

NAME = "bradley_packed"
_spans: ContextVar[list[tuple[int, int]] | None] = ContextVar("bradley_packed_spans", default=None)


def full_attention(config) -> bool:
    """Whether every layer of `config` attends to all earlier tokens (no sliding window).

    >>> from transformers import LlamaConfig, MistralConfig
    >>> full_attention(LlamaConfig()), full_attention(MistralConfig(sliding_window=64))
    (True, False)
    """
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(kind == "full_attention" for kind in types)
    window = getattr(config, "sliding_window", None)
    return not window or getattr(config, "use_sliding_window", True) is False


def install(hf_model) -> bool:
    """Give `hf_model` the packed attention when it uses SDPA and attends fully; False otherwise,
    and where transformers has no registered attention or the model class refuses it (transformers
    only warns then, leaving SDPA set)."""
    config = hf_model.config
    if config._attn_implementation == NAME:
        return True
    if config._attn_implementation != "sdpa" or not full_attention(config):
        return False
    try:
        _register()
        hf_model.set_attn_implementation(NAME)
    except Exception:  # noqa: BLE001 - an older transformers, or a model that refuses it
        return False
    return config._attn_implementation == NAME


def uninstall(hf_model) -> None:
    if hf_model.config._attn_implementation == NAME:
        hf_model.set_attn_implementation("sdpa")


def layout(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """One packed row: ids [1, T], position ids [1, T] restarting at each row, and each row's span.

    >>> ids, positions, spans = layout([[5, 6, 7], [8, 9]])
    >>> ids.tolist(), positions.tolist(), spans
    ([[5, 6, 7, 8, 9]], [[0, 1, 2, 0, 1]], [(0, 3), (3, 5)])
    """
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    positions = np.arange(int(ends[-1])) - np.repeat(starts, lengths)
    spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
    return torch.from_numpy(flat_ids(rows, lengths))[None], torch.from_numpy(positions)[None], spans


@contextlib.contextmanager
def rows(spans: list[tuple[int, int]]):
    """Forwards inside attend within each span of the packed row (this context: this thread)."""
    token = _spans.set(spans)
    try:
        yield
    finally:
        _spans.reset(token)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    spans = _spans.get()
    if spans is None:
        return _sdpa["attention"](module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)
    _check_plain(module, kwargs)
    if key.shape[1] != query.shape[1]:  # grouped-query attention: a key/value head per group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.cat([F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b],
                                                    value[:, :, a:b], is_causal=True, scale=scaling)
                     for a, b in spans], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _check_plain(module, kwargs) -> None:
    """Packed attention is plain causal attention: a layer asking for more (a window, soft-capping,
    sinks, a position bias, both directions) or training (dropout) raises, so the probe says no
    instead of passing or failing by its tolerance."""
    extras = [name for name in ("sliding_window", "softcap", "s_aux", "position_bias")
              if kwargs.get(name) is not None]
    if kwargs.get("is_causal") is False or not getattr(module, "is_causal", True):
        extras.append("bidirectional attention")
    if module.training:
        extras.append("training")
    if extras:
        raise NotImplementedError(f"packed attention is plain causal attention, not {extras}")


def _mask(*args, **kwargs):
    if _spans.get() is not None:
        return None  # the spans are the mask
    return _sdpa["mask"](*args, **kwargs)


_sdpa: dict = {}  # transformers' own SDPA attention and mask functions, bound at registration


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    _sdpa.update(attention=sdpa_attention_forward, mask=sdpa_mask)
    AttentionInterface.register(NAME, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _mask)
