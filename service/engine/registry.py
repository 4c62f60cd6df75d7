"""Model ids and the folders they name: a registered model id always means the same weights.

Training publishes a folder and the edge registers it here with the weights' sha256
(rm/model/weights.py: weights_sha256, recorded in the row's metrics). Three rules keep an id honest:

- training into the `--out` folder of a registered model is refused (`refuse_registered_out`);
  with `--overwrite` it goes ahead, and the older ids are retired (`register_record` marks them
  `config.retired_by`) once the new model is registered;
- loading by id (`serve --model ID`, `POST /models/{id}/load`, `eval ID`) refuses a retired id and
  a folder whose weights no longer hash to what was registered (`check_row`);
- rows registered before hashes were recorded are loaded unchecked.
"""

from __future__ import annotations

from pathlib import Path


def registered_at(store, folder: str | Path) -> list[str]:
    """Ids of live (not retired) models registered with this folder as their path."""
    target = Path(folder).resolve()
    return [row["id"] for row in store.models()
            if Path(row["path"]).resolve() == target and not _retired_by(row)]


def refuse_registered_out(store, out: str | None, overwrite: bool) -> list[str]:
    """The ids a run into `out` would replace: none, or all of them with `overwrite`; otherwise a
    ValueError that names them and the two ways out."""
    if out is None:
        return []  # a new models/<id> folder
    from rm.train.run import check_out_folder

    ids = registered_at(store, check_out_folder(out))
    if ids and not overwrite:
        raise ValueError(f"--out {out} holds registered model {', '.join(ids)}; training into it "
                         "would change what that id serves. Choose another --out, or pass "
                         "--overwrite to replace it (the older id is retired)")
    return ids


def register_record(store, path: str, record: dict, metrics: dict,
                    retire: list[str] = ()) -> tuple[str, bool]:
    """Register the folder at `path` from its train_config.json (`record`) and metrics.json; a run
    beside a server sends both (POST /models). Returns (model id, whether it is new): the same id
    with the same path is already done; the same id with another path is refused."""
    model_id = metrics.get("model_id") or record.get("model_id")
    if not model_id or not record.get("kind"):
        raise ValueError(f"{path} records no model_id or kind; is it a folder `bradley train` wrote?")
    known = {row["id"]: row for row in store.models()}
    if model_id in known:
        if Path(known[model_id]["path"]).resolve() == Path(path).resolve():
            return model_id, False
        raise ValueError(f"model {model_id} is already registered with folder "
                         f"{known[model_id]['path']}, not {path}")
    with store.transaction():
        store.register_model(record["kind"], record.get("base_model", ""), path,
                             metrics.get("snapshot_id"), record, {**metrics, "path": path},
                             model_id=model_id)
        for old in retire:
            store.retire_model(old, model_id)
    return model_id, True


def check_row(row: dict) -> str:
    """The folder of a registered model row, after refusing a retired id or changed weights."""
    from rm.model.weights import check_weights

    by = _retired_by(row)
    if by:
        raise ValueError(f"model {row['id']} was retired: `--overwrite` replaced its folder "
                         f"{row['path']} with model {by}; load {by} instead")
    check_weights(row["path"], (row.get("metrics") or {}).get("weights_sha256"), row["id"])
    return row["path"]


def _retired_by(row: dict) -> str | None:
    return (row.get("config") or {}).get("retired_by")
