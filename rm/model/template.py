"""How a (prompt, response) becomes the text a reward model or policy reads: the one place that decides.

Training, evaluation, /score, /get_reward and every trainer adapter reach this module, so a reward
served over HTTP is computed on exactly the text the model was trained on.

- A tokenizer with a chat template: `apply_chat_template(prompt as messages, add_generation_prompt)`
  is the prompt part; the full text renders the response as the assistant turn after it (the template
  adds its own end-of-turn, e.g. `</s>`).
- Without one (decoders): `prompt \\n\\n response <eos>`, where a conversation becomes text as
  `role: content` turns joined by blank lines (`as_text`). Encoders read a sentence pair instead
  (rm/model/tokenizer.py builds that pair from `as_text(prompt)` and the response).

A prompt may also arrive already rendered: OpenRLHF with `--apply_chat_template` sends prompts that
went through the policy's chat template, and queries decoded with `skip_special_tokens=False`, so the
response keeps the policy's end-of-sequence token. `split_query` recognises both and returns a
`Templated` prompt (used as the prompt part verbatim) and the bare response, so nothing is wrapped
twice; what it cannot split honestly it reports as `unsplit` instead of guessing.

    >>> from rm.model.tokenizer import build_bpe_tokenizer
    >>> tok = build_bpe_tokenizer(["user assistant what is 2+2? 4"] * 10, vocab_size=300)
    >>> head, full = render(tok, "What is 2+2?", "4")
    >>> full
    '<|user|>\\nWhat is 2+2?</s><|assistant|>\\n4</s>'
    >>> s = split_query(tok, full, head)         # OpenRLHF: templated prompt, EOS kept
    >>> (str(s.prompt) == head, s.response, s.how)
    (True, '4', 'chat_template')
    >>> split_query(tok, "What is 2+2? 4</s>", "What is 2+2?")[1:]
    (' 4', 'prompt_prefix')
    >>> split_query(tok, "is 2+2? 4", "What is 2+2?")[1:]
    ('is 2+2? 4', 'unsplit')
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

SENTINEL_PROMPT, SENTINEL_RESPONSE = "\ue000", "\ue001"  # private-use characters no text carries
SPLITS = ("prompt_prefix", "chat_template", "template_marker", "unsplit")  # how split_query split


class Templated(str):
    """A prompt already rendered through the model's chat template (with the generation prompt):
    it is the prompt part of the scored text as it stands."""


def as_messages(prompt: str | list[dict]) -> list[dict]:
    """A prompt as a conversation: text becomes one user turn.

    >>> as_messages("hi")
    [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def as_text(prompt: str | list[dict]) -> str:
    """A prompt as plain text, for tokenizers without a chat template.

    >>> as_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    'user: hi\\n\\nassistant: hello'
    """
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def render(tokenizer, prompt, response: str, eos: bool = True,
           head: str | None = None) -> tuple[str, str]:
    """(prompt part, full text) of one scored or trained sequence; `full` starts with the prompt
    part. `eos=False` leaves the decoder layout's final eos to the caller (who appends its id).
    `head`: this prompt's part as an earlier call returned it (rm/model/prompt_cache.py), not rendered again."""
    if getattr(tokenizer, "chat_template", None):
        if isinstance(prompt, Templated):
            head = str(prompt)
            return head, head + response + _markers(tokenizer).turn_end
        messages = as_messages(prompt)
        full = chat_text(tokenizer, messages + [{"role": "assistant", "content": response}])
        if head is None or not full.startswith(head):  # none cached, or a stale one
            head = chat_text(tokenizer, messages, add_generation_prompt=True)
        if not full.startswith(head):
            raise ValueError("the chat template renders the prompt differently with and without the "
                             "response; use a tokenizer whose template appends the assistant turn")
        return head, full
    head = as_text(prompt) + "\n\n" if head is None else head
    return head, head + response + ((tokenizer.eos_token or "") if eos else "")


def chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`, the
    same text. Messages of exactly a text role and a text content (every item /score renders) go
    straight to the template transformers compiled, with the variables apply_chat_template gives
    it: the messages, no tools or documents, the generation flag and the tokenizer's special tokens
    (transformers 5.25, tokenization_utils_base.py `apply_chat_template` and
    utils/chat_template_utils.py `render_jinja_template`). That skips the method's checks and
    copies of inputs that are already plain, the largest Python cost of rendering a /score item. Whether a tokenizer's template renders the same both ways is checked on probe
    conversations first (`_direct`); where it does not, for an empty conversation (which the
    method refuses) and for any other message, the method renders.

    >>> from rm.model.tokenizer import build_bpe_tokenizer
    >>> tok = build_bpe_tokenizer(["hello there"] * 10, vocab_size=300)
    >>> chat_text(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    '<|user|>\\nhi</s><|assistant|>\\n'
    """
    direct = _direct(tokenizer)
    text_only = messages and all(type(m) is dict and m.keys() == _TEXT_MESSAGE
                                 and type(m["role"]) is str and type(m["content"]) is str
                                 for m in messages)
    if direct is not None and text_only:
        return direct(messages, add_generation_prompt)
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


_TEXT_MESSAGE = {"role", "content"}
# Rendered both ways before a template is taken directly: a turn to answer, an answered one and a
# system turn, with and without the generation prompt (a variable the method set differently would
# show in one of them); contents with template syntax, an end-of-turn text, a leading space and a
# newline, which a method that escapes, marks or strips contents before rendering would change.
_PROBES = ([{"role": "user", "content": SENTINEL_PROMPT + " {{ x }} </s>"}],
           [{"role": "user", "content": SENTINEL_PROMPT},
            {"role": "assistant", "content": " " + SENTINEL_RESPONSE + "\n"}],
           [{"role": "system", "content": "be brief"}, {"role": "user", "content": SENTINEL_PROMPT},
            {"role": "assistant", "content": SENTINEL_RESPONSE}])
_DIRECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _direct(tokenizer):
    """The tokenizer's template as a function (messages, add_generation_prompt) -> text, or None
    when it does not render the probes exactly as apply_chat_template does. Kept per tokenizer
    until its template or special tokens change."""
    try:
        template, specials = tokenizer.get_chat_template(), tokenizer.special_tokens_map
    except (AttributeError, ValueError, NotImplementedError):  # no template, or no such method
        return None
    try:
        known = _DIRECT.get(tokenizer)
    except TypeError:  # a tokenizer that cannot be weakly referenced: the method renders
        return None
    if known is None or known[0] != template or known[1] != specials:
        known = (template, specials, _checked(tokenizer, template, specials))
        _DIRECT[tokenizer] = known
    return known[2]


def _checked(tokenizer, template: str, specials: dict):
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        compiled = _compile_jinja_template(template)
    except Exception:  # noqa: BLE001 - another transformers: the method renders, as before
        return None

    def direct(messages: list[dict], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **specials)

    agreed = 0
    for messages, generation in ((m, g) for m in _PROBES for g in (False, True)):
        try:
            expected = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                     add_generation_prompt=generation)
        except Exception:  # noqa: BLE001 - a template that refuses this probe (a system turn)
            continue
        try:
            if direct([dict(m) for m in messages], generation) != expected:
                return None
        except Exception:  # noqa: BLE001 - renders with the method but not directly
            return None
        agreed += 1
    return direct if agreed else None


class _Markers(NamedTuple):
    generation: str  # what add_generation_prompt appends (`<|assistant|>\n`)
    turn_end: str    # what the template puts after an assistant message's content (`</s>`)


_MARKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _markers(tokenizer) -> _Markers:
    """The template's generation prompt and assistant turn end, found by rendering sentinels."""
    if tokenizer not in _MARKERS:
        user = [{"role": "user", "content": SENTINEL_PROMPT}]
        try:
            bare = tokenizer.apply_chat_template(user, tokenize=False)
            head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(
                user + [{"role": "assistant", "content": SENTINEL_RESPONSE}], tokenize=False)
        except Exception:  # a template that refuses this probe: templated prompts go unrecognised
            bare = head = full = ""
        generation = head[len(bare):] if head.startswith(bare) else ""
        turn_end = full.split(SENTINEL_RESPONSE, 1)[1] if SENTINEL_RESPONSE in full else ""
        _MARKERS[tokenizer] = _Markers(generation, turn_end)
    return _MARKERS[tokenizer]


class Split(NamedTuple):
    prompt: str  # a Templated prompt when it already carries the chat template
    response: str
    how: str     # one of SPLITS


def split_query(tokenizer, query: str, prompt: str | None = None) -> Split:
    """Cut an OpenRLHF query (prompt + response as one decoded text) into (prompt, response).

    In order: a prompt that carries the chat template (it ends with the generation prompt) and is a
    prefix of the query is used verbatim (`chat_template`); a plain prompt that is a prefix is cut
    off (`prompt_prefix`); a templated query whose prompt is missing or not its prefix (left-truncated,
    or a tokenizer that does not decode back to the same text) is cut after its last generation
    prompt (`template_marker`). Anything else is `unsplit`: the whole query is the response, with no
    prompt, and the caller must say so. The response loses one trailing end-of-turn or eos text,
    which the template or the tokenizer adds back exactly once.
    """
    generation = _markers(tokenizer).generation if getattr(tokenizer, "chat_template", None) else ""
    if prompt and query.startswith(prompt):
        if generation.strip() and prompt.endswith(generation):
            return Split(Templated(prompt), _strip_end(tokenizer, query[len(prompt):]), "chat_template")
        return Split(prompt, _strip_end(tokenizer, query[len(prompt):]), "prompt_prefix")
    cut = query.rfind(generation) if generation.strip() else -1
    if cut >= 0:
        cut += len(generation)
        return Split(Templated(query[:cut]), _strip_end(tokenizer, query[cut:]), "template_marker")
    return Split("", _strip_end(tokenizer, query), "unsplit")


def _strip_end(tokenizer, response: str) -> str:
    """Drop trailing pad texts, then one end-of-turn (or eos) text, so it is not doubled."""
    pad, eos = tokenizer.pad_token, tokenizer.eos_token
    if pad and pad != eos:
        while response.endswith(pad):
            response = response[:-len(pad)]
    turn_end = _markers(tokenizer).turn_end.rstrip() if getattr(tokenizer, "chat_template", None) else ""
    for end in (turn_end, eos):
        if end and response.endswith(end):
            return response[:-len(end)]
    return response
