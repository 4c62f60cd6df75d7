"""`encode_many` (one tokenizer call per batch, what /score's worker uses) gives exactly the ids of
`encode_prompt_response` item by item, for every layout and with left truncation."""

import pytest

from rm.model.reward_model import _tiny_tokenizer
from rm.model.tokenizer import encode_many, encode_prompt_response

TEXTS = ["Human: how do I sort a list in python?", "Assistant: use sorted(xs) or xs.sort()",
         "Human: what is 2+2?", "Assistant: 4, unless you mean something else"] * 10
ITEMS = [("how do I sort a list?", "use sorted()"), ("", "a"), ("what is 2+2? " * 30, "4"),
         ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "hello"),
         ("é ü 漢字 😀", "ok 😀"), ("x", "")]


@pytest.mark.parametrize("arch,template", [("llama", True), ("llama", False), ("gpt2", False),
                                           ("bert", False)])
@pytest.mark.parametrize("max_length", [None, 16])
def test_batched_encoding_equals_item_by_item(arch, template, max_length):
    tok = _tiny_tokenizer(TEXTS, 300, arch, False, template)
    prompts, responses = zip(*ITEMS, strict=True)
    expected = [encode_prompt_response(tok, p, r, max_length)[0] for p, r in ITEMS]
    assert encode_many(tok, prompts, responses, max_length) == expected
    assert encode_many(tok, [], [], max_length) == []


@pytest.mark.parametrize("arch,template", [("llama", True), ("llama", False), ("gpt2", False)])
@pytest.mark.parametrize("max_length", [None, 16])
def test_cached_prompt_parts_give_the_same_ids(arch, template, max_length):
    """GRPO's shape: each prompt with several responses, over two calls (the second takes every
    prompt part from the cache), a prompt twice in one call, a conversation and a prompt already
    rendered through the template; ids equal the uncached ones, and changing what a call returned
    does not change what the next one gets."""
    from rm.model.prompt_cache import PromptCache
    from rm.model.template import Templated, render

    tok = _tiny_tokenizer(TEXTS, 300, arch, False, template)
    items = ITEMS + [(p, r + " again") for p, r in ITEMS]
    if template:
        items.append((Templated(render(tok, "how do I sort a list?", "")[0]), "use sorted()"))
    prompts, responses = zip(*items, strict=True)
    expected = [encode_prompt_response(tok, p, r, max_length)[0] for p, r in items]
    cache = PromptCache()
    first = encode_many(tok, prompts, responses, max_length, cache)
    assert first == expected and cache.hits == 0 and len(cache) == len(ITEMS) + template
    for ids in first:
        ids[:] = [-1] * len(ids)
    assert encode_many(tok, prompts, responses, max_length, cache) == expected
    assert cache.hits == len(items)


def test_a_plain_prompt_and_the_same_text_already_templated_are_cached_apart():
    from rm.model.prompt_cache import PromptCache
    from rm.model.template import Templated

    tok = _tiny_tokenizer(TEXTS, 300, "llama", False, True)
    cache = PromptCache()
    text = "<|user|>\nhi</s><|assistant|>\n"
    plain, templated = encode_many(tok, [text, Templated(text)], ["ok", "ok"], None, cache)
    assert plain != templated  # the plain one is wrapped in the template again
    assert len(cache) == 2


def test_a_stale_cached_prompt_part_is_rendered_again_and_replaced():
    """A cached part the full text does not start with (a template whose output changed) is a
    miss, not an error: the item gets its uncached ids and the entry is put right."""
    from rm.model.prompt_cache import PromptCache

    tok = _tiny_tokenizer(TEXTS, 300, "llama", False, True)
    cache = PromptCache()
    cache.put("hi", "<|user|>\nyesterday</s><|assistant|>\n", [1, 2, 3])
    assert encode_many(tok, ["hi"], ["ok"], None, cache) == [encode_prompt_response(tok, "hi", "ok")[0]]
    assert cache.get("hi")[0] == "<|user|>\nhi</s><|assistant|>\n"


def test_templates_that_read_the_clock_and_unusual_conversations_are_not_cached():
    from rm.model.prompt_cache import PromptCache, prompt_key

    tok = _tiny_tokenizer(TEXTS, 300, "llama", False, True)
    tok.chat_template = "{{ strftime_now('%Y') }}" + tok.chat_template
    cache = PromptCache()
    assert encode_many(tok, ["hi"], ["ok"], None, cache) == [encode_prompt_response(tok, "hi", "ok")[0]]
    assert len(cache) == 0
    # field order is part of what a template may print; nested values (tool calls) are not keyed
    a = [{"role": "user", "content": "hi"}]
    b = [{"content": "hi", "role": "user"}]
    assert prompt_key(a) != prompt_key(b)
    assert prompt_key([{"role": "assistant", "content": "", "tool_calls": [{"x": 1}]}]) is None
    assert prompt_key([{"role": "user", "content": ("hi",)}]) is None


def test_a_group_of_responses_in_one_call_renders_and_tokenizes_its_prompt_once(monkeypatch):
    """A GRPO group sent in one request: 4 responses to one prompt render the prompt part once
    (4 full renders + 1, where each item alone takes 2) and tokenize it once."""
    from rm.model import template
    from rm.model.prompt_cache import PromptCache

    tok = _tiny_tokenizer(TEXTS, 300, "llama", False, True)
    renders, encoded = [], []
    real_render = template.chat_text
    monkeypatch.setattr(template, "chat_text", lambda *a, **k: renders.append(1) or real_render(*a, **k))
    backend = tok.backend_tokenizer
    monkeypatch.setattr(type(tok), "backend_tokenizer", property(lambda self: _Counting(backend, encoded)),
                        raising=False)
    prompts, responses = ["what is 2+2?"] * 4, ["4", "four", "5", ""]
    expected = [encode_prompt_response(tok, "what is 2+2?", r)[0] for r in responses]
    renders.clear()
    assert encode_many(tok, prompts, responses, None, PromptCache()) == expected
    assert len(renders) == 5
    assert [len(texts) for texts in encoded[-2:]] == [1, 4]  # one prompt part, four responses


class _Counting:
    """A Rust tokenizer that records the texts of each encode_batch_fast call."""

    def __init__(self, backend, calls):
        self._backend, self._calls = backend, calls
        self.truncation, self.padding = backend.truncation, backend.padding

    def encode_batch_fast(self, texts, **kwargs):
        self._calls.append(list(texts))
        return self._backend.encode_batch_fast(texts, **kwargs)
