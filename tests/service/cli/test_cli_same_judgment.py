"""The same judgments through `bradley ingest FILE` and `bradley --server URL ingest FILE` (a real
uvicorn owning the store) are stored once, whichever route came first: real hh-rlhf and MT-Bench
rows from shared/data."""

from __future__ import annotations

import gzip
import itertools
import json

import duckdb
import pytest

from service.cli.main import main
from service.ports import free_port
from tests.service.conftest import API_KEY, start_live, stop_live

HH = "hh-rlhf/harmless-base-test.jsonl.gz"
MTBENCH = "mtbench_human/mtbench_turn1_judgments.jsonl.gz"


def copy_head(shared_data, name: str, n: int, out, packed: bool = False):
    with gzip.open(shared_data / name, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, n))
    opener = gzip.open if packed else open
    with opener(out, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    return str(out)


def judgments(db) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM judgments").fetchone()[0]
    finally:
        con.close()


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Start a server on a store, give it back when the test is done."""
    from service.api.settings import load_settings

    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)
    servers = []

    def start(db):
        settings = load_settings(db=str(db), api_keys=API_KEY, port=free_port(), device="cpu")
        servers.append(start_live(settings))
        return servers[-1]

    yield start
    for live in servers:
        stop_live(live)


def test_a_file_then_the_same_rows_through_the_server_adds_nothing(tmp_path, shared_data, serve, capsys):
    db = tmp_path / "store.duckdb"
    hh_gz = copy_head(shared_data, HH, 150, tmp_path / "hh.jsonl.gz", packed=True)
    hh = copy_head(shared_data, HH, 150, tmp_path / "hh.jsonl")
    assert main(["--db", str(db), "ingest", hh_gz]) == 0
    stored = judgments(db)
    live = serve(db)
    assert main(["--server", live.url, "ingest", hh]) == 0
    assert "150 rows in 1 upload(s)" in capsys.readouterr().out
    assert live.service.call_store(live.service.store.counts)["judgments"] == stored == 150


def test_rows_through_the_server_then_the_file_adds_nothing(tmp_path, shared_data, serve):
    db = tmp_path / "store.duckdb"
    mt = copy_head(shared_data, MTBENCH, 200, tmp_path / "mt.jsonl")
    live = serve(db)
    assert main(["--server", live.url, "ingest", mt]) == 0
    sent = live.service.call_store(live.service.store.counts)["judgments"]
    stop_live(live)
    mt_gz = copy_head(shared_data, MTBENCH, 200, tmp_path / "mt.jsonl.gz", packed=True)
    assert main(["--db", str(db), "ingest", mt_gz]) == 0
    assert judgments(db) == sent > 0
    rows = [json.loads(line) for line in open(mt)]
    assert sent == len({json.dumps(r, sort_keys=True) for r in rows})  # every distinct vote, once


def test_a_utf8_bom_file_through_the_server_stores_what_a_direct_ingest_stores(tmp_path, shared_data, serve):
    rows = [json.loads(line) for line in open(copy_head(shared_data, MTBENCH, 30, tmp_path / "mt.jsonl"))]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    direct = tmp_path / "direct.duckdb"
    assert main(["--db", str(direct), "ingest", str(path)]) == 0
    live = serve(tmp_path / "served.duckdb")
    assert main(["--server", live.url, "ingest", str(path)]) == 0
    served = live.service.call_store(
        lambda: sorted(live.service.store.con.execute("SELECT id FROM judgments").fetchall()))
    con = duckdb.connect(str(direct), read_only=True)
    assert served == sorted(con.execute("SELECT id FROM judgments").fetchall()) and len(served) == 30
