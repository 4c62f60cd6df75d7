"""Ensembles and the watch through the app: /score's aggregate, members and disagreement against
each member scored offline, /get_reward's logs, GET /watch and its gauges, members with their own
tokenizer, and the refusals that name `bradley eval`."""

from __future__ import annotations

import shutil

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from rm.model.reference_stats import compute_reference_stats, write_reference_stats
from rm.model.reward_model import RewardModel, build_tiny_reward_model
from service.api.app import create_app
from service.api.settings import load_settings
from service.cli.main import main


@pytest.fixture(scope="module")
def members(tmp_path_factory, tiny_models, hh_items) -> dict[str, str]:
    """rm-tiny-a and rm-tiny-b (one tokenizer) and rm-other (its own), with reference statistics;
    rm-bare without."""
    root = tmp_path_factory.mktemp("ensemble")
    folders = {name: str(shutil.copytree(path, root / name)) for name, path in tiny_models.items()}
    folders["rm-other"] = str(build_tiny_reward_model(
        root / "rm-other", [r for _, r in hh_items], hidden=32, layers=1, vocab_size=300, seed=5))
    for folder in folders.values():
        model = RewardModel.load(folder, device="cpu")
        write_reference_stats(folder, compute_reference_stats(model, hh_items[:120], hh_items[120:],
                                                              rank=8))
    folders["rm-bare"] = str(shutil.copytree(tiny_models["rm-tiny-b"], root / "rm-bare"))
    return folders


def client(tmp_path, models: list[str], **overrides) -> TestClient:
    settings = load_settings(db=str(tmp_path / "e.duckdb"), device="cpu", model=",".join(models),
                             **overrides)
    return TestClient(create_app(settings))


def offline_z(folder: str, prompts: list, responses: list[str]) -> np.ndarray:
    from rm.model.reference_stats import read_reference_stats

    return read_reference_stats(folder).standardise(
        RewardModel.load(folder, device="cpu").score(prompts, responses))


ITEMS = [{"prompt": "How do I bake bread?", "response": "Mix flour, water, salt and yeast."},
         {"prompt": "How do I bake bread?", "response": "I cannot help with that."},
         {"prompt": "Tell me a joke", "response": "Why did the chicken cross the road?"}]
PROMPTS, RESPONSES = [i["prompt"] for i in ITEMS], [i["response"] for i in ITEMS]


@pytest.mark.parametrize("names", [("rm-tiny-a", "rm-tiny-b"), ("rm-tiny-a", "rm-other")])
def test_score_answers_the_aggregate_of_members_standardised_as_each_scores_offline(
        tmp_path, members, names):
    """rm-other has its own tokenizer: it tokenizes its own items and scores as it does alone."""
    folders = [members[n] for n in names]
    z = np.stack([offline_z(f, PROMPTS, RESPONSES) for f in folders])
    with client(tmp_path, folders) as c:
        out = c.post("/score", json={"items": ITEMS}).json()
        assert out["model"] == "+".join(c.app.state.service.current.id.split("+"))
        assert np.array(list(out["members"].values())) == pytest.approx(z, abs=1e-4)
        assert out["scores"] == pytest.approx(z.mean(0), abs=1e-4)
        assert out["disagreement"] == pytest.approx(z.std(0), abs=1e-4)
        worst = c.post("/score", json={"items": ITEMS, "aggregate": "min"}).json()["scores"]
        assert worst == pytest.approx(z.min(0), abs=1e-4)
        flat = c.post("/score", json={"items": ITEMS, "aggregate": "uwo",
                                      "uncertainty_weight": 0}).json()["scores"]
        assert flat == pytest.approx(out["scores"], abs=1e-6)
        bad = c.post("/score", json={"items": ITEMS, "aggregate": "max"})
        assert bad.status_code == 422 and bad.json()["field"] == "aggregate"


def test_the_server_aggregate_and_get_reward_logs(tmp_path, members):
    folders = [members["rm-tiny-a"], members["rm-tiny-b"]]
    z = np.stack([offline_z(f, ["Q "] * 2, ["yes", "no"]) for f in folders])
    with client(tmp_path, folders, ensemble_aggregate="uwo", ensemble_uncertainty_weight=2.0) as c:
        out = c.post("/get_reward", json={"query": ["Q yes", "Q no"], "prompts": ["Q ", "Q "]}).json()
        assert out["rewards"] == pytest.approx(z.mean(0) - 2 * z.std(0), abs=1e-4)
        logs = out["extra_logs"]
        assert logs["disagreement"] == pytest.approx(z.std(0), abs=1e-4)
        assert sorted(k for k in logs if k.startswith("member_")) == ["member_rm-tiny-a",
                                                                      "member_rm-tiny-b"]


def test_the_watch_counts_each_run_and_exports_its_gauges(tmp_path, members):
    with client(tmp_path, [members["rm-tiny-a"], members["rm-tiny-b"]]) as c:
        c.post("/score", json={"items": ITEMS, "run": "ppo-1"})
        c.post("/score", json={"items": ITEMS[:1] * 4}, headers={"X-Bradley-Run": "grpo"})
        watched = c.get("/watch").json()
        assert watched["watching"] and set(watched["models"]) == {"rm-tiny-a", "rm-tiny-b"}
        runs = watched["models"]["rm-tiny-a"]["runs"]
        assert runs["ppo-1"]["current"]["items"] == 3 and runs["grpo"]["current"]["items"] == 4
        assert runs["grpo"]["current"]["duplicate_share"] == 0.75
        assert runs["ppo-1"]["current"]["disagreement"] > 0
        metrics = c.get("/metrics").text
        assert 'bradley_watch_items{model="rm-tiny-b",run="grpo"} 4.0' in metrics
        assert 'bradley_watch_ood_share{model="rm-tiny-a",run="ppo-1"}' in metrics
        assert "history" not in c.get("/watch?history=false").json()["models"]["rm-tiny-a"]["runs"]["grpo"]


def test_one_model_without_statistics_is_served_and_the_watch_says_how_to_get_them(tmp_path, members):
    with client(tmp_path, [members["rm-bare"]]) as c:
        assert c.post("/score", json={"items": ITEMS}).status_code == 200
        watched = c.get("/watch").json()
        assert not watched["watching"] and "--reference-stats" in watched["reason"]
    with client(tmp_path, [members["rm-tiny-a"]], watch="off") as c:
        assert c.get("/watch").json() == {"watching": False, "reason": "BRADLEY_WATCH=off",
                                          "models": {}}


@pytest.mark.parametrize("models,env", [(["rm-tiny-a", "rm-bare"], {}),
                                        (["rm-bare"], {"BRADLEY_WATCH": "on"})])
def test_serve_refuses_a_member_without_statistics_in_one_line(tmp_path, members, capsys,
                                                                monkeypatch, models, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    argv = ["--db", str(tmp_path / "s.duckdb"), "serve", "--device", "cpu", "--port", "1"]
    for name in models:
        argv += ["--model", members[name]]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"`bradley eval {members['rm-bare']} --reference-stats`" in err


def test_bradley_watch_prints_the_table_and_writes_the_page(tmp_path, members, capsys):
    from service.ports import free_port
    from tests.service.conftest import start_live, stop_live

    settings = load_settings(db=str(tmp_path / "w.duckdb"), device="cpu", port=free_port(),
                             model=f"{members['rm-tiny-a']},{members['rm-tiny-b']}",
                             watch_history_interval_s=0.01)
    live = start_live(settings)
    try:
        for _ in range(3):
            httpx.post(f"{live.url}/score", json={"items": ITEMS, "run": "ppo-1"}, timeout=30)
            httpx.get(f"{live.url}/watch", timeout=30)  # a summary into the history each time
        page = tmp_path / "watch.html"
        assert main(["watch", "--server", live.url, "--html", str(page)]) == 0
    finally:
        stop_live(live)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["model", "run", "items"]
    assert {tuple(line.split()[:3]) for line in table[1:]} == {("rm-tiny-a", "ppo-1", "9"),
                                                              ("rm-tiny-b", "ppo-1", "9")}
    html = page.read_text()
    assert "bradley watch" in html and html.count("<img") >= 4  # a chart per signal with history
