"""Serving several reward models as one: members, the lanes they are scored in, and aggregates.

Bradley–Terry scores have an arbitrary offset and scale per model, so each member's score s is
standardised by its own validation mean and std (rm/model/reference_stats.py) before members are
combined: z = (s − mean_val) / std_val. Over the members' z of one item:

* `mean`: the average;
* `min`: the worst case (Coste et al., ICLR 2024, "WCO");
* `uwo`: mean − λ·std, uncertainty-weighted (Coste et al.'s "UWO", with the std across members);

and `disagreement` is that std (population: the members are all there is, not a sample of them).
Members that tokenize alike (the same tokenizer, template and length limit) share a lane: one
tokenization, one batcher job, and in each batch one forward per member on the same ids; a member
with its own tokenizer has a lane of its own and tokenizes its own items. A lane's scorer returns,
per row, each member's score (and, when watched, each member's Mahalanobis distance, computed on the
device from the hidden state of the same forward).

    >>> z = np.array([[1.0, -1.0], [3.0, 0.0]])       # 2 members x 2 items
    >>> aggregate(z, "mean").tolist(), aggregate(z, "min").tolist(), aggregate(z, "uwo", 1.0).tolist()
    ([2.0, -0.5], [1.0, -1.0], [1.0, -1.0])
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from service.api.payloads import PayloadError, finite_number

AGGREGATES = ("mean", "min", "uwo")


@dataclass(frozen=True)
class Aggregation:
    """How an ensemble's members become one reward: `how` in AGGREGATES; `weight` is λ of uwo."""

    how: str = "mean"
    weight: float = 1.0


def aggregate(z: np.ndarray, how: str, weight: float = 1.0) -> np.ndarray:
    """One reward per item from standardised member scores `z` [members, items]."""
    if how == "mean":
        return z.mean(0)
    if how == "min":
        return z.min(0)
    if how == "uwo":
        return z.mean(0) - weight * z.std(0)
    raise ValueError(f"aggregate {how!r}: use one of {', '.join(AGGREGATES)}")


def parse_aggregation(value: dict, default: Aggregation) -> Aggregation:
    """A request's `aggregate` and `uncertainty_weight` (λ) over the server's default."""
    how, weight = value.get("aggregate", default.how), value.get("uncertainty_weight", default.weight)
    if how not in AGGREGATES:
        raise PayloadError("aggregate", f"must be one of {', '.join(AGGREGATES)}")
    if not finite_number(weight) or weight < 0:
        raise PayloadError("uncertainty_weight", "must be a finite number >= 0 (λ of mean − λ·std)")
    return Aggregation(how, float(weight))


@dataclass(frozen=True, eq=False)
class Member:
    """One served reward model. `stats`: its ReferenceStats (None: it has none); `latent`: their
    LatentDistance on the model's device, when the watch measures its items."""

    id: str
    path: str
    rm: object  # rm.model.reward_model.RewardModel
    stats: object | None = None
    latent: object | None = None

    def distances(self, states) -> list[float]:
        return self.latent.distance(states).cpu().tolist()


@dataclass(frozen=True, eq=False)
class Lane:
    """Members that tokenize alike: the first one's RewardModel encodes for all of them."""

    members: tuple[Member, ...]
    watched: bool = False

    @property
    def rm(self):
        return self.members[0].rm

    def scorer(self, batch: list[list[int]]) -> list[tuple]:
        """Per row (score of each member..., distance of each member... when watched)."""
        columns = []
        if self.watched:
            results = [m.rm.score_encoded(batch, on_states=m.distances) for m in self.members]
            columns = [scores for scores, _ in results] + [dist for _, dist in results]
        else:
            columns = [m.rm.score_encoded(batch) for m in self.members]
        return list(zip(*columns, strict=True))


def tokenization_key(rm) -> str:
    """What decides a member's token ids: its tokenizer (vocabulary, merges, normalisation, special
    tokens), chat template, length limit and architecture (encoders render sentence pairs)."""
    tokenizer = rm.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = [backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items())),
             str(getattr(tokenizer, "chat_template", None)), str(rm.max_length),
             str(rm.net.is_decoder), str(tokenizer.all_special_tokens)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def make_lanes(members: list[Member], watched: bool) -> tuple[Lane, ...]:
    """Members grouped by tokenization_key, in the order they were given."""
    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(tokenization_key(member.rm), []).append(member)
    return tuple(Lane(tuple(group), watched) for group in groups.values())


@dataclass
class Scored:
    """What scoring one request gives: `scores` as /score answers them (a single model's raw scores,
    or an ensemble's aggregate), and per member the raw scores, the standardised ones (an ensemble's
    only) and the Mahalanobis distances (None unwatched), in member order."""

    model: str
    scores: list[float]
    raw: dict[str, list[float]] = field(default_factory=dict)
    z: dict[str, np.ndarray] = field(default_factory=dict)
    distances: dict[str, list[float] | None] = field(default_factory=dict)
    disagreement: list[float] | None = None

    def reply_fields(self) -> dict:
        """/score's ensemble fields: `members` (standardised scores) and `disagreement`."""
        if self.disagreement is None:
            return {}
        return {"members": {k: v.tolist() for k, v in self.z.items()},
                "disagreement": self.disagreement}


def assemble(model_id: str, lanes: tuple[Lane, ...], lane_rows: list[list[tuple]],
             how: Aggregation) -> Scored:
    """A Scored from each lane's rows (Lane.scorer's tuples, in item order)."""
    raw, distances = {}, {}
    for lane, rows in zip(lanes, lane_rows, strict=True):
        n = len(lane.members)
        columns = list(zip(*rows, strict=True)) if rows else [()] * (2 * n if lane.watched else n)
        for k, member in enumerate(lane.members):
            raw[member.id] = list(columns[k])
            distances[member.id] = list(columns[n + k]) if lane.watched else None
    members = [m for lane in lanes for m in lane.members]
    if len(members) == 1:  # one model answers its own scores; the watch standardises them
        return Scored(model_id, raw[members[0].id], raw, {}, distances)
    z = {m.id: m.stats.standardise(raw[m.id]) for m in members}
    stacked = np.stack(list(z.values()))
    combined = aggregate(stacked, how.how, how.weight)
    return Scored(model_id, combined.tolist(), raw, z, distances, stacked.std(0).tolist())


@dataclass(frozen=True)
class ScoreOptions:
    """Per request: the trainer's run (the watch's label) and the ensemble's aggregation (None:
    the server's)."""

    run: str = "default"
    aggregation: Aggregation | None = None


def plan_lanes(members: list[Member], watch: str) -> tuple[tuple[Lane, ...], str | None]:
    """(lanes, why the models are not watched or None). A single unwatched model gets no lanes
    (it is scored as before ensembles existed). Refused with MissingReferenceStats: an ensemble
    member without reference statistics, and with BRADLEY_WATCH=on any model without them."""
    from rm.model.reference_stats import MissingReferenceStats

    ids = [m.id for m in members]
    if len(set(ids)) != len(ids):
        raise ValueError(f"models {', '.join(ids)}: a model appears twice; name each member once")
    bare = [m for m in members if m.stats is None]
    if bare and len(members) > 1:
        raise MissingReferenceStats(bare[0].id, bare[0].path, "an ensemble standardises its "
                                    "members' scores by")
    if bare and watch == "on":
        raise MissingReferenceStats(bare[0].id, bare[0].path, "the watch (BRADLEY_WATCH=on) "
                                    "compares served items with")
    reason = ("BRADLEY_WATCH=off" if watch == "off" else
              str(MissingReferenceStats(bare[0].id, bare[0].path, "the watch compares served items "
                                        "with")) if bare else None)
    if reason is None:
        members = [Member(m.id, m.path, m.rm, m.stats, m.stats.latent.to(m.rm.device))
                   for m in members]
    if len(members) == 1 and reason is not None:
        return (), reason
    return make_lanes(members, reason is None), reason
