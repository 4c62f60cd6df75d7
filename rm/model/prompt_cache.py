"""Token ids of recently seen prompts: a GRPO/RLOO trainer scores n responses per prompt, and each
of them would otherwise render and tokenize the same prompt part again.

What is kept is exactly what `rm.model.tokenizer.encode_many` computes for a prompt: its prompt part (the
chat template with the generation prompt, or `prompt\\n\\n`) and that part's token ids. Both depend
only on the prompt and the tokenizer, and the prompt part is tokenized apart from the response (BPE
merges never cross the boundary), so a cached item gets the ids it gets uncached, bit for bit
(tests/rm/model/test_encode_many.py). A template that reads the clock (`strftime_now`) is not cached, and
a cached part the full text no longer starts with is rendered again. Each model holds its own
cache, so a hot-swapped tokenizer starts empty. Bounded by token ids held (least recently used go
first); thread-safe.

    >>> cache = PromptCache(max_tokens=5)
    >>> cache.put("hi", "<|user|>hi", [1, 2, 3])
    >>> cache.get("hi"), cache.get([{"role": "user", "content": "hi"}])
    (('<|user|>hi', [1, 2, 3]), None)
    >>> cache.put("yo", "<|user|>yo", [4, 5, 6])   # 6 ids > 5: "hi" goes
    >>> cache.get("hi"), len(cache)
    (None, 1)
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

MAX_TOKENS = 262_144  # ~9 MB of Python ints; 2,000 prompts of 130 tokens


def prompt_key(prompt) -> tuple[str, str] | None:
    """A hashable key that tells apart a plain text, a prompt already rendered through the
    template (rm.model.template.Templated, a str subclass) and a conversation of messages whose fields
    are all text, in their order (a template may print a message's fields in the order given).
    None for any other conversation (tool calls, nested values): it is not cached."""
    if isinstance(prompt, str):
        return type(prompt).__name__, str(prompt)
    if isinstance(prompt, list) and all(
            type(m) is dict and all(type(k) is str and type(v) is str for k, v in m.items())
            for m in prompt):
        return "messages", json.dumps(prompt, ensure_ascii=False)
    return None


class PromptCache:
    """prompt -> (prompt part, its token ids), least recently used evicted past `max_tokens` ids."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[str, str], tuple[str, list[int]]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prompt) -> tuple[str, list[int]] | None:
        """(prompt part, ids) or None; the ids list is shared: callers must not change it."""
        return self.lookup(prompt_key(prompt))

    def put(self, prompt, head: str, ids: list[int]) -> None:
        self.store(prompt_key(prompt), head, ids)

    def lookup(self, key: tuple[str, str] | None) -> tuple[str, list[int]] | None:
        """`get` by a `prompt_key` the caller already has."""
        with self._lock:
            entry = self._entries.get(key) if key is not None else None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def store(self, key: tuple[str, str] | None, head: str, ids: list[int]) -> None:
        """`put` by a `prompt_key` the caller already has."""
        if key is None or len(ids) > self.max_tokens:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._tokens += len(ids) - (len(old[1]) if old else 0)
            self._entries[key] = (head, ids)
            while self._tokens > self.max_tokens:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._tokens -= len(dropped)
