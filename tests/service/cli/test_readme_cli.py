"""The manual and the CLI agree, both ways (sqlite-utils keeps its docs honest the same way, with a
test over its `--help` output), on every hand-written page (README.md and docs/*.md; the generated
CLI reference would mention every flag by construction):

- every command and subcommand the parser knows is on a page, and every flag of it on a page that
  names that command;
- every `bradley …` command line shown in code parses, and every `--flag` in a `bradley …` inline
  span or synopsis (a ```text block) belongs to the command it follows;
- every `--flag` anywhere on a page is a flag of some `bradley` command, or of another tool the
  page is talking about (OTHER_TOOLS)."""

import argparse
import re
import shlex

import pytest

from service.cli.main import build_parser
from tests.docs.pages import command_lines, gen_ref, hand_pages, inline_code, synopses

PAGES = hand_pages()
ALL_TEXT = "\n".join(PAGES.values())
GEN = gen_ref()
COMMANDS = list(GEN.commands(build_parser()))
# Flags of other programs that pages show, and the program: a flag here that bradley also has is
# still checked as bradley's where it follows `bradley`.
OTHER_TOOLS = {
    "--nproc_per_node": "torchrun", "--remote_rm_url": "OpenRLHF", "--apply_chat_template": "OpenRLHF",
    "--data-binary": "curl", "--no-deps": "pip", "--shm-size": "docker", "--rdzv-*": "torchrun",
    "--items": "bench/verify_load.py", "--keyed": "bench/verify_load.py", "--scale": "bench scripts",
    "--rows": "bench/ingest.py", "--torch-threads": "bench/score_load.py",
    "--abusers": "bench/abuse.py", "--seconds": "bench/abuse.py", "--pairs": "bench/label.py",
    "--serve-only": "bench/gpu/run.sh", "--smoke": "bench/gpu/run.sh", "--strict": "mkdocs build",
    "--from-literal": "kubectl", "--readonly": "a misspelling that the deploy checks catch",
}


def _flag(flag: str) -> re.Pattern:
    return re.compile(re.escape(flag) + r"(?![\w-])")


def _all_flags() -> set[str]:
    parser = build_parser()
    return {"--help"}.union(GEN.flags(parser), *(GEN.flags(sub) for _, sub in COMMANDS))


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_and_flag_is_on_a_page_that_names_the_command(path, parser):
    name = f"bradley {' '.join(path)}"
    pages = [text for text in PAGES.values() if name in text]
    assert pages, f"no page of the manual mentions `{name}`"
    text = "\n".join(pages)
    missing = [flag for flag in GEN.flags(parser) if not _flag(flag).search(text)]
    assert not missing, f"`{name}` flags on no page that names it: {missing}"


def test_the_global_flags_are_documented():
    assert all(_flag(flag).search(ALL_TEXT) for flag in GEN.flags(build_parser()))


LINES = [(page, line) for page, text in PAGES.items() for line in command_lines(text)]


def test_the_manual_shows_command_lines():
    assert len(LINES) >= 30
    assert {page for page, _ in LINES} >= {"README.md", "docs/data.md", "docs/reward-models.md",
                                           "docs/rlaif.md", "docs/label-studio.md"}


@pytest.mark.parametrize("page,line", LINES, ids=[f"{p}: {line[:60]}" for p, line in LINES])
def test_every_command_line_parses(page, line):
    argv = shlex.split(re.sub(r"\"?\$\([^)]*\)\"?", "SUBSTITUTED", line))[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{page}: line does not parse (exit {exc.code}): {line}")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def unknown_flags_in_span(span: str) -> list[str]:
    """Flags in an inline `bradley …` span that the command it names does not take (global flags
    count everywhere before the command).

    >>> unknown_flags_in_span("bradley train rm --soft-labels")
    []
    >>> unknown_flags_in_span("bradley eval --nope")
    ['--nope']
    """
    root = parser = build_parser()
    unknown = []
    for word in span.split()[1:]:
        flag = word.split("=")[0]
        if word in _subparsers(parser):
            parser = _subparsers(parser)[word]
        elif flag.startswith("--") and flag not in ["--help", *GEN.flags(parser), *GEN.flags(root)]:
            unknown.append(flag)
    return unknown


SPANS = [(page, span) for page, text in PAGES.items()
         for span in inline_code(text) + [re.sub(r"[][|]", " ", s) for s in synopses(text)]
         if span.startswith("bradley ")]


def test_pages_name_commands_inline():
    assert len(SPANS) >= 30


@pytest.mark.parametrize("page,span", SPANS, ids=[f"{p}: {s[:60]}" for p, s in SPANS])
def test_every_flag_in_an_inline_command_belongs_to_it(page, span):
    assert unknown_flags_in_span(span) == [], f"{page}: `{span}`"


def test_every_flag_on_a_page_exists():
    known = _all_flags() | set(OTHER_TOOLS)
    unknown = {(page, flag) for page, text in PAGES.items()
               for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*(?:\*)?", text)
               if flag not in known}
    assert not unknown, ("flags that no bradley command takes (or name the tool in OTHER_TOOLS): "
                         f"{sorted(unknown)}")
