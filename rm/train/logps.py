"""Sequence log-probs of a causal-LM policy and the reference pass: what the preference objectives
(rm/train/objectives.py) are computed from. Data preparation is rm/train/policy_data.py; the `bradley train po` run
is rm/train/policy.py.

Sequence log-prob of a response y to a prompt x: log π(y | x) = Σ_t log π(y_t | x, y_<t), summed
over response tokens only (prompt and padding masked; the logits at position i predict token i+1);
rm/train/policy_data.py tokenizes prompt and response jointly and marks where the response starts.

Reference log-probs are computed once per (reference weights, template, response) with the
initial policy itself, before training, and kept in a cache the caller hands in (the CLI hands the
store's `ref_logps` table): no reference model is resident while training, and a second run on the
same data does no reference pass.
"""

from __future__ import annotations

import hashlib
import sys

import torch
import torch.nn.functional as F

from rm.model import device as devices
from rm.train.policy_data import Encoded, collate

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

    A PolicyNet (possibly wrapped by DDP or FSDP) computes them itself, padding-free and without
    the whole logit tensor; any other causal LM's logits are computed only from the position
    before the earliest response token on (`logits_to_keep`): the LM head and the softmax skip the
    prompt, which for a large vocabulary is much of the step's time and memory.
    """
    if isinstance(devices.unwrap(model), PolicyNet):
        return model(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    return _logits_logps(model, batch["input_ids"], batch["attention_mask"], batch["response_mask"],
                         batch.get("logits_to_keep", 0))


def _logits_logps(model, ids, attention_mask, response_mask, keep: int = 0):
    out = model(input_ids=ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=keep)
    offset = ids.size(1) - out.logits.size(1)
    return sequence_logps(out.logits, ids[:, offset:], response_mask[:, offset:])


# a chunk of the vocabulary projection holds at most this many logits (256 MiB in fp32)
CHUNK_LOGITS = 1 << 26


def token_logps(hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(head(h_i))[y_i] for each row of `hidden` [M, d], in chunks of rows whose logits
    fit CHUNK_LOGITS: the [M, vocabulary] logits never exist at once. With gradients, each chunk's
    logits are recomputed in the backward pass (activation checkpointing) instead of kept, so the
    backward holds one chunk's too; one chunk alone is computed directly.

    >>> head = torch.nn.Linear(2, 3, bias=False)
    >>> with torch.no_grad():
    ...     _ = head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    >>> round(token_logps(torch.tensor([[0.0, 0.0]]), head, torch.tensor([2])).exp().item(), 6)
    0.333333
    """
    per_chunk = max(1, CHUNK_LOGITS // head.weight.shape[0])
    if hidden.shape[0] <= per_chunk:
        return _chunk_logps(hidden, head.weight, head.bias, labels)
    from torch.utils.checkpoint import checkpoint

    parts = []
    for h, y in zip(hidden.split(per_chunk), labels.split(per_chunk), strict=True):
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logps, h, head.weight, head.bias, y, use_reentrant=False))
        else:
            parts.append(_chunk_logps(h, head.weight, head.bias, y))
    return torch.cat(parts)


def _chunk_logps(hidden, weight, bias, labels):
    logits = F.linear(hidden, weight, bias).float()
    return logits.gather(-1, labels[:, None]).squeeze(-1) - logits.logsumexp(-1)


class PolicyNet(torch.nn.Module):
    """A causal LM as `forward(input_ids, attention_mask, response_mask) -> (Σ log π over each
    row's response tokens, their count)`: one module, so DDP and FSDP see the whole computation.

    The decoder's hidden states at the positions that predict a response token are gathered
    (token t is predicted at t − 1) and projected onto the
    vocabulary in chunks (`token_logps`). On CUDA the rows run padding-free
    (rm/model/padding_free.py, `go_padding_free`). A model whose own logits are more than its
    output projection (a logit soft-cap or scale) scores through them instead: a one-row probe at
    construction compares the two (`own_logits`).
    """

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model
        self.padding_free = False
        self.own_logits = not self._projection_matches()

    def go_padding_free(self, device: torch.device) -> bool:
        from rm.model import padding_free

        self.padding_free = not self.own_logits and padding_free.enable(self.hf, device)
        return self.padding_free

    def forward(self, input_ids, attention_mask, response_mask):
        if self.own_logits:
            return _logits_logps(self.hf, input_ids, attention_mask, response_mask)
        # a row's first token has no prediction (rm/train/policy_data.py pads on the right, so it
        # is column 0): in the rows end to end it would be scored from the row before
        scored = torch.cat([torch.zeros_like(response_mask[:, :1]), response_mask[:, 1:]], dim=1)
        hidden, ids, response, row_of = self._hidden(input_ids, attention_mask, scored)
        target = response[1:].bool()
        logps = token_logps(hidden[:-1][target], self.hf.get_output_embeddings(), ids[1:][target])
        sums = logps.new_zeros(input_ids.shape[0]).index_add(0, row_of[1:][target], logps)
        return sums, response_mask[:, 1:].sum(-1)

    def _hidden(self, input_ids, attention_mask, response_mask):
        """Final hidden states [tokens, d] of the rows end to end, with each token's id, response
        flag and row: packed (padding-free) or the padded batch flattened."""
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        if self.padding_free:
            from rm.model import padding_free

            packed, kept = padding_free.unpad(input_ids, attention_mask)
            hidden = padding_free.decoder_hidden(self.hf.base_model, packed)[0]
            lengths = packed.cu_seqlens.diff()
            return hidden, packed.input_ids[0], response_mask.flatten()[kept], rows.repeat_interleave(lengths)
        hidden = self.hf.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]
        width = input_ids.shape[1]
        return (hidden.flatten(0, 1), input_ids.flatten(), response_mask.flatten(),
                rows.repeat_interleave(width))

    def _projection_matches(self) -> bool:
        head = self.hf.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            return False
        ids = torch.arange(1, 9, device=head.weight.device)[None] % head.weight.shape[0]
        mask, response = torch.ones_like(ids), torch.ones_like(ids)
        was_training = self.hf.training
        self.hf.eval()  # dropout off: the two forwards must see the same function
        with torch.no_grad():
            theirs = _logits_logps(self.hf, ids, mask, response)[0]
            hidden = self.hf.base_model(input_ids=ids, attention_mask=mask, use_cache=False)[0][0, :-1]
            ours = token_logps(hidden, head, ids[0, 1:]).sum()
        self.hf.train(was_training)
        return bool((ours - theirs).abs().max() <= 1e-4 * (1 + theirs.abs().max()))


# --- the reference cache ----------------------------------------------------------------------


def reference_logps(model, sequences: dict[str, Encoded], pad_id: int, *, cache=None,
                    model_hash: str = "", template: str = "", max_tokens: int = 4096,
                    device: torch.device | str = "cpu", progress: bool = False) -> tuple[dict, int]:
    """(logp, n_tokens) per sequence key under `model`, from `cache` where present.

    `cache` is anything with `ref_logps(model_hash, template, keys) -> {key: (logp, n)}` and
    `put_ref_logps(model_hash, template, [(key, logp, n)])` (an open annotation Store is one), or
    None for no cache.

    Missing keys are computed under inference mode, longest first so padding stays low, in
    batches of at most `max_tokens` padded tokens (memory follows tokens, not sequences), and
    written back. Returns the mapping and how many sequences had to be computed.
    """
    cached = cache.ref_logps(model_hash, template, list(sequences)) if cache is not None else {}
    missing = sorted((k for k in sequences if k not in cached), key=lambda k: -len(sequences[k].ids))
    computed = _compute_logps(model, sequences, missing, pad_id, max_tokens, device, progress)
    if cache is not None and computed:
        cache.put_ref_logps(model_hash, template, [(k, lp, n) for k, (lp, n) in computed.items()])
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
