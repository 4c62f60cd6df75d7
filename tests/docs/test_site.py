"""The manual builds, and cannot drift from the code: `mkdocs build --strict` (a broken link, a
missing anchor, a page left out of the nav or an error in a generated page fails), the generated
references cover what the code has, and what the hand-written pages name (variables, metrics, files,
pictures) exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, ROOT, hand_pages

PAGES = hand_pages()
README = PAGES["README.md"]


@pytest.fixture(scope="module")
def gen():
    from tests.docs.pages import gen_ref

    return gen_ref()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `make docs` builds it, into a scratch folder."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_with_every_page(site):
    for page in ["index", "getting-started", "trainers", "benchmarks", "reference/cli",
                 "reference/http", "reference/configuration", "reference/python"]:
        assert (site / f"{page}.html").is_file(), page
    assert "RewardModel" in (site / "reference/python.html").read_text()


def test_no_issue_numbers_in_the_readme_the_pages_or_the_site(site):
    texts = {**PAGES, **{str(p): p.read_text() for p in site.rglob("*.html")}}
    found = [name for name, text in texts.items() if re.search(r"\bissue \d", text, re.I)]
    assert found == []


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 200
    assert "make demo" in README and "make test" in README
    picture = re.search(r"!\[[^]]*\]\(([^)]+)\)", README).group(1)
    assert (ROOT / picture).is_file()


def _slug(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(re.sub(r"[`*]", "", heading), "-")


def test_the_readme_links_into_the_manual():
    links = re.findall(r"\]\(([^)#]+\.md)(?:#([\w-]+))?\)", README)
    assert len({path for path, _ in links if path.startswith("docs/")}) >= 12
    for path, anchor in links:
        assert (ROOT / path).is_file(), path
        if anchor:
            headings = re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), re.M)
            assert anchor in map(_slug, headings), f"{path}#{anchor}"


def test_the_getting_started_tour_is_the_readmes():
    from tests.docs.pages import blocks, section

    heading = "A ten-minute tour on real data"
    readme = blocks(section(README, heading))
    assert len(readme) >= 5
    assert blocks(section(PAGES["docs/getting-started.md"], heading)) == readme


def test_the_diagram_is_what_its_script_draws():
    done = subprocess.run([sys.executable, str(DOCS / "diagram.py"), "--stdout"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (DOCS / "img" / "pipeline.svg").read_text()


# --- the generated references cover the code ---------------------------------------------------


def test_the_cli_reference_has_every_command_and_flag(gen):
    from service.cli.main import build_parser

    page = gen.cli_markdown()
    for path, parser in gen.commands(build_parser()):
        assert f"## bradley {' '.join(path)}\n" in page
        assert all(flag in page for flag in gen.flags(parser)), path


def test_the_configuration_reference_has_every_setting_and_default(gen):
    from service.api.settings import Settings

    page = gen.config_markdown()
    for name, field in Settings.model_fields.items():
        row = re.search(rf"^\| `BRADLEY_{name.upper()}` \|.*$", page, re.M)
        assert row, name
        if field.default not in (None, "", ()):
            shown = gen._default(field.default)
            assert f"| {shown} |" in row.group(0), (name, shown)


def test_a_setting_without_a_note_shows_its_comment_and_without_either_fails(gen, monkeypatch):
    monkeypatch.delitem(gen.SETTING_NOTES, "max_queue_items")  # commented in settings.py
    row = re.search(r"^\| `BRADLEY_MAX_QUEUE_ITEMS` \|.*$", gen.config_markdown(), re.M).group(0)
    assert "Beyond this, /score answers 503 (retry later)." in row
    monkeypatch.delitem(gen.SETTING_NOTES, "port")  # no comment there
    with pytest.raises(ValueError, match=r"settings \['port'\] have no note"):
        gen.config_markdown()


def test_the_http_reference_has_every_route(gen):
    page = gen.http_markdown()
    for path, operations in gen.openapi_schema()["paths"].items():
        for method in operations:
            assert f"## {method.upper()} {path}\n" in page
    assert "**Who may call:** a key" in page.split("## POST /judgments")[1]


def test_the_http_reference_shows_the_score_body_fields(gen):
    score = gen.http_markdown().split("## POST /score\n")[1].split("\n## ")[0]
    for field in ("items", "group_size", "prompt", "response", "ground_truth", "scores", "advantages"):
        assert f"`{field}`" in score, field
    get_reward = gen.http_markdown().split("## POST /get_reward\n")[1].split("\n## ")[0]
    assert all(f"`{field}`" in get_reward for field in ("query", "labels", "rewards", "extra_logs"))


def test_the_python_reference_has_every_public_name(gen):
    import rm

    page = gen.python_markdown()
    assert all(f"## rm.{name}\n" in page for name in rm.__all__)


# --- what the pages name exists -----------------------------------------------------------------


def _read_elsewhere(gen) -> set[str]:
    """BRADLEY_* variables the code reads outside the settings class, as the configuration page
    lists them, each checked to occur in the code."""
    code = "\n".join(path.read_text() for folder in ("service", "rm", "annotation")
                     for path in (ROOT / folder).rglob("*.py"))
    listed = {name for name in gen.OTHER_VARIABLES if name.startswith("BRADLEY_")}
    assert all(name in code for name in listed), listed
    return listed


def test_every_bradley_variable_on_a_page_is_a_setting_or_read_elsewhere(gen):
    from service.api.settings import Settings

    compose = (ROOT / "deploy" / "compose.yaml").read_text()  # BRADLEY_MODELS_DIR: its own
    known = ({f"BRADLEY_{name.upper()}" for name in Settings.model_fields} | _read_elsewhere(gen)
             | set(re.findall(r"\$\{(BRADLEY_\w+)", compose)))
    known.add("BRADLEY_MAX_WAIT")  # operations.md: a misspelling the deploy checks catch
    named = {(page, variable) for page, text in PAGES.items()
             for variable in re.findall(r"BRADLEY_[A-Z_]*[A-Z]", text)}
    assert sorted((page, v) for page, v in named if v not in known) == []


# bradley_ names on the pages that are no metric, and where they come from
NOT_METRICS = {"bradley_swapped": "Label Studio task data", "bradley_reward": "TRL's name for the "
               "reward function", "bradley_scored_itemz_total": "operations.md: a misspelt query"}


def test_every_metric_on_a_page_is_exported():
    from service.api.metrics import Metrics

    source = (ROOT / "service" / "api" / "metrics.py").read_text()
    exported = set(re.findall(r'"(bradley_[a-z_]+)"', source))
    exported |= {family.name for family in Metrics().registry.collect()}  # the watch's too
    named = {(page, m) for page, text in PAGES.items()
             for m in re.findall(r"(?<![:\w])bradley_[a-z_]+[a-z]", text)}
    suffixes = ("_total", "_info", "_bucket", "_count", "_sum")
    unknown = [(page, m) for page, m in named if m not in NOT_METRICS and m not in exported
               and not any(m.removesuffix(s) in exported for s in suffixes)]
    assert sorted(unknown) == []


def test_every_recording_rule_on_a_page_is_recorded():
    rules = (ROOT / "deploy" / "prometheus" / "rules.yml").read_text()
    named = {rule for text in PAGES.values()
             for rule in re.findall(r"(?:job|instance):bradley_\w+:\w+", text)}
    assert named and sorted(m for m in named if f"record: {m}" not in rules) == []


REPO_PATH = re.compile(r"(?<![\w.~/-])"
                       r"(?:annotation|analysis|rm|service|deploy|bench|tests|docs)/[\w./-]*\w")


def _ignored(path: str) -> bool:
    """A path .gitignore names (bench/gpu/carry/: made by a script, never committed)."""
    patterns = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return any(fnmatch(path, p) or path.startswith(p + "/") for p in patterns)


def test_every_file_a_page_names_exists():
    named = {(page, path) for page, text in PAGES.items() for path in REPO_PATH.findall(text)}
    missing = sorted((page, path) for page, path in named
                     if not (ROOT / path).exists() and not _ignored(path))
    assert len(named) >= 40 and missing == []


def test_every_picture_on_a_page_is_made_by_a_script():
    pictures = {m for text in PAGES.values() for m in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)}
    names = {Path(p).name for p in pictures}
    assert names == {"pipeline.svg"} | {f"report-{s}.png" for s in
                                        ("verdict", "length-bias", "agreement", "cycles", "floors")}
    assert all((DOCS / "img" / name).is_file() for name in names)


def test_the_report_screenshots_come_from_headless_chromium(tmp_path):
    """docs/screenshots.py, as it made docs/img/report-*.png: each a real picture of its section."""
    from PIL import Image

    done = subprocess.run([sys.executable, str(DOCS / "screenshots.py"), "report",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shots = sorted(tmp_path.glob("report-*.png"))
    assert [p.name for p in shots] == sorted(p.name for p in (DOCS / "img").glob("report-*.png"))
    for shot in shots:
        with Image.open(shot) as image:
            colours = image.convert("L").getextrema()
            assert image.width >= 800 and 100 <= image.height < 2400, shot.name  # cropped to content
            assert colours[0] < 100 < colours[1], shot.name  # dark text on a light page
