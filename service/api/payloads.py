"""Parse and check request bodies before anything reaches the model or the store.

Bodies are treated as hostile: bytes that are not UTF-8, malformed JSON, wrong types, empty lists and
oversized strings are refused with a PayloadError that names the offending field (`items[3].prompt`,
`line 7`, `body`) and says what to send instead. Nothing here logs or echoes a body.

    >>> parse_score({"items": [{"prompt": "2+2?", "response": "4"}], "group_size": 1}, limits=Limits())
    ScoreRequest(prompts=['2+2?'], responses=['4'], group_size=1, advantage='grpo', std_ddof=1, dynamic_sampling=False)
    >>> parse_score({"items": [{"prompt": 7, "response": "4"}]}, limits=Limits())
    Traceback (most recent call last):
    ...
    service.api.payloads.PayloadError: items[0].prompt: must be a string or a list of {"role", "content"} messages, not int
    >>> parse_records(b'{"a": 1}\\n\\n{"a": 2}\\n')
    [{'a': 1}, {'a': 2}]
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import repeat

import orjson

from service.engine.advantages import ADVANTAGES


class PayloadError(ValueError):
    """A request body the service refuses; `field` names where, `status` is the HTTP status."""

    def __init__(self, field: str | None, problem: str, status: int = 422):
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field, self.problem, self.status = field, problem, status


def finite_number(x) -> bool:
    """A number, not a bool, that is a finite float or an int that fits one (JSON allows 1e999 and
    400-digit integers)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Limits:
    """What one scoring request may hold. `max_request_chars` bounds the characters of all its
    prompts and responses together (the tokenizer's work grows with it); `who` says in messages
    which callers the limits apply to."""

    max_items: int = 4096
    max_text_chars: int = 200_000
    max_request_chars: int | None = None
    who: str = ""
    max_get_reward_items: int = 65_536  # OpenRLHF's older client posts a whole rollout batch at once


@dataclass
class ScoreRequest:
    prompts: list
    responses: list[str]
    group_size: int | None = None
    advantage: str = "grpo"
    std_ddof: int = 1
    dynamic_sampling: bool = False


def decode_json(body: bytes):
    """UTF-8 JSON -> Python value; 400 naming the byte or line that breaks it, or the field that holds
    a value no part of the service can use (see `check_values`).

    >>> decode_json(b'{"items": [{"prompt": "\\\\ud800"}]}')
    Traceback (most recent call last):
    ...
    service.api.payloads.PayloadError: items[0].prompt: contains a lone UTF-16 surrogate (\\ud800); send valid Unicode text
    """
    if _DIGIT_RUN not in body.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # the checked path below says where and why
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError("body", f"not valid UTF-8 at byte {exc.start}; send UTF-8 encoded JSON",
                           400) from None
    if not text.strip():
        raise PayloadError("body", "empty; send a JSON object", 400)
    try:
        value, odd = _loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError("body", f"malformed JSON at line {exc.lineno} column {exc.colno}: "
                           f"{exc.msg}", 400) from None
    except RecursionError:
        raise PayloadError("body", "JSON nested too deeply", 400) from None
    return check_values(value) if odd or _SURROGATE_ESCAPE.search(text) else value


# Bodies orjson decodes (in C, much faster than json) to exactly what the checked path returns. orjson
# refuses (JSONDecodeError) lone surrogates, NaN/Infinity, floats that overflow, bad UTF-8, deep
# nesting and malformed JSON, and rounds floats as Python does; those bodies take the checked path,
# so every error message comes from one place. What orjson accepts silently is an integer beyond
# 64 bits (it becomes a float), and such a literal has 19 digits or more: bodies holding a run of 19
# digits anywhere (in a string too) take the checked path. The scan maps digits to "0" and searches
# for nineteen of them (bytes.translate and `in` run in C at memory speed; a regex here cost more
# than decoding).
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_DIGIT_RUN = b"0" * 19
# a lone surrogate can only come from a \uD800-\uDFFF escape: UTF-8 cannot encode one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_INT_DIGITS = 4000  # Python refuses to convert more than 4300 (int_max_str_digits)


@dataclass(frozen=True)
class _Unusable:
    """Stands in, while decoding, for a number no field accepts; `check_values` names its field."""

    problem: str


def _loads(text: str) -> tuple[object, bool]:
    """json.loads whose odd numbers (huge, NaN, Infinity) become `_Unusable` markers instead of
    Python's own errors, which name no field (and, for huge integers, suggest a Python call).
    Returns (value, whether any marker was made)."""
    odd = []

    def unusable(problem: str) -> _Unusable:
        odd.append(problem)
        return _Unusable(problem)

    def integer(digits: str):
        n = len(digits.lstrip("-"))
        return int(digits) if n <= MAX_INT_DIGITS else unusable(
            f"an integer of {n:,} digits; numbers here have at most {MAX_INT_DIGITS}")

    def real(text: str):
        value = float(text)
        return value if math.isfinite(value) else unusable(f"{text[:20]} overflows a 64-bit float")

    def constant(name: str):
        return unusable(f"{name} is not JSON; send a finite number or null")

    value = json.loads(text, parse_int=integer, parse_float=real, parse_constant=constant)
    return value, bool(odd)


def check_values(value, path: str = ""):
    """`value` itself, or PayloadError naming the first field (`items[2].response`), in document
    order, that holds a lone surrogate (Python can hold one, but no tokenizer, store or JSON encoder
    can use it) or an unusable number. Iterative: any nesting json.loads accepted is walked."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            _check_text_encodes(item, where)
        elif isinstance(item, _Unusable):
            raise PayloadError(where or "body", item.problem)
        elif isinstance(item, dict):
            for key in item:
                _check_text_encodes(key, where)
            stack.extend((sub, f"{where}.{key}" if where else str(key))
                         for key, sub in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((item[i], f"{where}[{i}]") for i in reversed(range(len(item))))
    return value


def _check_text_encodes(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(where or "body", f"contains a lone UTF-16 surrogate "
                           f"(\\u{ord(text[exc.start]):04x}); send valid Unicode text") from None


def parse_records(body: bytes) -> list[dict]:
    """An upload body: one JSON object, a JSON list of objects, or JSONL (one object per line)."""
    try:
        value = decode_json(body)
    except PayloadError as exc:
        if exc.field != "body" or "malformed" not in exc.problem:
            raise
        value = _jsonl(body.decode("utf-8"))
    records = value if isinstance(value, list) else [value]
    if not records:
        raise PayloadError("body", "empty list; send at least one record")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise PayloadError(f"[{i}]", f"must be a JSON object, not {_kind(record)}")
    return records


def _jsonl(text: str) -> list:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record, _ = _loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise PayloadError(f"line {number}", f"malformed JSON ({getattr(exc, 'msg', exc)}); "
                               "send a JSON object, a JSON list, or one object per line", 400) from None
        records.append(check_values(record, f"line {number}"))
    return records


def parse_score(value, limits: Limits) -> ScoreRequest:
    """`{"items": [{"prompt": str | messages, "response": str}], "group_size"?, "advantage"?}`."""
    expect_object(value)
    items = value.get("items")
    if not isinstance(items, list) or not items:
        raise PayloadError("items", "must be a non-empty list of {\"prompt\", \"response\"} objects")
    if len(items) > limits.max_items:
        raise PayloadError("items", f"{len(items)} items, limit {limits.max_items}; split the request",
                           413)
    prompts = plain_strings(items, "prompt", limits.max_text_chars)
    responses = plain_strings(items, "response", limits.max_text_chars) if prompts else None
    if responses is None:
        prompts, responses = _each_item(items, limits)
    check_budget(prompts, responses, "items", limits)
    group_size = _group_size(value.get("group_size"), len(items))
    advantage = value.get("advantage", "grpo")
    if not isinstance(advantage, str) or advantage not in ADVANTAGES:
        raise PayloadError("advantage", f"must be one of {sorted(ADVANTAGES)}, not {_kind(advantage)}")
    std_ddof = value.get("std_ddof", 1)
    if std_ddof not in (0, 1) or isinstance(std_ddof, bool):
        raise PayloadError("std_ddof", "must be 0 (population std) or 1 (sample std, as TRL and verl)")
    dynamic_sampling = value.get("dynamic_sampling", False)
    if not isinstance(dynamic_sampling, bool):
        raise PayloadError("dynamic_sampling", "must be true or false")
    return ScoreRequest(prompts, responses, group_size, advantage, std_ddof, dynamic_sampling)


def _each_item(items: list, limits: Limits) -> tuple[list, list[str]]:
    """Prompts and responses checked item by item (messages, long or wrong values: named)."""
    prompts, responses, longest = [], [], limits.max_text_chars
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise PayloadError(f"items[{i}]", f"must be an object, not {_kind(item)}")
        prompt, response = item.get("prompt"), item.get("response")
        # plain strings within the limit pass as they are; field names are built for the rest only
        if type(prompt) is not str or len(prompt) > longest:
            prompt = check_prompt(prompt, f"items[{i}].prompt", limits)
        if type(response) is not str or len(response) > longest:
            response = check_text(response, f"items[{i}].response", limits)
        prompts.append(prompt)
        responses.append(response)
    return prompts, responses


def plain_strings(items: list, key: str, longest: int) -> list[str] | None:
    """`item[key]` of every item when each is an object holding a string of at most `longest`
    characters there (a trainer's usual request), found in passes that run in C: a Python loop
    over a thousand items costs more than cheap verifier checks. None otherwise: a loop
    then finds the item and names the problem.

    >>> plain_strings([{"p": "a"}, {"p": "bc"}], "p", 5), plain_strings([{"p": "a"}, {"p": 7}], "p", 5)
    (['a', 'bc'], None)
    """
    try:
        values = list(map(dict.__getitem__, items, repeat(key)))
    except (TypeError, KeyError):  # an item that is not an object, or has no such key
        return None
    if set(map(type, values)) != {str} or max(map(len, values)) > longest:
        return None
    return values


def text_chars(prompts: list, responses: list[str]) -> int:
    """Characters of every response and prompt (string or the contents of its messages)."""
    return sum(map(len, responses)) + sum(
        len(p) if isinstance(p, str) else sum(len(m["content"]) for m in p) for p in prompts)


def check_budget(prompts: list, responses: list[str], field: str, limits: Limits) -> None:
    """413 when the request's texts hold more characters than `limits.max_request_chars`.

    >>> check_budget(["ab"], ["cde"], "items", Limits(max_request_chars=4, who="callers without a key"))
    Traceback (most recent call last):
    ...
    service.api.payloads.PayloadError: items: 5 characters in all, limit 4 for callers without a key; send fewer or shorter items, or a key
    """
    if limits.max_request_chars is None:
        return
    total = text_chars(prompts, responses)
    if total > limits.max_request_chars:
        who = f" for {limits.who}" if limits.who else ""
        hint = ", or a key" if limits.who else ""
        raise PayloadError(field, f"{total:,} characters in all, limit {limits.max_request_chars:,}"
                           f"{who}; send fewer or shorter items{hint}", 413)


@dataclass
class GetRewardRequest:
    queries: list[str]
    prompts: list[str] | None  # None when the trainer sent none
    labels: list | None        # ground truth, one per query (OpenRLHF's `labels`)
    single: bool               # `query` was a bare string: answer with bare numbers


def parse_get_reward(value, limits: Limits) -> GetRewardRequest:
    """OpenRLHF's remote-RM body `{"query": [...], "prompts"?: [...], "labels"?: [...]}`.

    Each query is prompt + response as one decoded text; the model's template (rm/model/template.py)
    splits it, so only shapes and sizes are checked here. `max_items` is the larger /get_reward cap.
    """
    expect_object(value)
    query, single = value.get("query"), isinstance(value.get("query"), str)
    queries = [query] if single else query
    if not isinstance(queries, list) or not queries:
        raise PayloadError("query", "must be a non-empty list of strings (prompt + response texts)")
    if len(queries) > limits.max_get_reward_items:
        raise PayloadError("query", f"{len(queries)} items, limit {limits.max_get_reward_items} "
                           "(BRADLEY_MAX_GET_REWARD_ITEMS); split the request", 413)
    queries = [check_text(q, f"query[{i}]", limits) for i, q in enumerate(queries)]
    prompts = _parallel(value, "prompts", len(queries), single)
    if prompts is not None:
        prompts = [check_text(p, f"prompts[{i}]", limits) for i, p in enumerate(prompts)]
    check_budget([], queries, "query", limits)  # the queries hold every character tokenized
    return GetRewardRequest(queries, prompts, _parallel(value, "labels", len(queries), single), single)


def _parallel(value: dict, key: str, n: int, single: bool) -> list | None:
    """An optional list as long as `query` (a bare value when `query` was a bare string)."""
    given = value.get(key)
    if given is None:
        return None
    given = [given] if single and not isinstance(given, list) else given
    if not isinstance(given, list) or len(given) != n:
        raise PayloadError(key, f"must be a list as long as query ({n})")
    return given


def check_text(value, field: str, limits: Limits) -> str:
    if not isinstance(value, str):
        raise PayloadError(field, f"must be a string, not {_kind(value)}")
    if len(value) > limits.max_text_chars:
        raise PayloadError(field, f"{len(value)} characters, limit {limits.max_text_chars}", 413)
    return value


def check_prompt(value, field: str, limits: Limits):
    if isinstance(value, str):
        return check_text(value, field, limits)
    if not isinstance(value, list) or not value:
        raise PayloadError(field, "must be a string or a list of {\"role\", \"content\"} messages, "
                           f"not {_kind(value)}")
    for j, message in enumerate(value):
        where = f"{field}[{j}]"
        if not isinstance(message, dict):
            raise PayloadError(where, f"must be a {{\"role\", \"content\"}} object, not {_kind(message)}")
        if message.get("role") not in ("system", "user", "assistant", "tool"):
            raise PayloadError(f"{where}.role", "must be system, user, assistant or tool")
        check_text(message.get("content"), f"{where}.content", limits)
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _group_size(value, n_items: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PayloadError("group_size", "must be a positive integer")
    if n_items % value:
        raise PayloadError("group_size", f"{value} does not divide the {n_items} items; send whole "
                           "groups of consecutive completions of one prompt")
    return value


def expect_object(value) -> None:
    if not isinstance(value, dict):
        raise PayloadError("body", f"must be a JSON object, not {_kind(value)}")


def _kind(value) -> str:
    return {dict: "object", list: "list", str: "string", type(None): "null"}.get(type(value),
                                                                                type(value).__name__)
