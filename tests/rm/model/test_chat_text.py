"""`rm.model.template.chat_text` renders exactly what transformers' `apply_chat_template` renders, taking
the template directly only where the probes agree (the largest Python cost of rendering a /score
item). Held against transformers' own method, called in every test."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError

from rm.model.reward_model import _tiny_tokenizer
from rm.model.template import _direct, chat_text

TEXTS = ["Human: how do I sort a list in python?", "Assistant: use sorted(xs)"] * 10
# written for these tests, in the shapes real templates take: turn markers around each message
# (ChatML's format), a bos token and a default system turn, trimmed contents and refused roles
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% endif %}")
SYSTEM_DEFAULT = ("{{ bos_token }}{% if messages[0]['role'] != 'system' %}[SYS]helpful[/SYS]"
                  "{% endif %}{% for m in messages %}{% if m['role'] == 'system' %}[SYS]"
                  "{{ m['content'] }}[/SYS]{% elif m['role'] == 'user' %}[U]{{ m['content'] }}"
                  "{% else %}[A]{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}[A]{% endif %}")
TRIMMED_NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                     "{{ raise_exception('no system turns') }}{% endif %}<{{ m['role'] }}>"
                     "{{ m['content'] | trim }}</{{ m['role'] }}>{% endfor %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}")
TEMPLATES = {"bradley": None, "chatml": CHATML, "system_default": SYSTEM_DEFAULT,
             "trimmed_no_system": TRIMMED_NO_SYSTEM}


def tokenizer(template_name: str):
    tok = _tiny_tokenizer(TEXTS, 300, "llama", False, True)
    if TEMPLATES[template_name] is not None:
        tok.chat_template = TEMPLATES[template_name]
    return tok


def method(tok, messages, generation=False):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


TOKENIZERS = {name: tokenizer(name) for name in TEMPLATES}
text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", " padded ", "{{ bos_token }}", "{% if %}", "</s>", "<|im_end|>", "\n\n", "\ue001"])


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_template_is_taken_directly_where_the_probes_agree(name):
    assert _direct(TOKENIZERS[name]) is not None


def test_text_messages_are_rendered_without_the_method_once_it_has_agreed():
    from rm.model.template import render

    tok = tokenizer("chatml")
    expected = render(tok, "hi", "hello")
    tok.apply_chat_template = None  # the probes are done: nothing below may call the method
    assert render(tok, "hi", "hello") == expected
    assert expected[1] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"


def test_an_empty_conversation_is_refused_as_the_method_refuses_it():
    tok = TOKENIZERS["chatml"]
    for render_with in (method, chat_text):
        with pytest.raises(ValueError, match="empty conversation"):
            render_with(tok, [])


@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=60, deadline=None)
@given(prompt=text, response=text, system=st.none() | text, generation=st.booleans())
def test_same_text_as_apply_chat_template(name, prompt, response, system, generation):
    tok = TOKENIZERS[name]
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    if system is not None and name != "trimmed_no_system":
        messages.insert(0, {"role": "system", "content": system})
    for turns in (messages[:-1], messages):
        assert chat_text(tok, turns, generation) == method(tok, turns, generation)


def test_a_template_that_refuses_a_message_still_refuses_it():
    tok = TOKENIZERS["trimmed_no_system"]
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError, match="no system turns"):
        method(tok, messages)
    with pytest.raises(TemplateError, match="no system turns"):
        chat_text(tok, messages)


def test_where_the_method_renders_otherwise_the_method_renders():
    """A transformers that gives the template something else (here: the method's text plus a
    mark) fails the probes, and every text comes from the method."""
    tok = tokenizer("chatml")
    plain = tok.apply_chat_template
    tok.apply_chat_template = lambda *args, **kwargs: plain(*args, **kwargs) + "!"
    messages = [{"role": "user", "content": "hi"}]
    assert _direct(tok) is None
    assert chat_text(tok, messages, True) == plain(messages, tokenize=False,
                                                   add_generation_prompt=True) + "!"


def test_a_changed_template_or_special_token_is_rendered_anew():
    tok = tokenizer("chatml")
    messages = [{"role": "user", "content": "hi"}]
    assert chat_text(tok, messages).startswith("<|im_start|>user")
    tok.chat_template = SYSTEM_DEFAULT
    assert chat_text(tok, messages) == method(tok, messages) == "<s>[SYS]helpful[/SYS][U]hi"
    tok.add_special_tokens({"bos_token": "<start>"})
    assert chat_text(tok, messages) == method(tok, messages) == "<start>[SYS]helpful[/SYS][U]hi"


def test_other_messages_go_through_the_method():
    """A message with more than a text role and content (a name, a list of content parts) is
    rendered by the method, whatever the template does with it."""
    tok = tokenizer("bradley")  # prints a content as it is, a list of parts too
    named = [{"role": "user", "content": "hi", "name": "ann"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    for messages in (named, parts):
        assert chat_text(tok, messages) == method(tok, messages)
    assert "[{'type': 'text', 'text': 'hi'}]" in chat_text(tok, parts)
