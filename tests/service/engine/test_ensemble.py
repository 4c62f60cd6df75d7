"""Ensemble aggregates by hand, their invariance to each member's offset and scale, and which
members may be served together."""

from __future__ import annotations

import numpy as np
import pytest

from rm.model.reference_stats import MissingReferenceStats, ReferenceStats
from service.api.payloads import PayloadError
from service.engine.ensemble import (
    Aggregation,
    Lane,
    Member,
    aggregate,
    assemble,
    parse_aggregation,
    plan_lanes,
)


def stats(mean: float, std: float) -> ReferenceStats:
    return ReferenceStats(mean, std, {}, None, 100.0, 3.0, 10, 10, 4, 0)


RAW = {"a": [1.0, 2.0, 3.0, 0.5], "b": [-4.0, 0.0, 2.0, 1.0], "c": [10.0, 11.0, 9.0, 10.5]}
STATS = {"a": stats(2.0, 1.0), "b": stats(0.0, 2.0), "c": stats(10.0, 0.5)}
Z = np.array([[-1.0, 0.0, 1.0, -1.5], [-2.0, 0.0, 1.0, 0.5], [0.0, 2.0, -2.0, 1.0]])


class FakeModel:
    device = "cpu"


def scored(raw: dict, member_stats: dict, how: Aggregation):
    members = tuple(Member(k, f"/m/{k}", FakeModel(), member_stats[k]) for k in raw)
    rows = [list(zip(*raw.values(), strict=True))]
    return assemble("+".join(raw), (Lane(members),), rows, how)


def test_members_are_standardised_by_their_own_validation_mean_and_std():
    out = scored(RAW, STATS, Aggregation("mean"))
    assert np.stack(list(out.z.values())) == pytest.approx(Z)
    assert out.raw == RAW and out.model == "a+b+c"


def test_aggregates_by_hand():
    # item 0: z = (-1, -2, 0): mean -1, min -2, population std sqrt(2/3)
    assert aggregate(Z, "mean")[0] == pytest.approx(-1.0)
    assert aggregate(Z, "min")[0] == -2.0
    assert aggregate(Z, "uwo", 0.5)[0] == pytest.approx(-1.0 - 0.5 * np.sqrt(2 / 3))
    out = scored(RAW, STATS, Aggregation("uwo", 2.0))
    assert out.scores[0] == pytest.approx(-1.0 - 2.0 * np.sqrt(2 / 3))
    assert out.disagreement[0] == pytest.approx(np.sqrt(2 / 3))


def test_lambda_zero_is_the_mean_and_min_is_at_most_the_mean():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(4, 200))
    assert aggregate(z, "uwo", 0.0) == pytest.approx(aggregate(z, "mean"))
    assert (aggregate(z, "min") <= aggregate(z, "mean") + 1e-12).all()
    assert (aggregate(z, "uwo", 1.0) <= aggregate(z, "mean") + 1e-12).all()


@pytest.mark.parametrize("how", [Aggregation("mean"), Aggregation("min"), Aggregation("uwo", 1.5)])
def test_an_affine_change_of_one_member_leaves_every_aggregate_unchanged(how):
    """Bradley-Terry scores have an arbitrary offset and scale: +100 and x3 on one member's raw
    scores (and so on its validation scores) changes nothing."""
    before = scored(RAW, STATS, how)
    shifted = {**RAW, "b": [3 * s + 100 for s in RAW["b"]]}
    after = scored(shifted, {**STATS, "b": stats(3 * 0.0 + 100, 3 * 2.0)}, how)
    assert after.scores == pytest.approx(before.scores)
    assert after.disagreement == pytest.approx(before.disagreement)


def test_a_request_chooses_its_aggregate_within_bounds():
    default = Aggregation("mean", 1.0)
    assert parse_aggregation({}, default) == default
    assert parse_aggregation({"aggregate": "uwo", "uncertainty_weight": 0}, default) == \
        Aggregation("uwo", 0.0)
    with pytest.raises(PayloadError, match="aggregate: must be one of mean, min, uwo"):
        parse_aggregation({"aggregate": "max"}, default)
    for bad in (-1, True, "1", float("inf")):
        with pytest.raises(PayloadError, match="uncertainty_weight"):
            parse_aggregation({"uncertainty_weight": bad}, default)


class Tokenized:
    """A RewardModel stand-in whose tokenization is named by `key`."""

    def __init__(self, key: str):
        self.key, self.device, self.max_length = key, "cpu", 64
        self.tokenizer = type("T", (), {"backend_tokenizer": None, "chat_template": None,
                                        "all_special_tokens": [], "get_vocab": lambda s: {key: 0}})()
        self.net = type("N", (), {"is_decoder": True})()


def member(name: str, key: str = "same", with_stats: bool = True) -> Member:
    latent = type("L", (), {"to": lambda self, device: self})()
    ref = stats(0.0, 1.0)
    ref.latent = latent
    return Member(name, f"/models/{name}", Tokenized(key), ref if with_stats else None)


def test_members_that_tokenize_alike_share_a_lane_and_others_get_their_own():
    lanes, unwatched = plan_lanes([member("a"), member("b", "other"), member("c")], "auto")
    assert [[m.id for m in lane.members] for lane in lanes] == [["a", "c"], ["b"]]
    assert unwatched is None and all(lane.watched for lane in lanes)
    assert all(m.latent is not None for lane in lanes for m in lane.members)


def test_an_ensemble_member_without_reference_statistics_is_refused_naming_bradley_eval():
    with pytest.raises(MissingReferenceStats, match=r"model b has no reference statistics .*"
                       r"ensemble standardises .* `bradley eval /models/b --reference-stats`"):
        plan_lanes([member("a"), member("b", with_stats=False)], "off")
    with pytest.raises(ValueError, match="appears twice"):
        plan_lanes([member("a"), member("a")], "auto")


def test_one_model_without_statistics_is_served_unwatched_unless_the_watch_is_required():
    lanes, unwatched = plan_lanes([member("a", with_stats=False)], "auto")
    assert lanes == () and "bradley eval /models/a --reference-stats" in unwatched
    with pytest.raises(MissingReferenceStats, match="BRADLEY_WATCH=on"):
        plan_lanes([member("a", with_stats=False)], "on")
    lanes, unwatched = plan_lanes([member("a")], "off")
    assert lanes == () and unwatched == "BRADLEY_WATCH=off"
