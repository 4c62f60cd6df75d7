"""How text becomes token ids: a tiny byte-level BPE for tests, and the one encoding of
(prompt, response) that training, evaluation and serving all share.

A scored sequence is the prompt and the response rendered together, as rm/model/template.py decides:
through the tokenizer's chat template when it has one (user turn + assistant turn), else as a
sentence pair for encoders (`[CLS] prompt [SEP] response [SEP]`) or `prompt \\n\\n response <eos>`
for decoders. Sequences longer than `max_length` lose tokens from the prompt's left (after a
leading special token), so the response, the part being judged, survives; only a response that
alone exceeds the limit is cut at its end. Nothing is dropped.

    >>> from rm.model.tokenizer import truncate_left
    >>> truncate_left([1, 10, 11, 12, 20, 21], n_prompt=4, max_length=4, keep_head=1)
    ([1, 12, 20, 21], 2, True)
"""

from __future__ import annotations

from collections.abc import Sequence

from rm.model.prompt_cache import PromptCache, prompt_key
from rm.model.template import as_messages, as_text, render  # noqa: F401  (re-exported)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def build_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 512, chat_template: bool = True,
                        pad_equals_eos: bool = False):
    """Train a byte-level BPE on `texts` (0.3 s for vocab 512) and wrap it for transformers.

    Specials: <pad> 0, <s> 1 (bos), </s> 2 (eos), <unk> 3. With `pad_equals_eos` the pad token is
    </s>, the setting that breaks scorers which look for the first pad id (transformers#35352).

    >>> tok = build_bpe_tokenizer(["hello world"] * 20, vocab_size=300)
    >>> tok.decode(tok("hello world")["input_ids"])
    'hello world'
    >>> (tok.pad_token_id, tok.eos_token_id)
    (0, 2)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not texts:
        raise ValueError("cannot train a tokenizer on no text; ingest some pairs first")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(list(texts), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="</s>" if pad_equals_eos else "<pad>")
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def truncate_left(ids: list[int], n_prompt: int, max_length: int | None,
                  keep_head: int = 0) -> tuple[list[int], int, bool]:
    """Cut `ids` to `max_length` from the prompt's left, after `keep_head` leading tokens (bos/cls).

    Returns (ids, n_prompt after the cut, truncated?). When the prompt is used up, the response is cut
    at its end (keeping the final token, usually eos/sep, which the score is read at).

    >>> truncate_left([1, 10, 11, 20, 21, 2], n_prompt=3, max_length=4, keep_head=1)
    ([1, 20, 21, 2], 1, True)
    >>> truncate_left([1, 10, 20, 21, 22, 2], n_prompt=2, max_length=4, keep_head=1)
    ([1, 20, 21, 2], 1, True)
    >>> truncate_left([1, 2], n_prompt=1, max_length=8)
    ([1, 2], 1, False)
    """
    excess = len(ids) - max_length if max_length else 0
    if excess <= 0:
        return list(ids), n_prompt, False
    removable = max(n_prompt - keep_head, 0)
    cut = min(excess, removable)
    ids = list(ids[:keep_head]) + list(ids[keep_head + cut:])
    n_prompt -= cut
    if len(ids) > max_length:  # the response alone is too long: keep its head and its last token
        ids = ids[:max_length - 1] + ids[-1:]
    return ids, n_prompt, True


def encode_prompt_response(tokenizer, prompt: str | list[dict], response: str,
                           max_length: int | None = None) -> tuple[list[int], int, bool]:
    """(ids, n_prompt_tokens, truncated) of the scored sequence; the first n_prompt_tokens ids are
    the prompt (with the template's assistant header), the rest the response.

    >>> tok = build_bpe_tokenizer(["user assistant hello there"] * 10, vocab_size=300)
    >>> ids, n_prompt, cut = encode_prompt_response(tok, "hello", "there")
    >>> tok.decode(ids[n_prompt:])
    'there</s>'
    >>> tok.decode(ids[:n_prompt])
    '<|user|>\\nhello</s><|assistant|>\\n'
    """
    if tokenizer.chat_template:
        head, full = render(tokenizer, prompt, response)
        # templates carry their own bos; adding special tokens again would double it
        ids, n_prompt = _prefix_split(tokenizer, head, full, add_special_tokens=False)
    elif tokenizer.sep_token_id is not None and tokenizer.cls_token_id is not None:
        ids = tokenizer(as_text(prompt), response, verbose=False)["input_ids"]
        n_prompt = ids.index(tokenizer.sep_token_id) + 1
    else:
        head, full = render(tokenizer, prompt, response, eos=False)
        ids, n_prompt = _prefix_split(tokenizer, head, full, add_special_tokens=True)
        if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
            ids.append(tokenizer.eos_token_id)
    keep_head = 1 if ids and ids[0] in (tokenizer.bos_token_id, tokenizer.cls_token_id) else 0
    return truncate_left(ids, n_prompt, max_length, keep_head=keep_head)


def encode_many(tokenizer, prompts: Sequence, responses: Sequence[str],
                max_length: int | None = None, cache: PromptCache | None = None) -> list[list[int]]:
    """`encode_prompt_response(...)[0]` of every item, with one fast-tokenizer call for all prompt
    parts and one for all response parts instead of two calls per item (the Rust tokenizer encodes
    a batch with the GIL released; a call's Python overhead is paid once). Same ids, same cuts.
    `cache`: prompt parts and their ids seen before are taken from it, not rendered and tokenized
    again (rm/model/prompt_cache.py), and new ones are added.

    >>> tok = build_bpe_tokenizer(["user assistant hello there"] * 10, vocab_size=300)
    >>> pairs = [("hello", "there"), ([{"role": "user", "content": "hi"}], "")]
    >>> encode_many(tok, *zip(*pairs)) == [encode_prompt_response(tok, p, r)[0] for p, r in pairs]
    True
    """
    if not prompts:
        return []
    chat = bool(tokenizer.chat_template)
    if not chat and tokenizer.sep_token_id is not None and tokenizer.cls_token_id is not None:
        # sentence pairs item by item: a batched pair call reads an empty response as a second
        # segment, a single call as no pair at all, and only the latter is what training saw
        return [encode_prompt_response(tokenizer, p, r, max_length)[0]
                for p, r in zip(prompts, responses, strict=True)]
    if cache is not None and "strftime_now" in str(tokenizer.chat_template):
        cache = None  # the prompt part may change with the date: render it every time
    parts, known, keys = _render_all(tokenizer, prompts, responses, cache)
    heads = _head_ids(tokenizer, keys, parts, known, cache, add_special_tokens=not chat)
    tails = _ids_batch(tokenizer, [f[len(h):] for h, f in parts], add_special_tokens=False)
    splits = [(h + t, len(h)) for h, t in zip(heads, tails, strict=True)]
    if not chat and tokenizer.eos_token_id is not None:
        for ids, _ in splits:
            if not ids or ids[-1] != tokenizer.eos_token_id:
                ids.append(tokenizer.eos_token_id)
    heads_kept = (tokenizer.bos_token_id, tokenizer.cls_token_id)
    return [truncate_left(ids, n, max_length, keep_head=1 if ids and ids[0] in heads_kept else 0)[0]
            for ids, n in splits]


def _render_all(tokenizer, prompts: Sequence, responses: Sequence[str],
                cache: PromptCache | None) -> tuple[list[tuple[str, str]], list, list]:
    """(prompt part, full text) of every item, the cached (part, ids) each used or None, and each
    prompt's cache key (None without a cache): with a cache, a prompt met again in the same call
    (a GRPO group in one request) reuses the part rendered for its first item. A cached part the
    full text does not start with is a miss."""
    keys = [prompt_key(p) for p in prompts] if cache is not None else [None] * len(prompts)
    parts, known, rendered = [], [], {}
    for prompt, response, key in zip(prompts, responses, keys, strict=True):
        entry = cache.lookup(key) if cache is not None else None
        part = render(tokenizer, prompt, response, eos=False,
                      head=entry[0] if entry else rendered.get(key))
        if key is not None:
            rendered.setdefault(key, part[0])
        parts.append(part)
        known.append(entry if entry and entry[0] == part[0] else None)
    return parts, known, keys


def _head_ids(tokenizer, keys: list, parts: list[tuple[str, str]], known: list,
              cache: PromptCache | None, add_special_tokens: bool) -> list[list[int]]:
    """Ids of every prompt part: cached ones as they are, the rest in one tokenizer call, each
    distinct text once (chat templates carry their own bos; the decoder layout takes the
    tokenizer's specials). The lists may be shared between items: callers copy before changing."""
    missing = [i for i, entry in enumerate(known) if entry is None]
    texts = list(dict.fromkeys(parts[i][0] for i in missing))
    by_text = dict(zip(texts, _ids_batch(tokenizer, texts, add_special_tokens) if texts else [],
                       strict=True))
    if cache is not None:
        for i in missing:
            cache.store(keys[i], parts[i][0], by_text[parts[i][0]])
    return [entry[1] if entry else by_text[head] for entry, (head, _) in zip(known, parts, strict=True)]


def _ids_batch(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of many texts: straight from the Rust tokenizer when it is a plain one (no
    truncation or padding configured, which the transformers wrapper would otherwise switch off
    first), without the wrapper's per-item Python (offsets, dicts): the same ids, in less
    time; slow tokenizers go through the wrapper."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return tokenizer(texts, add_special_tokens=add_special_tokens, verbose=False)["input_ids"]
    return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


def _prefix_split(tokenizer, head: str, full: str,
                  add_special_tokens: bool) -> tuple[list[int], int]:
    """Token ids of `full` and how many of them belong to its prefix `head`.

    Tokenizing the two halves separately keeps the boundary exact (BPE merges never cross it),
    and the template decides where special tokens go.
    """
    if not full.startswith(head):
        raise ValueError("the chat template renders the prompt differently with and without the "
                         "response; use a tokenizer whose template appends the assistant turn")
    # verbose=False: over-long texts are expected here, truncate_left cuts them next
    head_ids = tokenizer(head, add_special_tokens=add_special_tokens, verbose=False)["input_ids"]
    tail_ids = tokenizer(full[len(head):], add_special_tokens=False, verbose=False)["input_ids"]
    return head_ids + tail_ids, len(head_ids)
