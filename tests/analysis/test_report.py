"""The report: its keys and snapshot, the HTML page, --fail-on, the CLI edge, planted cycles, MT-Bench."""

import base64
import io
import json
import sys
from html.parser import HTMLParser

import numpy as np
import pyarrow as pa
import pytest

from analysis import cycles, report
from annotation.ingest.batch import ingest_file
from annotation.simulate import SimulationConfig, load_into
from annotation.store import Store
from service.cli import main as cli

KEYS = {"n_judgments", "n_prompts", "snapshot_id", "length_bias", "agreement", "cycles", "verdict"}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "sim.duckdb"
    with Store(path) as store:
        truth = load_into(store, SimulationConfig(prompts=150, raters=6, seed=4))
        built = report.build_report(store)
    return path, truth, built


def test_report_has_the_contract_keys_and_records_its_snapshot(simulated):
    path, truth, built = simulated
    assert KEYS <= set(built)
    assert built["n_judgments"] == truth["n_judgments"] and built["n_prompts"] == 150
    for section, names in {"length_bias": ["p_longer_wins"],
                           "agreement": ["pairwise_with_ties", "pairwise_without_ties",
                                         "krippendorff_alpha", "human_ai", "position_consistency"],
                           "cycles": ["n_triads", "n_cyclic_triads", "entropy_floor", "bt_floor",
                                      "gap"]}.items():
        assert set(names) <= set(built[section]), section
    with Store(path, read_only=True) as store:
        assert store.verdict_arrays(built["snapshot_id"]).num_rows == truth["n_judgments"]
    json.dumps(built)  # JSON-ready as it is


def test_summary_names_the_verdict_and_the_figures(simulated):
    text = report.summary_text(simulated[2])
    assert simulated[2]["verdict"]["headline"] in text
    assert "p_longer_wins" in text and "Krippendorff" in text and "entropy floor" in text


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections, self.images, self.external = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append((attrs.get("alt"), attrs.get("src", "")))
        if tag in ("script", "link") or (tag == "img" and not attrs.get("src", "").startswith("data:")):
            self.external.append(tag)


def test_html_is_one_self_contained_page_with_every_section(simulated):
    page = _Page()
    page.feed(report.render_html(simulated[2]))
    assert page.sections == ["verdict", "length-bias", "agreement", "cycles", "floors"]
    alts = {alt for alt, _ in page.images}
    assert {"win rate against length difference", "agreement matrix of raters",
            "per-rater agreement", "loss floors beside ln 2"} <= alts
    for _, src in page.images:
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.external == []


def test_fail_on_rules():
    built = {"length_bias": {"p_longer_wins": 0.7}, "agreement": {"krippendorff_alpha": None},
             "cycles": {"gap": 0.01}}
    assert report.check_fail_on(built, "length_bias>0.65,alpha<0.2,gap>0.05") == [
        "length_bias = 0.7 > 0.65 (length_bias.p_longer_wins)"]
    assert report.check_fail_on(built, "cycles.gap>=0.01") == ["cycles.gap = 0.01 >= 0.01 (cycles.gap)"]
    for bad in ("length_bias", "length_bias>>1", "alpha<abc", ""):
        with pytest.raises(ValueError, match="fail-on"):
            report.check_fail_on(built, bad)
    with pytest.raises(ValueError, match="no 'cycles.nothing'"):
        report.check_fail_on(built, "cycles.nothing>1")


def test_cli_report_writes_files_and_exits_3_when_a_rule_is_crossed(simulated, tmp_path, capsys):
    db = str(simulated[0])
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    assert cli.main(["--db", db, "report", "--json", str(out_json), "--html", str(out_html)]) == 0
    assert KEYS <= set(json.loads(out_json.read_text())) and out_html.read_text().startswith("<!DOCTYPE")
    assert "verdict:" in capsys.readouterr().out
    assert cli.main(["--db", db, "report", "--fail-on", "length_bias>0.01"]) == 3
    assert "fail-on: length_bias" in capsys.readouterr().out
    assert cli.main(["--db", db, "report", "--fail-on", "length_bias>0.99,gap>5"]) == 0
    capsys.readouterr()
    assert cli.main(["--db", db, "report", "--fail-on", "alpha=0.2"]) == 1
    assert cli.main(["--db", str(tmp_path / "none.duckdb"), "report"]) == 1
    err = capsys.readouterr().err
    assert "NAME>NUMBER" in err and "no store at" in err and "Traceback" not in err
    assert not (tmp_path / "none.duckdb").exists()


def test_cli_memory_limit_is_handed_to_duckdb_and_a_bad_one_is_refused(simulated, tmp_path, capsys):
    db, out = str(simulated[0]), tmp_path / "r.json"
    assert cli.main(["--db", db, "report", "--memory-limit", "32MB", "--json", str(out)]) == 0
    small = json.loads(out.read_text())
    assert cli.main(["--db", db, "report", "--json", str(out)]) == 0
    default = json.loads(out.read_text())
    assert small == default  # the same data read again: the same snapshot id too
    with Store(db, read_only=True) as store:
        snapshots = len(store.snapshots())
    capsys.readouterr()
    assert cli.main(["--db", db, "report", "--memory-limit", "lots"]) == 1
    assert "should look like 1.5GB" in capsys.readouterr().err
    with Store(db, read_only=True) as store:
        assert len(store.snapshots()) == snapshots  # the refused run recorded none


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only(simulated, monkeypatch, capsys):
    with Store(simulated[0]) as store:
        report.build_report(store, progress=True)  # pytest's stderr is no terminal: no bar
        assert capsys.readouterr().err == ""
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        report.build_report(store, progress=True)
    shown = terminal.getvalue()
    assert "report: prompts" in shown and f"{simulated[1]['n_judgments'] / 1000:.2f}k" in shown


def test_raters_filter_restricts_the_report(simulated):
    path, truth, _ = simulated
    with Store(path) as store:
        built = report.build_report(store, raters="ai")
        with pytest.raises(ValueError, match="widen --raters"):
            report.build_report(store, raters="human:nobody")
    ai = [r for r in truth["raters"] if r.startswith("ai:")]
    assert built["n_judgments"] == sum(truth["raters"][r]["n"] for r in ai)
    assert set(built["length_bias"]["by_rater"]) == set(ai)


def test_planted_cyclic_prompts_are_where_the_cycles_are(store):
    # honest raters only: every planted triad's expected majority goes round
    config = SimulationConfig(prompts=200, raters=8, cycle_rate=0.3, noisy_share=0.0,
                              adversarial_share=0.0, tie_rate=0.0, seed=21)
    truth = load_into(store, config)
    table = store.verdict_arrays()
    planted = np.isin(np.array(table.column("prompt_id").to_pylist()), truth["cyclic_prompts"])
    inside = cycles.analyze(table.filter(pa.array(planted)))
    outside = cycles.analyze(table.filter(pa.array(~planted)))
    share_inside = inside["n_prompts_with_cycles"] / len(truth["cyclic_prompts"])
    share_outside = outside["n_prompts_with_cycles"] / (200 - len(truth["cyclic_prompts"]))
    assert share_inside > 0.5 and share_outside < 0.2
    assert inside["gap"] > outside["gap"]


def test_mtbench_report_for_humans_and_gpt4(shared_data, store):
    ingest_file(store, shared_data / "mtbench_human" / "mtbench_turn1_judgments.jsonl.gz")
    humans = report.build_report(store, raters="human")
    gpt4 = report.build_report(store, raters="ai:gpt-4")
    # 882 human and 620 GPT-4 verdicts, less the self-comparisons (both sides the same text)
    # that verdict_arrays leaves out: 7 and 6
    assert humans["n_judgments"] == 875 and gpt4["n_judgments"] == 614
    # the same figures test_length_bias counts row by row from the file
    assert humans["length_bias"]["p_longer_wins"] == pytest.approx(0.6687, abs=1e-3)
    assert gpt4["length_bias"]["p_longer_wins"] == pytest.approx(0.7429, abs=1e-3)
    both = report.build_report(store)
    assert set(both["agreement"]["human_ai"]) == {"ai:gpt-4"}
    assert both["n_prompts"] == 80


def test_hh_rlhf_harmless_prefers_the_shorter_answer(shared_data, store):
    path = shared_data / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    ingest_file(store, path, on_error="skip")
    lb = report.build_report(store)["length_bias"]
    # raw count over the file's transcripts (same prefix, so the length difference is the answers'):
    # 1,025 of 2,301 rows of different length chose the longer = 0.4455; ingest sets aside 5 rows
    assert lb["p_longer_wins"] == pytest.approx(0.4455, abs=0.003)
    assert lb["p_longer_wins_ci95"][1] < 0.5 and lb["slope_ci95"][1] < 0


def test_verdict_counts_problems_from_the_figures():
    good = {"length_bias": {"p_longer_wins": 0.52, "p_longer_wins_ci95": [0.48, 0.56]},
            "agreement": {"krippendorff_alpha": 0.85, "flagged_raters": []},
            "cycles": {"entropy_floor": 0.3, "bt_floor": 0.31, "gap": 0.01, "n_triads": 10,
                       "n_cyclic_triads": 0, "n_judgments": 30, "n_items": 10}}
    assert report.verdict(good)["headline"] == "Looks usable for training."
    bad = json.loads(json.dumps(good))
    bad["length_bias"].update(p_longer_wins=0.7, p_longer_wins_ci95=[0.65, 0.75])
    bad["agreement"].update(krippendorff_alpha=0.1, flagged_raters=["human:x"])
    bad["cycles"].update(gap=0.2, gap_bootstrap_corrected=0.15, gap_bootstrap_p_value=0.001)
    out = report.verdict(bad)
    # length, alpha, the flagged rater and the gap: one finding each (the count and the
    # list once differed)
    assert out["problems"] == 4 and out["headline"] == "Fix the data first: 4 problems."
    assert "longer answer wins 70%" in out["findings"][0] and "human:x" in out["findings"][2]
    assert out["problem"] == [True, True, True, True]
    # a big plug-in gap that the bootstrap explains as noise is not a problem
    bad["cycles"].update(gap_bootstrap_corrected=0.0, gap_bootstrap_p_value=0.7)
    assert report.verdict(bad)["problems"] == 3


def test_a_snapshot_replays_exactly_what_the_report_read(store):
    load_into(store, SimulationConfig(prompts=20, seed=30))
    first = report.build_report(store)
    load_into(store, SimulationConfig(prompts=20, seed=31))  # new data after the report
    again = report.build_report(store, snapshot_id=first["snapshot_id"])
    assert again["n_judgments"] == first["n_judgments"] == 20 * 6 * 3
    assert again["length_bias"] == first["length_bias"]
    assert report.build_report(store)["n_judgments"] == 2 * 20 * 6 * 3
