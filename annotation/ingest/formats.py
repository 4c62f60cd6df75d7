"""Row formats: turn one input row (a dict) into staged judgment or feedback rows, or say what is wrong.

Formats (DESIGN.md vocabulary): `judgments` (prompt, response_a, response_b, winner, rater, ...),
`trl` (prompt, chosen, rejected; strings or conversational message lists), `hh` (TRL rows with an
implicit prompt: chosen/rejected are whole transcripts), `kto` (prompt, completion, label) and
`label-studio` (a pairwise project's JSON, JSON_MIN or CSV export). `detect_format` picks one from
the columns. A TRL pair becomes one judgment with response_a = chosen and winner = "a".

The hh-rlhf prompt is the shared prefix up to and including the last "\\n\\nAssistant:":

    >>> split_transcripts("\\n\\nHuman: hi\\n\\nAssistant: hello", "\\n\\nHuman: hi\\n\\nAssistant: go away")
    ('\\n\\nHuman: hi\\n\\nAssistant:', 'hello', 'go away')
    >>> rows = normalize("trl", {"prompt": "2+2?", "chosen": "4", "rejected": "5"}, 1)
    >>> rows[0][1]["response_a"], rows[0][1]["winner"], rows[0][1]["rater"]
    ('4', 'a', 'human:anonymous')
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import datetime, timezone

import pyarrow as pa

from annotation.ids import canonical_json, render_messages
from annotation.label_studio import mapping as ls_mapping

ANONYMOUS = "human:anonymous"
RATER_PREFIXES = ("human:", "ai:")
WINNERS = ("a", "b", "tie")
RATER_MAX_CHARS = 200
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
BLANK_RATER = re.compile(r"(?:human:|ai:)?\s*")  # spaces alone (after a prefix) name nobody
STRENGTH_MAX = 10.0  # the largest Bradley-Terry margin a judgment may carry (formats.strength says why)
HH_MARKER = "\n\nAssistant:"

JUDGMENT_SCHEMA = pa.schema([
    ("row", pa.int64()), ("id", pa.string()), ("prompt", pa.string()), ("messages", pa.string()),
    ("response_a", pa.string()), ("response_b", pa.string()), ("model_a", pa.string()),
    ("model_b", pa.string()), ("winner", pa.string()), ("strength", pa.float64()),
    ("rater", pa.string()), ("source", pa.string()), ("created_at", pa.timestamp("us")),
    ("rationale", pa.string()), ("metadata", pa.string())])
FEEDBACK_SCHEMA = pa.schema([
    ("row", pa.int64()), ("id", pa.string()), ("prompt", pa.string()), ("messages", pa.string()),
    ("completion", pa.string()), ("model", pa.string()), ("label", pa.bool_()),
    ("rater", pa.string())])
SCHEMAS = {"judgments": JUDGMENT_SCHEMA, "feedback": FEEDBACK_SCHEMA}

# Columns a format understands; everything else in a row is kept in judgments.metadata.
# model_a / model_b also stay in metadata: they set responses.source_model, but one text can come from
# several models (MT-Bench has such), and the vote should still say which two models it compared.
JUDGMENT_KEYS = {"id", "prompt", "messages", "response_a", "response_b", "winner", "strength", "rater",
                 "source", "created_at", "rationale", "metadata"}
TRL_KEYS = {"id", "prompt", "messages", "chosen", "rejected", "rater", "source", "created_at",
            "strength", "rationale", "metadata"}


class RowError(ValueError):
    """One row is wrong: `field` and what is wrong with it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


# Format detection, first match wins: the columns a format needs.
SIGNATURES: list[tuple[frozenset, str]] = [
    (frozenset({"annotations", "data"}), "label-studio"),
    (frozenset({"annotation_id", "annotator"}), "label-studio"),
    (frozenset({"response_a", "response_b", "winner"}), "judgments"),
    (frozenset({"completion", "label"}), "kto"),
    (frozenset({"prompt", "chosen", "rejected"}), "trl"),
    (frozenset({"chosen", "rejected"}), "hh"),
]


def detect_format(columns) -> str:
    """The row format whose required columns are all present.

    >>> detect_format(["chosen", "rejected"]), detect_format(["prompt", "completion", "label"])
    ('hh', 'kto')
    """
    names = set(columns)
    for needed, fmt in SIGNATURES:
        if needed <= names:
            return fmt
    raise ValueError(f"cannot tell the format from the columns {sorted(names)[:12]}: expected "
                     "prompt/response_a/response_b/winner (judgments), prompt/chosen/rejected (trl), "
                     "chosen/rejected (hh), prompt/completion/label (kto) or a Label Studio export; "
                     "pass --format")


# --- field parsers ----------------------------------------------------------------------------


def text(row: dict, field: str, empty_ok: bool = False) -> str:
    value = row.get(field)
    if value is None or (value == "" and not empty_ok):
        raise RowError(field, "missing or empty")
    if not isinstance(value, str):
        raise RowError(field, f"expected text, got {type(value).__name__}")
    return value


def optional_text(row: dict, field: str) -> str | None:
    """Text, or an integer written as text (ids are often numbers); None when absent or empty.
    Anything else (a list, an object, a boolean) is refused rather than stored as its repr."""
    value = row.get(field)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RowError(field, f"expected text, got {type(value).__name__}")


def messages(value, field: str) -> list[dict]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowError(field, "not a JSON list of messages") from None
    if not isinstance(value, list) or not value:
        raise RowError(field, "expected a non-empty list of {role, content} messages")
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise RowError(field, f"each message needs string 'role' and 'content', got {m!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_fields(row: dict) -> tuple[str, str | None]:
    """(prompt text, canonical messages JSON or None); a `messages` column wins over `prompt`."""
    if row.get("messages") not in (None, ""):
        msgs = messages(row["messages"], "messages")
        return render_messages(msgs), canonical_json(msgs)
    value = row.get("prompt")
    if isinstance(value, list):
        msgs = messages(value, "prompt")
        return render_messages(msgs), canonical_json(msgs)
    return text(row, "prompt"), None


def response(row: dict, field: str) -> str:
    """A response as text, or as a conversational list holding exactly one assistant message."""
    value = row.get(field)
    if isinstance(value, list):
        msgs = messages(value, field)
        if len(msgs) != 1 or msgs[0]["role"] != "assistant":
            raise RowError(field, "a conversational response must be one assistant message")
        return msgs[0]["content"]
    return text(row, field, empty_ok=True)  # a model can answer nothing; the vote still counts


def rater(row: dict, field: str = "rater") -> str:
    """`human:<id>` | `ai:<model>:<constitution>`; a bare id means a human; none means anonymous.
    A rater is text: a number or a list is refused rather than stored as `human:7` or `human:['x']`
    (a number may be a spreadsheet's row index as easily as a user id); so are control characters
    (raters are shown in reports and metrics labels), more than RATER_MAX_CHARS characters, a
    prefix with no id after it, and spaces alone (stored as `human:   ` they would name nobody).

    >>> rater({"rater": "alice"}), rater({})
    ('human:alice', 'human:anonymous')
    >>> rater({"rater": "   "})
    Traceback (most recent call last):
    ...
    annotation.ingest.formats.RowError: rater: '   ' is only spaces; give a rater id such as alice or human:alice, or leave the field empty for an anonymous rater
    >>> try:
    ...     rater({"rater": 7})
    ... except RowError as exc:
    ...     print(exc)
    rater: expected text such as human:alice or ai:model:constitution, got int
    """
    value = row.get(field)
    if value is None or value == "":
        return ANONYMOUS
    if not isinstance(value, str):
        raise RowError(field, "expected text such as human:alice or ai:model:constitution, "
                       f"got {type(value).__name__}")
    if len(value) > RATER_MAX_CHARS or CONTROL_CHARS.search(value) or value in RATER_PREFIXES:
        raise RowError(field, f"{value!r:.60} is not a rater id: at most {RATER_MAX_CHARS} characters, "
                       "no control characters, and an id after human: or ai:")
    if BLANK_RATER.fullmatch(value):
        raise RowError(field, f"{value!r:.60} is only spaces; give a rater id such as alice or "
                       "human:alice, or leave the field empty for an anonymous rater")
    return value if value.startswith(RATER_PREFIXES) else f"human:{value}"


def strength(row: dict) -> float | None:
    """The judgment's Bradley–Terry margin m, in logits: `train rm --margin` asks the reward model for
    r_chosen − r_rejected ≥ m via −log σ(Δr − m) (Llama 2, Touvron et al. 2023, eq. 2). Valid:
    0 ≤ m ≤ STRENGTH_MAX. A negative margin would ask the model to prefer the rejected answer
    (flip the winner instead); σ(10) = 0.99995, so a margin above 10 claims more certainty than a
    vote can hold, and a huge one (1e308) overflows the loss. Llama 2's own margins were 0–3.

    >>> strength({"strength": "2.5"}), strength({"strength": ""})
    (2.5, None)
    >>> try:
    ...     strength({"strength": -5})
    ... except RowError as exc:
    ...     print(exc)
    strength: -5 is outside 0..10 (a Bradley-Terry margin in logits)
    """
    value = row.get("strength")
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise RowError("strength", "expected a number, got a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise RowError("strength", f"expected a number, got {value!r:.40}") from None
    if not math.isfinite(number):
        raise RowError("strength", "must be a finite number")
    if not 0.0 <= number <= STRENGTH_MAX:
        raise RowError("strength", f"{number:.6g} is outside 0..{STRENGTH_MAX:g} "
                       "(a Bradley-Terry margin in logits)")
    return number


def timestamp(row: dict, field: str = "created_at") -> datetime | None:
    """ISO 8601; an offset is converted to UTC (stored without zone)."""
    value = row.get(field)
    if value is None or value == "" or isinstance(value, datetime):
        return value or None
    try:
        stamp = datetime.fromisoformat(str(value))
    except ValueError:
        raise RowError(field, f"expected an ISO 8601 time such as 2024-05-01T12:00:00Z, got {value!r:.40}"
                       ) from None
    return stamp.astimezone(timezone.utc).replace(tzinfo=None) if stamp.tzinfo else stamp


def label(row: dict) -> bool:
    value = row.get("label")
    if isinstance(value, bool):
        return value
    words = {"true": True, "1": True, "false": False, "0": False}
    key = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if key not in words:
        raise RowError("label", f"expected true or false, got {value!r:.40}")
    return words[key]


def metadata(row: dict, known: set) -> str | None:
    """Unknown columns and a `metadata` object (which wins on a clash, so an export reads back as it
    was) as canonical JSON; empty values are dropped."""
    extra = {k: v for k, v in row.items() if k not in known and v is not None and v != ""}
    given = row.get("metadata")
    if isinstance(given, str) and given:
        try:
            given = json.loads(given)
        except json.JSONDecodeError:
            raise RowError("metadata", "not valid JSON") from None
    if isinstance(given, dict):
        extra = {**extra, **given}
    return canonical_json(extra) if extra else None


# --- formats ----------------------------------------------------------------------------------


def judgment(row: dict, fmt: str, a: str, b: str, winner: str, known: set, **given) -> dict:
    prompt, msgs = prompt_fields(row)
    staged = {"id": optional_text(row, "id"), "prompt": prompt, "messages": msgs,
              "response_a": a, "response_b": b, "model_a": optional_text(row, "model_a"),
              "model_b": optional_text(row, "model_b"), "winner": winner,
              "strength": strength(row), "rater": rater(row),
              "source": optional_text(row, "source") or fmt, "created_at": timestamp(row),
              "rationale": optional_text(row, "rationale"), "metadata": metadata(row, known)}
    return {**staged, **given}


def judgment_rows(row: dict, fmt: str) -> list[tuple[str, dict]]:
    winner = row.get("winner")
    if winner is None:
        raise RowError("winner", "missing; expected a, b or tie")
    if winner not in WINNERS:
        raise RowError("winner", f"{winner!r:.40} is not one of a, b, tie")
    a, b = response(row, "response_a"), response(row, "response_b")
    return [("judgments", judgment(row, fmt, a, b, winner, JUDGMENT_KEYS))]


def trl_rows(row: dict, fmt: str) -> list[tuple[str, dict]]:
    if row.get("prompt") in (None, "") and row.get("messages") in (None, ""):
        return hh_rows(row, fmt)
    chosen, rejected = response(row, "chosen"), response(row, "rejected")
    if chosen == rejected:  # a judgment may record a tie of equal texts; a pair claims a preference
        raise RowError("rejected", "same text as chosen, so the row states no preference")
    return [("judgments", judgment(row, fmt, chosen, rejected, "a", TRL_KEYS))]


def hh_rows(row: dict, fmt: str) -> list[tuple[str, dict]]:
    """Implicit prompt: text transcripts (hh-rlhf) or full conversations."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if isinstance(chosen, list) and isinstance(rejected, list):
        prompt, a, b = split_conversations(messages(chosen, "chosen"), messages(rejected, "rejected"))
    else:
        prompt, a, b = split_transcripts(text(row, "chosen"), text(row, "rejected"))
    return trl_rows({**row, "prompt": prompt, "chosen": a, "rejected": b}, fmt)


def split_transcripts(chosen: str, rejected: str) -> tuple[str, str, str]:
    cut = chosen.rfind(HH_MARKER)
    if cut < 0:
        raise RowError("chosen", f"no {HH_MARKER!r} turn, so no prompt can be split off")
    end = cut + len(HH_MARKER)
    if rejected.rfind(HH_MARKER) != cut or rejected[:end] != chosen[:end]:
        raise RowError("rejected", "the transcript differs from chosen before the last assistant "
                       "turn, so there is no shared prompt")
    return chosen[:end], _strip_one_space(chosen[end:]), _strip_one_space(rejected[end:])


def _strip_one_space(s: str) -> str:
    return s[1:] if s.startswith(" ") else s


def split_conversations(chosen: list, rejected: list) -> tuple[list, list, list]:
    if chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        raise RowError("chosen", "a conversation must end with the assistant message being compared")
    if len(chosen) < 2 or chosen[:-1] != rejected[:-1]:
        raise RowError("rejected", "the conversation differs from chosen before the last assistant "
                       "message, so there is no shared prompt")
    return chosen[:-1], [chosen[-1]], [rejected[-1]]


def kto_rows(row: dict, fmt: str) -> list[tuple[str, dict]]:
    prompt, msgs = prompt_fields(row)
    return [("feedback", {"id": optional_text(row, "id"), "prompt": prompt, "messages": msgs,
                          "completion": response(row, "completion"),
                          "model": optional_text(row, "model"), "label": label(row),
                          "rater": rater(row)})]


def label_studio_rows(task: dict, fmt: str) -> list[tuple[str, dict] | RowError]:
    """A task of the JSON export or a webhook (each annotation: one judgment, or n(n-1)/2 for a
    ranking; annotation.label_studio.mapping) or a JSON_MIN / CSV row (one annotation, flattened)."""
    if "annotations" not in task:
        try:
            task = _ls_flat_task(task)
        except RowError as exc:
            return [exc]
    out = []
    for ann in task.get("annotations") or []:
        try:
            mapped = ls_mapping.annotation_rows(task, ann if isinstance(ann, dict) else {})
            for row in mapped:
                out.extend(judgment_rows(row, fmt))
        except ls_mapping.AnnotationError as exc:
            out.append(RowError(exc.field, str(exc).partition(": ")[2]))
        except RowError as exc:
            out.append(RowError(f"annotation[{ann.get('id')}].{exc.field}",
                                str(exc).partition(": ")[2]))
    return out


def _ls_flat_task(row: dict) -> dict:
    """A JSON_MIN / CSV row: the task's data columns plus one annotation, its results flattened to
    one column per control (`comparison`, `verdict`, `rationale`)."""
    result = []
    for name, kind in ls_mapping.CONTROLS.items():
        value = row.get(name)
        if isinstance(value, str) and value and kind != "textarea":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise RowError(name, "not valid JSON") from None
        values = value if isinstance(value, list) else [value] if value not in (None, "") else []
        for v in values:
            result.append({"from_name": name, "type": kind, "value": _ls_flat_value(kind, v)})
    ann = {"completed_by": row.get("annotator"), "id": row.get("annotation_id"),
           "created_at": row.get("created_at"), "updated_at": row.get("updated_at"),
           "result": result}
    return {"id": row.get("id"), "data": row, "annotations": [ann]}


def _ls_flat_value(kind: str, value):
    """JSON_MIN keeps a pairwise value as is, a choice as its text, a text area as its text."""
    if isinstance(value, dict):
        return value
    return {"choices": [value]} if kind == "choices" else {"text": [str(value)]}


FORMATS: dict[str, Callable] = {"judgments": judgment_rows, "trl": trl_rows, "hh": hh_rows,
                                "kto": kto_rows, "label-studio": label_studio_rows}


def normalize(fmt: str, row: dict, row_number: int) -> list[tuple[str, dict] | RowError]:
    """Staged rows (kind, values incl. `row`) for one input row; a RowError where it is wrong."""
    try:
        items = FORMATS[fmt](row, fmt)
    except RowError as exc:
        return [exc]
    return [item if isinstance(item, RowError) else (item[0], {**item[1], "row": row_number})
            for item in items]
