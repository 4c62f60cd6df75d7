"""Three tiny reward models trained with different seeds from one store of hh-rlhf pairs, served as
an ensemble: the watch sees their disagreement grow and their items leave the training distribution
on responses unlike anything they were trained on, and neither on the held-out validation pairs
(Eisenstein et al. 2023: members agree in distribution and diverge under shift)."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from rm.eval.pairs import validation_split
from rm.model.reference_stats import STATS_JSON
from service.api.app import create_app
from service.api.settings import load_settings
from service.cli.main import main
from tests.service.conftest import HH_FILE

SEEDS = (0, 1, 2)
TRAIN = ["--base-model", "tiny", "--steps", "60", "--max-length", "128", "--batch-size", "16",
         "--device", "cpu"]


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, shared_data):
    """(store path, the three model ids, the validation pairs)."""
    import json

    from annotation.store import Store

    root = tmp_path_factory.mktemp("three")
    db = str(root / "hh.duckdb")
    assert main(["--db", db, "ingest", "--on-error", "skip", str(shared_data / HH_FILE)]) == 0
    ids = []
    for seed in SEEDS:
        out = root / f"rm-seed{seed}"
        assert main(["--db", db, "train", "rm", *TRAIN, "--seed", str(seed), "--out", str(out)]) == 0
        ids.append(json.loads((out / "metrics.json").read_text())["model_id"])
        assert (out / STATS_JSON).is_file()  # written by training
    with Store(db, read_only=True) as store:
        row = store.model(ids[0])
        pairs = store.pairs(row["config"]["snapshot_id"]).to_pylist()
    return db, ids, validation_split(pairs, row["config"].get("val_fraction", 0.1))


def scripts(items: list[tuple[str, str]], seed: int = 0) -> dict[str, list[dict]]:
    """The validation items' prompts with responses in another script, as long as the original:
    random Cyrillic letters, and random emoji (random characters of a block the models never saw)."""
    rnd = random.Random(seed)
    cyrillic = "абвгдежзийклмнопрстуфхцчшщыэюя "
    return {"cyrillic": [{"prompt": p, "response": "".join(rnd.choice(cyrillic) for _ in r)}
                         for p, r in items],
            "emoji": [{"prompt": p, "response": "".join(chr(rnd.randint(0x1F600, 0x1F64F))
                                                        for _ in range(max(1, len(r) // 4)))}
                      for p, r in items]}


@pytest.mark.slow
def test_disagreement_and_ood_share_rise_off_distribution_and_stay_low_on_validation(
        tmp_path, ensemble):
    db, ids, validation = ensemble
    held_out = [(r["prompt"], r[side]) for r in validation for side in ("chosen", "rejected")]
    runs = {"validation": [{"prompt": p, "response": r} for p, r in held_out],
            **scripts(held_out[:200])}
    settings = load_settings(db=db, model=",".join(ids), device="cpu", watch_window=2048)
    with TestClient(create_app(settings)) as c:
        for run, items in runs.items():
            for start in range(0, len(items), 64):
                answer = c.post("/score", json={"items": items[start:start + 64], "run": run})
                assert answer.status_code == 200, answer.text
        watched = c.get("/watch?history=false").json()["models"]
    current = {(model, run): entry["current"] for model, m in watched.items()
               for run, entry in m["runs"].items()}
    for model in ids:
        assert current[model, "validation"]["items"] == len(held_out)
        assert current[model, "validation"]["ood_share"] <= 0.05
        assert current[model, "cyrillic"]["ood_share"] >= 0.5
        assert current[model, "emoji"]["ood_share"] >= 0.5
    disagreement = {run: current[ids[0], run]["disagreement"] for run in runs}
    assert min(disagreement["emoji"], disagreement["cyrillic"]) >= 2 * disagreement["validation"], \
        disagreement
