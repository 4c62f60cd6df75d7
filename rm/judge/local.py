"""LLM judges for RLAIF: `prefer(items) -> [P(the response shown first is better) or None]`.

An item is (prompt, first, second, principle). The judge prompt comes from a `template` callable
`(prompt, first, second) -> (shared head, tail with a "{principle}" slot)` that the caller builds
from a constitution (annotation/rlaif/constitution.py), so this module stays text-agnostic.

* `local:PATH|ID` (LocalJudge): a Hugging Face causal LM. The prompt ends where the judge writes the
  label of the better response; P(first) = softmax over the two label tokens' next-token logits,
  p = e^{l_A} / (e^{l_A} + e^{l_B}) (Bai et al. 2022, Constitutional AI §4.1: soft labels from the
  normalised log-probs of the options). One forward per sequence, no generation, no parsing.
  Sequences are batched by length and padded on the tokenizer's side; the label is read at the last
  real token found from the attention mask (rm/model/reward_model.py), so left and right padding agree. With
  `reuse_prefix` the tokens shared by every principle of a presentation (the conversation and both
  responses) run once, and their KV cache is repeated for the batch of principle tails.
* `openai:URL` (rm/judge/openai_server.py): an OpenAI-compatible server; rm/judge/__init__.py picks one by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rm.model.padding import last_token_index, pad_batch

Item = tuple[str, str, str, str]  # (prompt, first, second, principle)
Template = Callable[[str, str, str], tuple[str, str]]


class JudgeError(ValueError):
    """A judge that cannot be used as given; the message names the fix."""


def label_token_ids(tokenizer, context: str, labels: Sequence[str]) -> list[int]:
    """The token each label becomes right after `context` (a rendered judge prompt's end).

    Found by encoding context and context+label and taking the first new token, so a leading-space
    marker (GPT-2's Ġ, SentencePiece's ▁) or a merge with the label is whatever the tokenizer does
    there. The context's own tokens must survive unchanged (no merge across the boundary), and the
    two labels must be distinct tokens; otherwise the template has to end differently.
    """
    base = tokenizer(context, add_special_tokens=True)["input_ids"]
    ids = []
    for label in labels:
        full = tokenizer(context + label, add_special_tokens=True)["input_ids"]
        if full[:len(base)] != base or len(full) <= len(base):
            raise JudgeError(f"the label {label!r} merges with the prompt's last token "
                             f"{tokenizer.decode(base[-1:])!r}; end the template with a separate "
                             "token such as '(' or ': '")
        ids.append(full[len(base)])
    if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
        raise JudgeError(f"labels {list(labels)}: the tokenizer does not know them (unknown token); "
                         "choose labels it has, such as A and B")
    if len(set(ids)) != len(ids):
        raise JudgeError(f"labels {list(labels)} map to the same token; choose other labels")
    return ids


def load_judge_model(name_or_path: str):
    """(AutoModelForCausalLM in eval mode, tokenizer) from a folder or id; safetensors only."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the failure is reported once, below, in one line
    try:
        config = AutoConfig.from_pretrained(name_or_path)
        _check_causal(name_or_path, config)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model, info = AutoModelForCausalLM.from_pretrained(name_or_path, use_safetensors=True,
                                                           output_loading_info=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise JudgeError(f"local:{name_or_path} is not a causal LM judge ({first}); give a folder "
                         "with a causal LM (config.json + safetensors) or run "
                         "`bradley models prepare smollm2`") from None
    finally:
        logging.set_verbosity(verbosity)
    if info.get("missing_keys"):
        raise JudgeError(f"local:{name_or_path} is not a causal LM judge: its weights lack "
                         f"{sorted(info['missing_keys'])[0]} (a freshly initialised head would judge "
                         "at random); give a causal LM such as `bradley models prepare smollm2`")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return model.eval(), tokenizer


def _check_causal(name_or_path: str, config) -> None:
    """A saved config names its architecture: refuse encoders and classifiers early."""
    names = getattr(config, "architectures", None) or []
    if names and not any(n.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                         for n in names):
        raise ValueError(f"its config.json says {names[0]}, not a causal LM")


class LocalJudge:
    """A causal LM read at the label position. `forwards` counts model calls (for the final line)."""

    def __init__(self, path: str, template: Template, labels: Sequence[str] = ("A", "B"),
                 batch_size: int = 8, reuse_prefix: bool = True, device: str = "cpu",
                 model=None, tokenizer=None):
        if model is None:
            model, tokenizer = load_judge_model(path)
        self.model, self.tokenizer = model.to(device), tokenizer
        self.template, self.labels, self.batch_size = template, tuple(labels), batch_size
        self.reuse_prefix, self.device, self.forwards = reuse_prefix, device, 0
        self.name = path
        self._label_ids: list[int] | None = None

    def label_ids(self, example: str) -> list[int]:
        if self._label_ids is None:
            self._label_ids = label_token_ids(self.tokenizer, example, self.labels)
        return self._label_ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def texts(self, items: Sequence[Item]) -> list[str]:
        out = []
        for prompt, first, second, principle in items:
            head, tail = self.template(prompt, first, second)
            out.append(head + tail.replace("{principle}", principle))
        return out

    @torch.inference_mode()
    def prefer(self, items: Sequence[Item]) -> list[float]:
        if not items:
            return []
        if self.reuse_prefix:
            return self._prefer_shared(items)
        return self._prefer_flat([self.encode(t) for t in self.texts(items)],
                                 self.label_ids(self.texts(items[:1])[0]))

    def _prefer_flat(self, encoded: list[list[int]], label_ids: list[int]) -> list[float]:
        """Whole sequences, sorted by length so a batch pads little, padded on the tokenizer's side."""
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        out = [0.0] * len(encoded)
        side = getattr(self.tokenizer, "padding_side", "right") or "right"
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            batch = pad_batch([encoded[i] for i in chunk], self.tokenizer.pad_token_id, side)
            mask = batch["attention_mask"].to(self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
            logits = self.model(input_ids=batch["input_ids"].to(self.device), attention_mask=mask,
                                position_ids=positions).logits
            self.forwards += 1
            at = logits[torch.arange(len(chunk)), last_token_index(mask)]
            for row, i in enumerate(chunk):
                out[i] = _pair_probability(at[row], label_ids)
        return out

    def _prefer_shared(self, items: Sequence[Item]) -> list[float]:
        """Group items by presentation; run the groups' shared heads together (one forward per
        `batch_size` heads), then their tails against copies of that KV cache."""
        groups: dict[tuple[str, str, str], list[int]] = {}
        for i, (prompt, first, second, _) in enumerate(items):
            groups.setdefault((prompt, first, second), []).append(i)
        encoded = {i: self.encode(t) for i, t in enumerate(self.texts(items))}
        label_ids = self.label_ids(self.texts(items[:1])[0])
        if all(len(members) == 1 for members in groups.values()):  # one principle: nothing shared
            return self._prefer_flat([encoded[i] for i in range(len(items))], label_ids)
        plans = []  # (shared length, member indices)
        for members in groups.values():
            full = [encoded[i] for i in members]
            plans.append((min(_common_prefix(full), min(len(f) for f in full) - 1), members))
        plans.sort(key=lambda plan: plan[0])
        out = [0.0] * len(items)
        for start in range(0, len(plans), self.batch_size):
            chunk = plans[start:start + self.batch_size]
            for i, p in self._heads_and_tails(chunk, encoded, label_ids):
                out[i] = p
        return out

    def _heads_and_tails(self, chunk, encoded, label_ids) -> list[tuple[int, float]]:
        heads = pad_batch([encoded[m[0]][:k] for k, m in chunk], self.tokenizer.pad_token_id, "right")
        head_mask = heads["attention_mask"]
        cache = _cache_of(self.model(input_ids=heads["input_ids"].to(self.device),
                                     attention_mask=head_mask.to(self.device), use_cache=True))
        self.forwards += 1
        rows = [(g, i, encoded[i][k:]) for g, (k, members) in enumerate(chunk) for i in members]
        lengths = torch.tensor([k for k, _ in chunk])
        out = []
        for start in range(0, len(rows), 4 * self.batch_size):  # tails are short: larger batches
            part = rows[start:start + 4 * self.batch_size]
            index = torch.tensor([g for g, _, _ in part])
            tails = pad_batch([t for _, _, t in part], self.tokenizer.pad_token_id, "right")
            n, width = tails["input_ids"].shape
            mask = torch.cat([head_mask[index], tails["attention_mask"]], 1)
            positions = lengths[index, None] + torch.arange(width)  # right after each row's head
            logits = self.model(input_ids=tails["input_ids"].to(self.device),
                                attention_mask=mask.to(self.device),
                                position_ids=positions.to(self.device),
                                **{_cache_argument(self.model): _select_cache(cache, index)},
                                use_cache=True).logits
            self.forwards += 1
            at = logits[torch.arange(n), last_token_index(tails["attention_mask"]).to(self.device)]
            out += [(i, _pair_probability(at[row], label_ids)) for row, (_, i, _) in enumerate(part)]
        return out


def _pair_probability(logits: torch.Tensor, label_ids: list[int]) -> float:
    pair = logits[label_ids].double()  # the two-way softmax in float64: p + (1 - p) is exactly 1
    return float(torch.softmax(pair, dim=-1)[0])


def _common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest token prefix every sequence shares.

    >>> _common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]])
    2
    """
    n = min(len(s) for s in seqs)
    for k in range(n):
        token = seqs[0][k]
        if any(s[k] != token for s in seqs):
            return k
    return n


def _cache_argument(model) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; take whichever forward accepts."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _select_cache(cache, index: torch.Tensor):
    """A copy of a KV cache whose batch rows are `index` (rows may repeat); the original stays."""
    import copy

    copied = copy.deepcopy(cache)
    if hasattr(copied, "reorder_cache"):
        copied.reorder_cache(index.to(_cache_device(copied)))
        return copied
    return tuple(tuple(t.index_select(0, index.to(t.device)) for t in layer) for layer in copied)


def _cache_device(cache) -> torch.device:
    layers = getattr(cache, "layers", None)
    if layers:
        return layers[0].keys.device
    return cache.key_cache[0].device


# --- specs ----------------------------------------------------------------------------------
