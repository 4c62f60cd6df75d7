"""The README and the CLI agree, both ways (sqlite-utils keeps its docs honest the same way, with a
test over its `--help` output): every command and flag the parser knows is documented in the README
section about that command, and every `bradley …` command line the README shows parses."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

from service.cli.main import build_parser

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def _sections() -> list[tuple[str, str]]:
    """(heading, body) of each `###` section."""
    parts = re.split(r"^### (.*)$", README, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _commands(parser: argparse.ArgumentParser, path=()):
    """(command path, its parser) for every command and subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"]


def _documented_in(path: tuple) -> str:
    """The text of the sections whose heading names `bradley <command>` (its first word)."""
    bodies = [head + body for head, body in _sections() if f"bradley {path[0]}" in head]
    assert bodies, f"no README section has `bradley {path[0]}` in its heading"
    return "\n".join(bodies)


COMMANDS = list(_commands(build_parser()))


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_and_flag_is_in_its_readme_section(path, parser):
    text = _documented_in(path)
    assert f"bradley {' '.join(path)}" in README, f"`bradley {' '.join(path)}` is not in the README"
    missing = [flag for flag in _flags(parser) if not re.search(re.escape(flag) + r"(?![\w-])", text)]
    assert not missing, f"`bradley {' '.join(path)}` flags missing from its README section: {missing}"


def test_the_global_flags_are_documented():
    assert all(flag in README for flag in _flags(build_parser()))


def _command_lines() -> list[str]:
    """`bradley …` invocations in the README's code (indented blocks and fences), with `$ `, an
    environment prefix and `torchrun … -m service.cli.main` taken off, continuation lines joined, and
    `$(…)` substitutions kept as one argument."""
    lines, code = [], False
    for raw in README.splitlines():
        if raw.lstrip().startswith("```"):
            code = not code
            continue
        if not (code or raw.startswith("    ")):
            continue
        line = re.sub(r"^\s*(\$\s+)?([A-Z_]+=\S+\s+)*", "", raw)
        line = re.sub(r"^torchrun( --\S+ \S+)* -m service\.cli ", "bradley ", line)
        if line.startswith("bradley ") and not line.endswith("…"):
            lines.append(re.sub(r"\s+#.*$", "", line))
    return lines


LINES = _command_lines()


def test_the_readme_shows_command_lines():
    assert len(LINES) >= 15


@pytest.mark.parametrize("line", LINES)
def test_every_readme_command_line_parses(line):
    argv = shlex.split(re.sub(r"\"?\$\([^)]*\)\"?", "SUBSTITUTED", line))[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"README line does not parse (exit {exc.code}): {line}")
