"""A model id always means the same weights: training again into a registered
`--out` is refused unless `--overwrite`, which retires the older id, and a model loaded by id
(`serve --model ID`, `eval ID`) is checked against the sha256 registered with it.

On the code before this change the second `train rm` into the same folder exited 0, `models` held
two ids for one folder, and `serve --model <older id>` served the newer weights."""

import json
import shutil
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from annotation.store import Store
from rm.model.weights import weights_sha256
from service.cli import main as cli
from service.ports import free_port
from tests.rm.train.test_train import synthetic_pairs, write_pairs


def _train(db, out, *extra) -> tuple[int, dict]:
    buf = StringIO()
    with redirect_stdout(buf):
        status = cli.main(["--db", db, "train", "rm", "--out", str(out), "--device", "cpu",
                           "--steps", "2", "--max-length", "32", *extra])
    lines = buf.getvalue().strip().splitlines()
    return status, (json.loads(lines[-1]) if lines else {})


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "store.duckdb"
    with Store(path) as store:
        write_pairs(store, synthetic_pairs(24))
    return str(path)


def _models(db) -> dict:
    with Store(db, read_only=True) as store:
        return {row["id"]: row for row in store.models()}


def _serve_refuses(db, model_id, capsys) -> str:
    status = cli.main(["--db", db, "serve", "--port", str(free_port()), "--model", model_id])
    err = capsys.readouterr().err
    assert status == cli.EXIT_ERROR and "Traceback" not in err
    return err


def test_training_into_a_registered_folder_is_refused(db, tmp_path, capsys):
    out = tmp_path / "rm"
    status, first = _train(db, out)
    assert status == 0
    before = weights_sha256(out)
    assert first["weights_sha256"] == before
    status, _ = _train(db, out, "--seed", "1")
    err = capsys.readouterr().err
    assert status == cli.EXIT_ERROR
    assert first["model_id"] in err and "--overwrite" in err
    assert weights_sha256(out) == before  # nothing trained, nothing replaced
    assert list(_models(db)) == [first["model_id"]]
    assert not list(tmp_path.glob(".rm.partial-*"))


def test_overwrite_retires_the_older_id(db, tmp_path, capsys):
    out = tmp_path / "rm"
    _, first = _train(db, out)
    status, second = _train(db, out, "--seed", "1", "--overwrite")
    assert status == 0 and second["model_id"] != first["model_id"]
    rows = _models(db)
    assert rows[first["model_id"]]["config"]["retired_by"] == second["model_id"]
    assert "retired_by" not in rows[second["model_id"]]["config"]
    err = _serve_refuses(db, first["model_id"], capsys)
    assert "retired" in err and second["model_id"] in err
    status, _ = _run_eval(db, second["model_id"])
    assert status == 0


def _run_eval(db, model_id) -> tuple[int, dict]:
    buf = StringIO()
    with redirect_stdout(buf):
        status = cli.main(["--db", db, "eval", model_id, "--device", "cpu"])
    lines = buf.getvalue().strip().splitlines()
    return status, (json.loads(lines[-1]) if lines else {})


def test_loading_by_id_checks_the_weights_hash(db, tmp_path, capsys):
    """Weights changed behind the registry's back (here: another model's file copied over) are
    refused by id, by `serve` and by `eval`; the folder itself still loads as a folder."""
    _, kept = _train(db, tmp_path / "a")
    _, other = _train(db, tmp_path / "b", "--seed", "1")
    assert kept["weights_sha256"] != other["weights_sha256"]
    shutil.copy(tmp_path / "b" / "model.safetensors", tmp_path / "a" / "model.safetensors")
    err = _serve_refuses(db, kept["model_id"], capsys)
    assert kept["model_id"] in err and "sha256" in err and "Traceback" not in err
    status, _ = _run_eval(db, kept["model_id"])
    assert status == cli.EXIT_ERROR and "not the ones registered" in capsys.readouterr().err
    status, by_folder = _run_eval(db, str(tmp_path / "a"))
    assert status == 0 and Path(by_folder["path"]) == tmp_path / "a"
