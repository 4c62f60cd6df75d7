"""Text transcripts and message lists, converted both ways, so one exported file holds one shape.

The text template is hh-rlhf's, the one text prompts in the store already use: each turn is
`\\n\\n<Speaker>: <content>` with speakers Human (user), Assistant (assistant) and System (system),
and a prompt ends with the empty assistant turn `\\n\\nAssistant:` that the response completes.
A text prompt with no speaker markers is one user turn.

    >>> to_messages("\\n\\nHuman: hi\\n\\nAssistant: hello\\n\\nHuman: 2+2?\\n\\nAssistant:")
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}, {'role': 'user', 'content': '2+2?'}]
    >>> to_text([{"role": "user", "content": "hi"}])
    '\\n\\nHuman: hi\\n\\nAssistant:'
    >>> to_messages("What is 2+2?")
    [{'role': 'user', 'content': 'What is 2+2?'}]
    >>> to_messages("Assistant: I start") is None   # markers, but not a transcript
    True
"""

from __future__ import annotations

import re

SPEAKERS = {"user": "Human", "assistant": "Assistant", "system": "System"}
ROLES = {speaker: role for role, speaker in SPEAKERS.items()}
TURN = re.compile(r"\n\n(Human|Assistant|System):[ ]?")
MARKER = re.compile(r"(^|\n\n)(Human|Assistant|System):")


def to_text(messages: list[dict]) -> str:
    """Messages as an hh transcript ending with the empty assistant turn."""
    turns = "".join(f"\n\n{SPEAKERS.get(m['role'], m['role'].title())}: {m['content']}"
                    for m in messages)
    return turns + "\n\nAssistant:"


def to_messages(text: str) -> list[dict] | None:
    """An hh transcript (or plain text, one user turn) as messages; None when the text carries
    speaker markers but is not a clean transcript (it must start with a turn and end with the empty
    assistant turn), since any reading of it would be a guess."""
    if not MARKER.search(text):
        return [{"role": "user", "content": text}]
    if not text.startswith("\n\n") or not text.endswith("\n\nAssistant:"):
        return None
    parts = TURN.split(text[:-len("\n\nAssistant:")])
    if parts[0]:
        return None
    return [{"role": ROLES[speaker], "content": content.strip()}
            for speaker, content in zip(parts[1::2], parts[2::2], strict=True)]
