"""Every command that reads or writes the store works while `bradley serve` holds it (`--server URL`,
before or after the command): export equals a direct export byte for byte, snapshots are listed,
`train rm` and `train po` train here on rows streamed from the server and register through it,
`eval` takes the validation split from it, `label` posts its verdicts to it, and `models register`
registers a folder trained elsewhere. Against a real uvicorn server on 127.0.0.1 (conftest.py)."""

from __future__ import annotations

import gzip
import itertools
import json
from contextlib import redirect_stdout
from io import StringIO

import httpx
import pytest

from service.api.settings import load_settings
from service.cli.main import main
from tests.service.conftest import API_KEY, HH_FILE, free_port, make_db, start_live, stop_live

KEY = {"Authorization": f"Bearer {API_KEY}"}
TRAIN = ["--base-model", "tiny", "--device", "cpu", "--steps", "2", "--batch-size", "4",
         "--max-length", "64", "--val-fraction", "0.2"]


def _run(argv) -> tuple[int, list[str]]:
    buf = StringIO()
    with redirect_stdout(buf):
        status = main(argv)
    return status, buf.getvalue().strip().splitlines()


@pytest.fixture(scope="module")
def hh_rows(shared_data) -> list[dict]:
    with gzip.open(shared_data / HH_FILE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, 40)]


@pytest.fixture(scope="module")
def held(tmp_path_factory, tiny_models, hh_rows):
    """A store with 40 hh pairs and a snapshot of them, exported directly before `bradley serve`
    took it; then the server, which holds the store for the rest of the module."""
    root = tmp_path_factory.mktemp("held")
    db = make_db(root / "held.duckdb", tiny_models)
    data = root / "hh.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hh_rows))
    assert main(["--db", db, "ingest", str(data)]) == 0
    from annotation.store import Store

    with Store(db) as store:
        snapshot = store.create_snapshot()
    direct = {}
    for fmt in ("trl", "jsonl", "parquet"):
        out = root / f"direct.{fmt}"
        assert main(["--db", db, "export", "--format", fmt, "--snapshot", snapshot, str(out)]) == 0
        direct[fmt] = out.read_bytes()
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, port=free_port(),
                             device="cpu")
    server = start_live(settings)
    server.snapshot, server.direct, server.root = snapshot, direct, root
    yield server
    stop_live(server)


@pytest.fixture(autouse=True)
def keyed(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)


def _models(held) -> dict:
    return {m["id"]: m for m in httpx.get(held.url + "/models", headers=KEY).json()["models"]}


@pytest.mark.parametrize("fmt", ["trl", "jsonl", "parquet"])
def test_export_through_the_server_equals_a_direct_export(held, tmp_path, fmt):
    out = tmp_path / f"served.{fmt}"
    status, _ = _run(["export", "--format", fmt, "--snapshot", held.snapshot, str(out),
                      "--server", held.url])
    assert status == 0 and out.read_bytes() == held.direct[fmt]


def test_the_store_flags_work_before_and_after_the_command(held, tmp_path):
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    assert _run(["--server", held.url, "export", "--format", "jsonl", str(before)])[0] == 0
    assert _run(["--db", "nowhere.duckdb", "export", "--format", "jsonl", str(after),
                 "--server", held.url])[0] == 0
    assert before.read_bytes() == after.read_bytes() == held.direct["jsonl"]


def test_snapshots_through_the_server(held):
    status, lines = _run(["--server", held.url, "snapshots", "--json"])
    assert status == 0 and held.snapshot in {json.loads(line)["id"] for line in lines}


def test_rows_stream_as_arrow_or_parquet_with_their_snapshot(held):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = httpx.get(f"{held.url}/rows/pairs.arrow?snapshot={held.snapshot}", headers=KEY)
    parquet = httpx.get(f"{held.url}/rows/pairs.parquet?snapshot={held.snapshot}", headers=KEY)
    assert arrow.headers["x-bradley-snapshot"] == held.snapshot
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.num_rows == 40 and table.equals(pq.read_table(io.BytesIO(parquet.content)))
    assert httpx.get(f"{held.url}/rows/pairs.arrow?snapshot=nope", headers=KEY).status_code == 404
    assert httpx.get(f"{held.url}/rows/pairs.arrow").status_code == 401


def test_train_rm_beside_the_server_registers_through_it(held, tmp_path):
    status, lines = _run(["--server", held.url, "train", "rm", "--out", str(tmp_path / "rm"), *TRAIN])
    assert status == 0
    metrics = json.loads(lines[-1])
    row = _models(held)[metrics["model_id"]]
    assert row["path"] == str(tmp_path / "rm") and row["snapshot_id"] == metrics["snapshot_id"]
    assert metrics["n_pairs"] == 40
    status, lines = _run(["snapshots", "--json", "--server", held.url])
    snap = {s["id"]: s for s in map(json.loads, lines)}[metrics["snapshot_id"]]
    assert snap["models"] == [metrics["model_id"]]
    # the same model through the server: its validation split comes from the server's store
    assert httpx.post(f"{held.url}/models/{metrics['model_id']}/load", headers=KEY).status_code == 200
    try:
        status, lines = _run(["eval", metrics["model_id"], "--server", held.url])
        result = json.loads(lines[-1])
        assert status == 0 and result["data"] == "validation" and result["n_pairs"] == metrics["n_val"]
    finally:
        httpx.post(f"{held.url}/models/rm-tiny-a/load", headers=KEY)


def test_train_po_beside_the_server_caches_its_reference_pass_there(held, tmp_path):
    argv = ["--server", held.url, "train", "po", "--loss", "dpo", *TRAIN]
    status, lines = _run([*argv, "--out", str(tmp_path / "first")])
    assert status == 0
    first = json.loads(lines[-1])
    assert first["ref_computed"] > 0 and _models(held)[first["model_id"]]["kind"] == "dpo"
    status, lines = _run([*argv, "--out", str(tmp_path / "second")])
    second = json.loads(lines[-1])
    assert status == 0 and second["ref_computed"] == 0 and second["ref_cached"] == first["ref_computed"]


def test_models_register_a_folder_trained_elsewhere(held, tmp_path, tiny_models, hh_rows):
    elsewhere = make_db(tmp_path / "elsewhere.duckdb", tiny_models)
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hh_rows[:20]))
    assert main(["--db", elsewhere, "ingest", str(data)]) == 0
    folder = tmp_path / "trained-elsewhere"
    status, lines = _run(["--db", elsewhere, "train", "rm", "--out", str(folder), *TRAIN])
    model_id = json.loads(lines[-1])["model_id"]
    assert status == 0 and model_id not in _models(held)
    status, lines = _run(["--server", held.url, "models", "register", str(folder)])
    assert status == 0 and json.loads(lines[-1]) == {"id": model_id, "path": str(folder),
                                                     "registered": True}
    assert _models(held)[model_id]["path"] == str(folder)
    status, lines = _run(["models", "register", str(folder), "--server", held.url])
    assert status == 0 and json.loads(lines[-1])["registered"] is False


def test_label_posts_its_verdicts_to_the_server(held, tmp_path):
    from rm.model.reward_model import build_tiny_causal_lm

    judge = build_tiny_causal_lm(tmp_path / "judge", ["Which answer is better? A or B."] * 20,
                                 vocab_size=300, seed=3)
    before = held.service.call_store(held.service.store.counts)["judgments"]
    status, lines = _run(["--server", held.url, "label", "--judge", f"local:{judge}", "--limit", "3",
                          "--max-new-tokens", "4", "--device", "cpu"])
    assert status == 0
    summary = json.loads(lines[-1])
    assert summary["pairs_judged"] == 3 and summary["judgments_written"] == 6
    after = held.service.call_store(held.service.store.counts)["judgments"]
    assert after - before == 6


def test_a_command_without_a_server_path_says_which_have_one(held, capsys):
    assert main(["--server", held.url, "label-studio", "pull"]) == 1
    assert "--server works with ingest, report, export, train rm" in capsys.readouterr().err
