"""`bradley models prepare|list|register`: ready base models offline, the models a store holds, and
registering a model folder that training left unregistered (trained on another machine, or the
store was locked when the run ended).

    $ bradley --server http://127.0.0.1:8000 models register models/rm-3f2a9c1b7e44
    {"id": "rm-3f2a9c1b7e44", "path": "/home/me/models/rm-3f2a9c1b7e44", "registered": true}

A folder is registered as training registers it: its train_config.json is the row's config and its
metrics.json the metrics, after checking that the weights still hash to what metrics.json recorded.
Registering the same folder again is a no-op (`"registered": false`).
"""

from __future__ import annotations

import json
from pathlib import Path

from service.remote.stores import is_remote, open_store


def add(sub) -> None:
    p = sub.add_parser("models", help="prepare a base model offline, list or register models")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    prep = actions.add_parser("prepare", help="print the folder of a ready base model: tiny | "
                              "minilm | smollm2")
    prep.add_argument("name", choices=["tiny", "minilm", "smollm2"])
    prep.add_argument("--out", default=None, help="folder to write it to (default: a cache folder)")
    actions.add_parser("list", help="models registered in the store, one JSON object a line")
    reg = actions.add_parser("register", help="register a model folder that `bradley train` wrote "
                             "(trained elsewhere, or left unregistered)")
    reg.add_argument("folder", metavar="FOLDER")


def run(args) -> int:
    if args.action == "list":
        with open_store(args, read_only=True) as store:
            for row in store.models():
                print(json.dumps(row, default=str), flush=True)
        return 0
    if args.action == "register":
        print(json.dumps(register_folder(args, args.folder)), flush=True)
        return 0
    from rm.model import prepare

    print(prepare.prepare(args.name, out=args.out), flush=True)
    return 0


def folder_record(folder: str) -> tuple[Path, dict, dict]:
    """(resolved folder, train_config.json, metrics.json) of a model folder, its weights checked
    against the sha256 metrics.json recorded."""
    from rm.model.reward_model import METRICS, TRAIN_CONFIG, read_json
    from rm.model.weights import check_weights, weights_sha256

    path = Path(folder).resolve()
    record = read_json(path / TRAIN_CONFIG) if path.is_dir() else {}
    if not record.get("model_id"):
        raise ValueError(f"{folder} is not a model folder `bradley train` wrote (no {TRAIN_CONFIG} "
                         "with a model_id)")
    metrics = read_json(path / METRICS) or {"model_id": record["model_id"],
                                            "snapshot_id": record.get("snapshot_id"),
                                            "weights_sha256": weights_sha256(path)}
    check_weights(path, metrics.get("weights_sha256"), record["model_id"])
    return path, record, {**metrics, "path": str(path)}


def register_folder(args, folder: str, retire=()) -> dict:
    """Register `folder` in the store `args` name (the file, or the server's); what was done."""
    path, record, metrics = folder_record(folder)
    with open_store(args) as store:
        if is_remote(store):
            model_id, new = store.register(str(path), record, metrics, retire)
        else:
            from service.engine.registry import register_record

            model_id, new = register_record(store, str(path), record, metrics, retire)
    return {"id": model_id, "path": str(path), "registered": new}
