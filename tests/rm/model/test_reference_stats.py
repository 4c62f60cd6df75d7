"""Reference statistics: the Mahalanobis distance against scipy, the hidden states read from the
scoring forward itself, and the files beside the weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.spatial.distance import mahalanobis

from rm.model.reference_stats import (
    STATS_ARRAYS,
    STATS_JSON,
    MissingReferenceStats,
    collect,
    compute_reference_stats,
    fit_latent,
    read_reference_stats,
    write_reference_stats,
)
from rm.model.reward_model import RewardModel, build_tiny_reward_model
from rm.model.weights import weights_sha256

TEXTS = [f"question {i}: is answer {i} better than answer {i * 7}? it is {'yes' if i % 2 else 'no'}"
         for i in range(60)]
ITEMS = [(f"question {i}?", f"answer {i} " * (1 + i % 5)) for i in range(40)]


@pytest.fixture(scope="module")
def correlated_states() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(400, 6, generator=g) @ torch.randn(6, 6, generator=g) + 3.0


@pytest.mark.parametrize("rank", [0, 2, 6])
def test_distance_matches_scipy_under_the_estimated_covariance(correlated_states, rank):
    latent = fit_latent(correlated_states, rank)
    inverse = np.linalg.inv(latent.covariance().numpy())
    probes = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)) * 2
    expected = [mahalanobis(p.numpy(), latent.mean.numpy(), inverse) for p in probes]
    assert latent.distance(probes).numpy() == pytest.approx(expected, rel=1e-4)


def test_the_training_mean_is_at_distance_zero(correlated_states):
    latent = fit_latent(correlated_states, rank=3)
    assert float(latent.distance(correlated_states.mean(0, keepdim=True))[0]) == pytest.approx(0, abs=1e-5)


def test_the_covariance_keeps_each_coordinate_variance_and_full_rank_is_the_sample_covariance(
        correlated_states):
    sample = np.cov(correlated_states.numpy().T)
    for rank in (0, 2):
        assert np.diag(fit_latent(correlated_states, rank).covariance().numpy()) == pytest.approx(
            np.diag(sample), rel=1e-5)
    assert fit_latent(correlated_states, 6).covariance().numpy() == pytest.approx(sample, abs=0.02)


def test_low_rank_sees_an_off_axis_outlier_the_diagonal_misses(correlated_states):
    """A point that breaks the coordinates' correlation, each coordinate within its own range."""
    latent_diag, latent_low = fit_latent(correlated_states, 0), fit_latent(correlated_states, 6)
    x = correlated_states - correlated_states.mean(0)
    direction = torch.linalg.svd(x, full_matrices=False).Vh[-1]  # the least varied direction
    point = correlated_states.mean(0) + direction * 4 * x.std(0).min()
    p99_diag = torch.quantile(latent_diag.distance(correlated_states), 0.99)
    p99_low = torch.quantile(latent_low.distance(correlated_states), 0.99)
    assert float(latent_low.distance(point[None])[0]) > 3 * float(p99_low)
    assert float(latent_diag.distance(point[None])[0]) < float(p99_diag)


def test_a_covariance_needs_two_items():
    with pytest.raises(ValueError, match="at least 2"):
        fit_latent(torch.zeros(1, 4))


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_states_come_from_the_scoring_forward_and_do_not_change_scores(tmp_path, arch):
    model = RewardModel.load(build_tiny_reward_model(tmp_path, TEXTS, hidden=32, layers=1,
                                                     vocab_size=300, arch=arch), device="cpu")
    ids = model.encode([p for p, _ in ITEMS[:6]], [r for _, r in ITEMS[:6]])
    plain = model.score_encoded(ids)
    scores, states = model.score_encoded(ids, on_states=lambda s: s.clone())
    assert scores == pytest.approx(plain, abs=1e-6) and states.shape == (6, 32)
    if arch == "llama":  # the score head applied to the captured states gives the scores
        with torch.inference_mode():
            assert model.net._head(states).tolist() == pytest.approx(plain, abs=1e-5)
    # alone, each row's state is the same: batch independence holds for the states too
    alone = torch.cat([model.score_encoded([row], on_states=lambda s: s.clone())[1] for row in ids])
    assert torch.allclose(alone, states, atol=1e-4)


def test_stats_of_a_tiny_model_written_beside_the_weights_and_read_back(tmp_path):
    folder = build_tiny_reward_model(tmp_path, TEXTS, hidden=32, layers=1, vocab_size=300)
    before = weights_sha256(folder)
    model = RewardModel.load(folder, device="cpu")
    stats = compute_reference_stats(model, ITEMS[:30], ITEMS[30:], rank=4, source="test")
    scores, states = collect(model, ITEMS[30:])
    assert stats.score_mean == pytest.approx(scores.mean()) and stats.n_val == 10
    assert stats.score_std == pytest.approx(scores.std(ddof=1))
    assert stats.score_quantiles["0.5"] == pytest.approx(np.median(scores))
    chars = [len(r) for _, r in ITEMS[30:]]
    assert stats.length_correlation == pytest.approx(np.corrcoef(scores, chars)[0, 1])
    assert stats.mahalanobis_p99 == pytest.approx(
        np.quantile(stats.latent.distance(states).numpy(), 0.99), rel=1e-5)
    write_reference_stats(folder, stats)
    assert weights_sha256(folder) == before  # a registered id still names the same weights
    assert json.loads((folder / STATS_JSON).read_text())["covariance"] == "low-rank+diagonal"
    again = read_reference_stats(folder)
    assert again.as_json() == stats.as_json()
    assert torch.allclose(again.latent.distance(states), stats.latent.distance(states))
    with np.load(folder / STATS_ARRAYS, allow_pickle=False) as arrays:
        assert arrays["components"].shape == (32, 4)


def test_a_model_without_stats_is_refused_with_the_command_that_computes_them(tmp_path):
    assert read_reference_stats(tmp_path) is None
    with pytest.raises(MissingReferenceStats, match=r"bradley eval .* --reference-stats"):
        raise MissingReferenceStats("rm-x", str(tmp_path), "the watch compares served items with")


def test_training_writes_the_reference_statistics_of_its_best_checkpoint(tmp_path):
    from rm.train.loop import TrainConfig
    from rm.train.reward import RewardRunConfig, train_reward_model
    from rm.train.reward_data import split_of
    from rm.train.run import RunInputs

    rows = [{"prompt": f"question {i}?", "chosen": f"a careful answer {i} " * 3,
             "rejected": f"no {i}", "prompt_id": f"p{i}", "p_chosen": 1.0} for i in range(24)]
    config = RewardRunConfig(base_model="tiny", out=str(tmp_path / "rm"), device="cpu",
                             max_length=32, val_fraction=0.5, train=TrainConfig(steps=2, batch_size=4))
    metrics = train_reward_model(config, RunInputs(pairs=rows, snapshot_id="s"))
    stats = read_reference_stats(metrics["path"])
    n_val = sum(split_of(r["prompt_id"], 0.5) == "val" for r in rows)
    assert stats.n_val == 2 * n_val and stats.n_fit == 2 * (len(rows) - n_val)
    assert stats.source == "snapshot s" and metrics["reference_stats"]["covariance"] == stats.covariance_kind
    model = RewardModel.load(metrics["path"], device="cpu")
    val = [(r["prompt"], r[s]) for r in rows if split_of(r["prompt_id"], 0.5) == "val"
           for s in ("chosen", "rejected")]
    assert stats.score_mean == pytest.approx(np.mean(model.score(*zip(*val, strict=True))), abs=1e-5)
