"""The hand-written pages of the manual (README.md and docs/*.md) and what the tests read in them:
fenced code blocks, `bradley …` command lines and inline code. Generated pages (docs/gen_ref.py)
are left out: they mention every flag by construction, so they cannot show that a guide does."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    info: str  # what follows the language on the fence line, e.g. title="Check: …"
    body: str


def hand_pages() -> dict[str, str]:
    """Page name ("README.md", "docs/serving.md", …) -> its text."""
    pages = {"README.md": (ROOT / "README.md").read_text()}
    pages |= {f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}
    return pages


def blocks(text: str) -> list[Block]:
    return [Block(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(text)]


def section(text: str, heading: str) -> str:
    """The text under a `## heading` up to the next heading of that level or higher."""
    start = re.search(rf"^## {re.escape(heading)}\s*$", text, re.M)
    assert start, f"no '## {heading}' section"
    rest = text[start.end():]
    end = re.search(r"^#{1,2} ", rest, re.M)
    return rest[:end.start()] if end else rest


def code_lines(text: str) -> list[str]:
    """Every line of the fenced code blocks and of the indented (4-space) blocks, except ```text
    blocks: those hold synopses (`bradley export --format trl|jsonl … OUT`), see `synopses`."""
    lines = [line for block in blocks(text) if block.lang != "text" for line in block.body.splitlines()]
    prose = FENCE.sub("", text)
    return lines + [line[4:] for line in prose.splitlines() if line.startswith("    ")
                    and not line.lstrip().startswith(("-", "*"))]


def command_lines(text: str) -> list[str]:
    """`bradley …` invocations in a page's code, with `$ `, environment prefixes and
    `torchrun … -m service.cli` taken off, a trailing `&` and comment dropped; lines ending in `…`
    (elided) are left out."""
    found = []
    for raw in code_lines(text):
        line = re.sub(r"^\s*(\$\s+)?([A-Z_]+=\S+\s+)*", "", raw)
        line = re.sub(r"^torchrun( --\S+ \S+)* -m service\.cli ", "bradley ", line)
        line = re.sub(r"\s+#.*$", "", line).rstrip().removesuffix("&").rstrip()
        if line.startswith("bradley ") and not line.endswith("…"):
            found.append(line)
    return found


def synopses(text: str) -> list[str]:
    """`bradley …` lines of ```text blocks: a command's shape, placeholders and choices in it."""
    return [line for block in blocks(text) if block.lang == "text"
            for line in block.body.splitlines() if line.startswith("bradley ")]


def inline_code(text: str) -> list[str]:
    """The inline code spans of a page's prose (fenced blocks left out)."""
    return re.findall(r"`([^`\n]+)`", FENCE.sub("", text))


def gen_ref():
    """docs/gen_ref.py, the MkDocs hook, loaded as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
