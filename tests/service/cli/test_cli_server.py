"""`bradley --server URL ingest`: the CLI sends rows to a running server (the live fixture: a real
uvicorn on 127.0.0.1 that owns the store's writer), with the same checks and results as a direct
ingest into a file."""

from __future__ import annotations

import gzip
import itertools
import json

import duckdb
import pytest

from service.cli.main import main
from service.remote import commands as cli_server
from tests.service.conftest import API_KEY, HH_FILE


def _texts(store_rows) -> set[tuple[str, str, str, str]]:
    """(prompt, response_a, response_b, winner) of every judgment."""
    return {(r["prompt"], r["response_a_text"], r["response_b_text"], r["winner"]) for r in store_rows}


def _live_judgments(live) -> list[dict]:
    return live.service.call_store(lambda: live.service.store.judgments().to_pylist())


def _counts(live) -> dict:
    return live.service.call_store(live.service.store.counts)


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)


@pytest.fixture
def hh_file(tmp_path, shared_data):
    with gzip.open(shared_data / HH_FILE, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, 40)]
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_hh_through_the_server_stores_what_a_direct_ingest_stores(live, keyed, hh_file, tmp_path,
                                                                   capsys):
    direct_db = str(tmp_path / "direct.duckdb")
    assert main(["--db", direct_db, "ingest", str(hh_file)]) == 0
    con = duckdb.connect(direct_db, read_only=True)
    direct = {(p, a, b, w) for p, a, b, w in con.execute(
        "SELECT p.text, ra.text, rb.text, j.winner FROM judgments j JOIN prompts p ON p.id = j.prompt_id "
        "JOIN responses ra ON ra.id = j.response_a JOIN responses rb ON rb.id = j.response_b").fetchall()}
    con.close()
    before = _counts(live)["judgments"]
    assert main(["--server", live.url, "ingest", str(hh_file)]) == 0
    assert "40 rows in 1 upload(s)" in capsys.readouterr().out
    assert _counts(live)["judgments"] - before == len(direct) == 40
    assert direct <= _texts(_live_judgments(live))   # the same prompt split, texts and winners
    # the same command again: the upload is a duplicate, nothing new
    assert main(["--server", live.url, "ingest", str(hh_file)]) == 0
    assert "1 already there" in capsys.readouterr().out
    assert _counts(live)["judgments"] - before == 40


def _trl_file(tmp_path, n: int, tag: str, bad_line: int | None = None):
    rows = [{"prompt": f"cli-server {tag} {i:03d}?", "chosen": f"good {i:03d}",
             "rejected": f"bad {i:03d}"} for i in range(n)]
    if bad_line:
        del rows[bad_line - 1]["rejected"]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_bad_row_sends_nothing_and_is_named_by_file_line_and_field(live, keyed, tmp_path, capsys):
    path = _trl_file(tmp_path, 12, "abort", bad_line=3)
    before = _counts(live)
    assert main(["--server", live.url, "ingest", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3: rejected" in err and f"{path}: nothing sent" in err
    assert _counts(live) == before
    # --on-error skip: the server keeps the good rows and puts the bad one in rejects
    assert main(["--server", live.url, "ingest", str(path), "--on-error", "skip"]) == 0
    assert "11 ok, 1 rejected" in capsys.readouterr().out
    assert _counts(live)["judgments"] - before["judgments"] == 11


def test_a_large_file_goes_as_several_uploads(live, keyed, tmp_path, capsys, monkeypatch):
    # each row is 80 bytes of JSON + a comma: (1500 - 2) // 81 = 18 rows an upload, 6 uploads
    monkeypatch.setattr(cli_server, "UPLOAD_BYTES", 1500)
    path = _trl_file(tmp_path, 100, "large")
    assert len(json.dumps(json.loads(path.read_text().splitlines()[0]))) == 80
    before = _counts(live)["judgments"]
    assert main(["--server", live.url, "ingest", str(path), "--format", "trl"]) == 0
    out = capsys.readouterr().out
    assert "100 rows in 6 upload(s)" in out and "100 ok, 0 rejected" in out
    assert _counts(live)["judgments"] - before == 100


def test_uploads_are_halved_until_they_fit_the_servers_body_limit(live, keyed, tmp_path, capsys):
    # the live server takes bodies of at most 64 KiB; these 400 rows are ~130 KB in one upload
    rows = [{"prompt": f"cli-server halved {i:03d}?", "chosen": "x" * 300, "rejected": f"y {i}"}
            for i in range(400)]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert live.service.settings.max_body_bytes == 64 * 1024 < path.stat().st_size
    before = _counts(live)["judgments"]
    assert main(["--server", live.url, "ingest", str(path)]) == 0
    out = capsys.readouterr().out
    assert "400 rows in 4 upload(s)" in out and "400 ok, 0 rejected" in out   # 413, halved twice
    assert _counts(live)["judgments"] - before == 400


def test_refusals_are_clear_errors(live, tmp_path, capsys, monkeypatch):
    path = _trl_file(tmp_path, 2, "refused")
    monkeypatch.delenv("BRADLEY_API_KEY", raising=False)
    assert main(["--server", live.url, "ingest", str(path)]) == 1
    assert "the server refused it: HTTP 401" in capsys.readouterr().err   # no key
    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)
    assert main(["--server", live.url, "ingest", str(path), "--format", "label-studio"]) == 1
    assert "rows, not label-studio" in capsys.readouterr().err
    assert main(["--server", live.url, "simulate", str(tmp_path / "o")]) == 1  # no store to reach
    assert "--server works with ingest, report" in capsys.readouterr().err
    assert main(["--server", "http://127.0.0.1:9", "ingest", str(path)]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_report_through_the_server(live, keyed, tmp_path, capsys):
    assert main(["--server", live.url, "ingest", str(_trl_file(tmp_path, 5, "report"))]) == 0
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["--server", live.url, "report", "--json", str(out_json), "--html", str(out_html),
                 "--fail-on", "n_judgments>0"]) == 3   # the rule is crossed: exit 3, as locally
    printed = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report["n_judgments"] == _counts(live)["judgments"] > 0
    assert f"{report['n_judgments']:,} judgments" in printed and "fail-on: n_judgments" in printed
    assert "<html" in out_html.read_text()[:500].lower()
    assert main(["--server", live.url, "report", "--snapshot", "no-such-snapshot"]) == 1
    assert "HTTP 404" in capsys.readouterr().err
