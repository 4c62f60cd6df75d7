"""`encode_many` (one tokenizer call per batch, what /score's worker uses) gives exactly the ids of
`encode_prompt_response` item by item, for every layout and with left truncation (issue 20)."""

import pytest

from rm.model import _tiny_tokenizer
from rm.tokenizer import encode_many, encode_prompt_response

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
