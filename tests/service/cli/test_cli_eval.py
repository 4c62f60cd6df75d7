"""`bradley eval --benchmark`: leaderboard files built from LLMBar and MT-Bench, scored by a tiny
model loaded here and by the same model behind a live `bradley serve` (the same numbers); a model
that scores every response alike gets RewardBench 2's tie credit; bad files give one line."""

from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO

import pytest

from service.cli.eval import ServedScorer
from service.cli.main import main
from service.client import ClientError
from tests.rm.eval.benchmark_files import (
    rewardbench2_rows,
    rewardbench_rows,
    write_jsonl,
    write_parquet,
)
from tests.service.conftest import API_KEY


def _run(argv) -> tuple[int, dict]:
    buf = StringIO()
    with redirect_stdout(buf):
        status = main(argv)
    out = buf.getvalue().strip().splitlines()
    return status, (json.loads(out[-1]) if out else {})


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)


@pytest.fixture(scope="module")
def files(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("benchmarks")
    return {"rewardbench": write_parquet(rewardbench_rows(shared_data), root / "rb.parquet"),
            "rewardbench2": write_jsonl(rewardbench2_rows(shared_data), root / "rb2.jsonl")}


def _scores(out: dict) -> dict:
    return {name: entry["score"] for name, entry in out["per_subset"].items()}


@pytest.mark.parametrize("benchmark", ["rewardbench", "rewardbench2"])
def test_local_and_served_model_give_the_same_scores(benchmark, files, tiny_models, live, keyed,
                                                      tmp_path, capsys):
    data = str(files[benchmark])
    status, local = _run(["eval", tiny_models["rm-tiny-a"], "--data", data, "--benchmark", benchmark,
                          "--device", "cpu", "--html", str(tmp_path / "local.html")])
    assert status == 0 and local["model_id"] == "rm-tiny-a" and local["benchmark"] == benchmark
    table = capsys.readouterr().err
    status, served = _run(["eval", "rm-tiny-a", "--data", data, "--benchmark", benchmark,
                           "--server", live.url])
    assert status == 0 and served["server"] == live.url and "path" not in served
    assert _scores(served) == pytest.approx(_scores(local), abs=1e-6)
    assert served.get("sections") == pytest.approx(local.get("sections"), abs=1e-6)
    assert local["n_rows"] == served["n_rows"] and local["missing_subsets"] == served["missing_subsets"]
    page = (tmp_path / "local.html").read_text()
    assert "<img" in page and "data:image/png;base64," in page and "id='scores'" in page
    first_subset = next(iter(local["per_subset"]))
    assert first_subset in table and first_subset in page


def test_rewardbench_subsets_are_the_models_pair_accuracy(files, tiny_models, offline):
    """The CLI's per-subset scores against the tiny model's own rewards: share of r_c > r_r."""
    from rm.eval.benchmarks import read_benchmark

    rows = read_benchmark(files["rewardbench"], "rewardbench")
    status, out = _run(["eval", tiny_models["rm-tiny-a"], "--data", str(files["rewardbench"]),
                        "--benchmark", "rewardbench", "--device", "cpu"])
    model = offline["rm-tiny-a"]
    chosen = model.score([r["prompt"] for r in rows], [r["chosen"] for r in rows])
    rejected = model.score([r["prompt"] for r in rows], [r["rejected"] for r in rows])
    for subset, entry in out["per_subset"].items():
        inside = [c > r for c, r, row in zip(chosen, rejected, rows, strict=True)
                  if row["subset"] == subset]
        assert entry == {"n": len(inside), "score": pytest.approx(sum(inside) / len(inside))}
    assert out["score"] is None and out["sections"]["Safety"] is None


@pytest.fixture(scope="module")
def constant_model(tmp_path_factory, tiny_models):
    """rm-tiny-a with its score head zeroed: every response gets exactly 0."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("constant") / "rm-constant"
    shutil.copytree(tiny_models["rm-tiny-a"], folder)
    weights = load_file(folder / "model.safetensors")
    weights["score.weight"].zero_()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_constant_model_gets_rewardbench2_tie_credit(files, constant_model):
    """reward-bench @ 05a9005, rewardbench/utils.py reroll_and_score_dataset: 1/4 for a four-way tie
    at the top; process_single_model: 0 for Ties (no gap > 0, 0/0 counts 0); mean of six = 5/24."""
    status, out = _run(["eval", str(constant_model), "--data", str(files["rewardbench2"]),
                        "--benchmark", "rewardbench2", "--device", "cpu"])
    assert status == 0
    assert {s: v for s, v in _scores(out).items() if s != "Ties"} == {
        "Factuality": 0.25, "Precise IF": 0.25, "Math": 0.25, "Safety": 0.25, "Focus": 0.25}
    assert out["per_subset"]["Ties"]["score"] == 0.0
    assert out["score"] == pytest.approx(5 / 24)


@pytest.mark.parametrize("line, message", [
    ({"prompt": "p", "chosen": ["a"], "rejected": "b", "subset": "hep-go"},
     ":2: field 'chosen' must be text, got a list"),
    ({"prompt": "p", "rejected": "b", "subset": "hep-go"}, ":2: missing column 'chosen'"),
    ({"prompt": "p", "chosen": "a", "rejected": "b", "subset": "hep-c"},
     ":2: field 'subset': 'hep-c' is not a RewardBench subset"),
])
def test_a_bad_row_is_one_line_naming_it_and_exit_1(tiny_models, tmp_path, capsys, line, message):
    good = {"prompt": "p", "chosen": "a", "rejected": "b", "subset": "hep-go"}
    path = write_jsonl([good, line], tmp_path / "bad.jsonl")
    status, _ = _run(["eval", tiny_models["rm-tiny-a"], "--data", str(path), "--benchmark",
                      "rewardbench", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1
    assert err.startswith("bradley eval: error: ") and f"{path}{message}" in err


def test_refusals_name_the_fix(files, tiny_models, live, keyed, capsys):
    status, _ = _run(["eval", "rm-tiny-b", "--data", str(files["rewardbench"]), "--benchmark",
                      "rewardbench", "--server", live.url])
    assert status == 1 and "serves rm-tiny-a, not rm-tiny-b" in capsys.readouterr().err
    status, _ = _run(["eval", tiny_models["rm-tiny-a"], "--benchmark", "rewardbench"])
    assert status == 1 and "--benchmark needs --data" in capsys.readouterr().err


class FakeClient:
    """A /score that refuses bodies over `limit` characters (413) and logs each request's size."""

    url = "http://fake"

    def __init__(self, limit: int, served: str = "m"):
        self.limit, self.served, self.sizes = limit, served, []

    def request(self, method, path):
        return {"model": self.served}

    def score_full(self, prompts, responses):
        if sum(len(json.dumps({"prompt": p, "response": r})) + 2
               for p, r in zip(prompts, responses, strict=True)) > self.limit:
            raise ClientError(413, "over the limit", "body")
        self.sizes.append(len(responses))
        return {"scores": [float(len(r)) for r in responses], "model": self.served}


def test_served_scorer_halves_its_requests_while_the_server_says_413():
    client = FakeClient(limit=3000)
    responses = [str(i) * 50 for i in range(200)]
    scores = ServedScorer(client, "m").score(["q"] * 200, responses)
    assert scores == [float(len(r)) for r in responses]  # in order, every item once
    assert sum(client.sizes) == 200 and max(client.sizes) < 200
    with pytest.raises(ClientError):  # one item alone too large: the server's refusal stands
        ServedScorer(FakeClient(limit=10), "m").score(["q"], ["x" * 50])
    with pytest.raises(ValueError, match="serves other, not m"):
        ServedScorer(FakeClient(limit=10, served="other"), "m")


def test_a_pairs_file_through_the_server_matches_the_local_model(tiny_models, live, keyed,
                                                                 shared_data, tmp_path):
    data = str(shared_data / "llmbar" / "LLMBar_Adversarial_GPTOut.json")
    status, local = _run(["eval", tiny_models["rm-tiny-a"], "--data", data, "--device", "cpu",
                          "--html", str(tmp_path / "pairs.html")])
    status_served, served = _run(["eval", "rm-tiny-a", "--data", data, "--server", live.url])
    assert status == status_served == 0 and served["n_pairs"] == local["n_pairs"] == 47
    for key in ("accuracy", "ece", "length_spearman", "mean_margin"):
        assert served[key] == pytest.approx(local[key], abs=1e-6)
    assert "LLMBar_Adversarial_GPTOut" in (tmp_path / "pairs.html").read_text()


def test_reference_stats_of_a_model_trained_elsewhere_from_half_of_a_file_each(
        tiny_models, shared_data, tmp_path, capsys):
    import shutil

    from rm.model.reference_stats import read_reference_stats

    folder = shutil.copytree(tiny_models["rm-tiny-a"], tmp_path / "elsewhere")
    data = shared_data / "llmbar" / "LLMBar_Natural.json"
    status, out = _run(["eval", str(folder), "--data", str(data), "--reference-stats",
                        "--device", "cpu"])
    stats = read_reference_stats(folder)
    assert status == 0 and stats is not None and out["reference_stats"]["n_val"] == stats.n_val
    # each half of the prompts on one side: both sides hold responses, and together all of them
    assert 0 < stats.n_val < 2 * out["n_pairs"] and 0 < stats.n_fit
    assert stats.n_val + stats.n_fit == 2 * out["n_pairs"]
    status, _ = _run(["eval", str(folder), "--data", str(data), "--reference-stats",
                      "--benchmark", "rewardbench"])
    assert status == 1 and "--reference-stats reads hidden states of pairs" in capsys.readouterr().err
