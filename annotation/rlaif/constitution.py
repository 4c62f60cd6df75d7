"""RLAIF constitutions and the judge prompts they render. Text only: annotation/rlaif/orders.py plans
both presentation orders and turns a judge's probabilities into judgment rows, the model side is
rm/judge/local.py, and the CLI edge (service/cli/label.py) composes store → comparisons → prompts →
judge → rows → one ingest batch.

A constitution (Bai et al. 2022, *Constitutional AI*, §4) is a TOML file: `name`, `version`, a list of
`[[principles]]` (each a comparison question `text`, optional `weight`, default 1) and a judge prompt
`template` with named slots ({header} {prompt} {first} {second} {principle} {label_first}
{label_second}). The template ends where the judge writes the label of the better response, so a
local judge reads P(label) from one forward (§4.1's soft preference labels). Everything before
{principle} is shared by every principle of one presentation, which lets a judge reuse its KV cache.

    >>> c = load_constitution("helpful")
    >>> c.rater("smollm2"), len(c.principles)  # doctest: +ELLIPSIS
    ('ai:smollm2:helpful@...', 2)
    >>> text = c.render("2+2?", "4", "5", c.principles[0].text)
    >>> text.endswith("The answer is: (")
    True
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

CONSTITUTIONS = Path(__file__).with_name("constitutions")
LABELS = ("A", "B")
SLOTS = {"header", "prompt", "first", "second", "principle", "label_first", "label_second"}
REQUIRED_SLOTS = SLOTS - {"header"}
REQUIRED_FIELDS = ("name", "version", "template", "principles")


class ConstitutionError(ValueError):
    """A constitution file that cannot be used; the message is `FILE:LINE: field: problem`."""


@dataclass(frozen=True)
class Principle:
    text: str
    weight: float = 1.0


@dataclass
class Constitution:
    name: str
    version: str
    template: str
    principles: list[Principle]
    header: str = ""
    path: str = ""
    sha8: str = ""
    labels: tuple[str, str] = LABELS
    extra: dict = field(default_factory=dict)

    def rater(self, model: str, suffix: str = "") -> str:
        """`ai:<model>:<constitution>@<8 hex of the file's sha256>[suffix]`."""
        return f"ai:{model}:{self.name}@{self.sha8}{suffix}"

    def split(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        """(shared prefix, template tail with the {principle} slot still open) for one order."""
        values = self._values(prompt, first, second)
        head, tail = self.template.split("{principle}", 1)
        return head.format(**values), "{principle}" + tail.format(**values)

    def render(self, prompt: str, first: str, second: str, principle: str) -> str:
        """The whole judge prompt for one presentation and one principle."""
        head, tail = self.split(prompt, first, second)
        return head + tail.replace("{principle}", principle)

    def _values(self, prompt, first, second) -> dict:
        return {"header": self.header, "prompt": prompt, "first": first, "second": second,
                "label_first": self.labels[0], "label_second": self.labels[1]}


def load_constitution(spec: str) -> Constitution:
    """A constitution by name (a file in annotation/constitutions/) or path; validated."""
    path = Path(spec)
    if not path.suffix and not path.exists():
        path = CONSTITUTIONS / f"{spec}.toml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in CONSTITUTIONS.glob("*.toml")))
        raise ConstitutionError(f"{spec}:1: constitution: no such file; use a TOML path or one of {names}")
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise ConstitutionError(f"{path}:{line.group(1) if line else 1}: toml: {exc}") from None
    return _validate(path, text, data, hashlib.sha256(raw).hexdigest()[:8])


def _line_of(text: str, key: str, nth: int = 0) -> int:
    """1-based line where `key =` (or `[[key]]`) appears for the nth time; 1 when absent."""
    pattern = re.compile(rf"^[ \t]*(\[\[{re.escape(key)}\]\]|{re.escape(key)}\s*=)", re.M)
    hits = [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]
    return hits[nth] if nth < len(hits) else (hits[-1] if hits else 1)


def _validate(path: Path, text: str, data: dict, sha8: str) -> Constitution:
    def fail(key: str, problem: str, nth: int = 0):
        raise ConstitutionError(f"{path}:{_line_of(text, key.split('.')[0], nth)}: {key}: {problem}")

    for key in REQUIRED_FIELDS:
        if key not in data:
            fail(key, "missing; a constitution needs name, version, template and [[principles]]")
    if not isinstance(data["name"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", data["name"]):
        fail("name", "must be a word of letters, digits, '.', '_' or '-' (it goes into the rater id)")
    principles = data["principles"]
    if not isinstance(principles, list) or not principles:
        fail("principles", "empty; add at least one [[principles]] with a text")
    _check_template(data["template"], fail)
    seen, out = set(), []
    for i, item in enumerate(principles):
        body = item.get("text") if isinstance(item, dict) else None
        if not isinstance(body, str) or not body.strip():
            fail("principles.text", f"principle {i + 1} needs a non-empty text", i)
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            fail("principles.weight", f"principle {i + 1}: weight must be a positive number", i)
        if body.strip() in seen:
            fail("principles.text", f"principle {i + 1} repeats an earlier one", i)
        seen.add(body.strip())
        out.append(Principle(body.strip(), float(weight)))
    return Constitution(str(data["name"]), str(data["version"]), data["template"], out,
                        str(data.get("header", "")), str(path), sha8)


def _check_template(template, fail) -> None:
    if not isinstance(template, str) or not template.strip():
        fail("template", "must be a non-empty string")
    try:
        named = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        fail("template", f"{exc}; write a literal brace as {{{{ or }}}}")
    unknown = sorted(set(named) - SLOTS)
    if unknown:
        fail("template", f"unknown slot {{{unknown[0]}}}; slots are {', '.join(sorted(SLOTS))}")
    missing = sorted(REQUIRED_SLOTS - set(named))
    if missing:
        fail("template", f"lacks the slot {{{missing[0]}}}")
    if named.count("principle") != 1:
        fail("template", "needs {principle} exactly once")
