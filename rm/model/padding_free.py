"""Padding-free forwards of causal decoders on CUDA: a batch's rows end to end in one sequence, the
positions restarting at 0 in each row, and attention through PyTorch's variable-length FlashAttention
(`torch.nn.attention.varlen.varlen_attn`), which takes each row's start in the sequence
(`cu_seqlens`, the cumulative lengths) and attends causally inside a row only. No padded token is
computed and no [rows, 1, T, T] mask is built. Training batches (rm/model/reward_model.py:
RewardNet, rm/train/logps.py: PolicyNet) and the serving batcher's forwards
(rm/model/reward_model.py: RewardModel) go through the same `PackedRows` and attention function.

The attention function is registered with transformers' AttentionInterface under `KERNEL` and the
model switched to it (`enable`); the mask builder registered beside it builds no mask, and the
varlen arguments travel to every attention layer as keyword arguments of the decoder's forward.
A model it cannot serve (an encoder, no attention-interface support, a sliding window, attention
dropout) or a device without the kernel (a CPU; torch without `varlen_attn`) keeps the padded path,
and `enable` says why once per model class and reason. On a CPU the padded SDPA path is the fast
one and nothing is said.

    >>> rows = pack_rows([[5, 6, 7], [8], [9, 10]], torch.device("cpu"))
    >>> rows.input_ids.tolist(), rows.position_ids.tolist()
    ([[5, 6, 7, 8, 9, 10]], [[0, 1, 2, 0, 0, 1]])
    >>> rows.cu_seqlens.tolist(), rows.max_length, rows.last.tolist()
    ([0, 3, 4, 6], 3, [2, 3, 5])
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from rm.model.padding import flat_ids

KERNEL = "bradley_varlen"
log = logging.getLogger(__name__)
_said: set[tuple[str, str]] = set()


@dataclass
class PackedRows:
    """Rows end to end: `input_ids` and `position_ids` [1, N], `cu_seqlens` [rows + 1] (int32,
    each row's start, then N), `max_length` (the longest row), `last` [rows] (each row's last
    token in the sequence)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_length: int
    last: torch.Tensor

    def attention_kwargs(self) -> dict:
        """What the attention layers read (transformers passes a decoder's extra keyword arguments
        down to them; the names are those of its FlashAttention keyword arguments)."""
        return {"cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def pack_rows(rows: list[list[int]], device: torch.device) -> PackedRows:
    """Token-id lists → PackedRows on `device` (the serving batcher's rows)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    positions = np.arange(int(ends[-1])) - np.repeat(starts, lengths)
    cu = np.concatenate([[0], ends]).astype(np.int32)
    to = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    return PackedRows(to(flat_ids(rows, lengths))[None], to(positions)[None], to(cu),
                      int(lengths.max()), to(ends - 1))


def unpad(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[PackedRows, torch.Tensor]:
    """A padded batch (left or right padding) → (PackedRows, the flat indices of its real tokens
    in the [rows × width] batch), on the batch's device (training batches arrive padded).

    >>> rows, kept = unpad(torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))
    >>> rows.input_ids.tolist(), rows.cu_seqlens.tolist(), kept.tolist()
    ([[5, 6, 7, 8, 9]], [0, 2, 5], [1, 2, 3, 4, 5])
    """
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    kept = mask.flatten().nonzero().squeeze(-1)
    positions = (mask.long().cumsum(-1) - 1)[mask]
    ends = lengths.cumsum(0)
    cu = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    rows = PackedRows(input_ids.flatten()[kept][None], positions[None], cu, int(lengths.max()), ends - 1)
    return rows, kept


def decoder_hidden(base_model, rows: PackedRows) -> torch.Tensor:
    """The decoder's final hidden states [1, N, d] of packed rows (a model `enable`d)."""
    out = base_model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False,
                     **rows.attention_kwargs())
    return out[0]


# --- the kernel and its registration ------------------------------------------------------------


def _varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _causal_kwargs(kernel) -> dict:
    """torch 2.9-2.10 take `is_causal`; later versions a (left, right) window, (-1, 0) causal."""
    names = inspect.signature(kernel).parameters
    return {"window_size": (-1, 0)} if "window_size" in names else {"is_causal": True}


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: query [1, H, N, D], key and value
    [1, H_kv, N, D] → ([1, N, H, D], None). Key and value heads are repeated for grouped-query
    attention when the kernel cannot share them itself; a head size that is not a multiple of 8
    (FlashAttention's granularity) is zero-padded, which changes no dot product."""
    kernel = _varlen()
    cu, longest = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, D]
    names = inspect.signature(kernel).parameters
    groups = q.shape[1] // k.shape[1]
    extra = _causal_kwargs(kernel)
    if groups > 1 and "enable_gqa" in names:
        extra["enable_gqa"] = True
    elif groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    head = q.shape[-1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(head)
    width = -head % 8
    if width:
        q, k, v = (torch.nn.functional.pad(t, (0, width)) for t in (q, k, v))
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):  # FlashAttention's dtypes
        compute = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    if "scale" in names:
        extra["scale"] = scale
    else:  # the kernel's own scale is 1/sqrt(D) of the padded head
        q = q * (scale * math.sqrt(head + width))
    out = kernel(q, k, v, cu, cu, longest, longest, **extra)
    return out[..., :head].to(query.dtype)[None], None


def _no_mask(*args, **kwargs):
    return None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(KERNEL, varlen_attention)
    AttentionMaskInterface.register(KERNEL, _no_mask)


def why_not(hf_model, device: torch.device) -> str | None:
    """Why `hf_model` on `device` keeps the padded path; None when it can go padding-free."""
    config = hf_model.config
    if device.type != "cuda":
        return "a CPU runs the padded SDPA path"
    if _varlen() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (2.9 or later does)"
    if not getattr(hf_model, "_supports_attention_backend", False):
        return f"{type(hf_model).__name__} does not take transformers' attention functions"
    heads = [getattr(hf_model, name, None) for name in ("score", "lm_head")]
    if getattr(config, "is_encoder_decoder", False) or not any(isinstance(h, torch.nn.Module) for h in heads):
        return "padding-free forwards serve causal decoders only"
    if getattr(config, "use_bidirectional_attention", False):
        return "the model attends both ways"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model attends through a sliding window"
    if getattr(config, "attention_dropout", 0.0):
        return "the model has attention dropout"
    return None


def enable(hf_model, device: torch.device) -> bool:
    """Switch `hf_model` to the varlen attention function when it and `device` allow; else keep
    its attention, say why once (not on a CPU, where padded is the plan) and return False."""
    reason = why_not(hf_model, device)
    if reason is None:
        try:
            _register()
            hf_model.set_attn_implementation(KERNEL)
            return True
        except (ValueError, ImportError, AttributeError) as exc:
            reason = f"transformers refused the attention function ({exc})"
    key = (type(hf_model).__name__, reason)
    if device.type == "cuda" and key not in _said:
        _said.add(key)
        log.warning("padded forwards for %s: %s", key[0], reason)
    return False
