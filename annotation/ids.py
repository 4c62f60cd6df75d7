"""Content-derived ids: the same text is one row however often it arrives.

`content_id(*parts)` is the first 24 hex characters of sha256 over the parts joined by the unit
separator 0x1f; in SQL (set-based ingest) the same value is
`left(sha256(concat_ws(chr(31), part1, part2, ...)), 24)`. A prompt's id hashes its text, or the
canonical JSON of its messages; a response's id hashes its prompt's id and its text.

    >>> prompt_id("What is 2+2?") == content_id("What is 2+2?")
    True
    >>> response_id(prompt_id("hi"), "x") == response_id(prompt_id("hi"), "y")
    False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

ID_SEPARATOR = "\x1f"


def content_id(*parts: str) -> str:
    """24 hex characters of sha256 over the parts joined by the unit separator (0x1f)."""
    return hashlib.sha256(ID_SEPARATOR.join(parts).encode("utf-8")).hexdigest()[:24]


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def prompt_id(prompt: str | Sequence[dict]) -> str:
    """Id of a prompt given as text or as a list of {"role", "content"} messages."""
    return content_id(prompt if isinstance(prompt, str) else canonical_json(list(prompt)))


def response_id(prompt_key: str, text: str) -> str:
    return content_id(prompt_key, text)


def render_messages(messages: Sequence[dict]) -> str:
    """Plain-text rendering of a conversation, used as prompts.text when no chat template applies."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
