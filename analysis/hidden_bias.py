"""Length biases the pooled figure hides: rater kinds and raters whose own preference is clear where
the pooled one is not, points the other way, or is strong where the pooled one is mild. Opposite
biases cancel in the pool: on hh-rlhf and MT-Bench together, GPT-4 prefers the longer answer and
the hh crowdworkers the shorter, and the pooled share of longer wins looks like a mild preference.

A group's preference is clear when the 95% Wilson interval of its `p_longer_wins` excludes 0.5:
`longer` above, `shorter` below. Kinds (human, ai) are few and each is tested at 95%. Raters are
many, so each is tested at z for 0.05 / m (Bonferroni over the m raters with at least MIN_VERDICTS
decided verdicts), which keeps the chance of flagging any rater whose true share is 0.5 under 5%.
A preference is strong, as for the pooled figure, when the longer answer wins more than 60% or
less than 40%. A group is reported when its clear preference differs from the pooled one in
direction, or is strong where the pooled one is not (a rater also when it differs from its kind,
which its kind's finding already describes); the finding is a problem when a group in it is strong.

Input is the report's `length_bias` section (length_bias.analyze): pooled `p_longer_wins` and its
`p_longer_wins_ci95`, and the same per `by_kind` and `by_rater` entry with their `n`.

    >>> lb = {"p_longer_wins": 0.53, "p_longer_wins_ci95": [0.49, 0.57],
    ...       "by_kind": {"ai": {"p_longer_wins": 0.74, "p_longer_wins_ci95": [0.70, 0.78], "n": 500},
    ...                   "human": {"p_longer_wins": 0.45, "p_longer_wins_ci95": [0.41, 0.49], "n": 700}},
    ...       "by_rater": {}}
    >>> [(g["name"], g["direction"]) for g in hidden_biases(lb)["kinds"]]
    [('ai', 'longer'), ('human', 'shorter')]
    >>> [bad for _, bad in findings(lb)]
    [True]
"""

from __future__ import annotations

from statistics import NormalDist

from analysis.verdicts import wilson_interval

MIN_VERDICTS = 20  # a rater with fewer decided verdicts on pairs of different length is not tested
STRONG = 0.1  # |p_longer_wins − 0.5| beyond this is a problem, as for the pooled figure
SHOWN = 5  # raters named in a finding


def direction(low: float, high: float) -> str | None:
    """'longer', 'shorter' or None (the interval holds 0.5)."""
    return "longer" if low > 0.5 else "shorter" if high < 0.5 else None


def hidden_biases(lb: dict) -> dict:
    """{"kinds": [...], "raters": [...]}: each {name, direction, p_longer_wins, ci95, n} whose
    direction differs from the pooled one (module docstring)."""
    pooled = _entry("all", direction(*(lb.get("p_longer_wins_ci95") or (0.0, 1.0))),
                    lb.get("p_longer_wins"), lb.get("p_longer_wins_ci95"), lb.get("n", 0))
    kinds = {}
    for name, g in sorted((lb.get("by_kind") or {}).items()):
        if g.get("p_longer_wins") is None:
            continue
        group = _entry(name, direction(*g["p_longer_wins_ci95"]), g["p_longer_wins"],
                       g["p_longer_wins_ci95"], g["n"])
        if _differs(group, pooled):
            kinds[name] = group
    tested = {name: g for name, g in (lb.get("by_rater") or {}).items()
              if g.get("p_longer_wins") is not None and g.get("n", 0) >= MIN_VERDICTS}
    z = NormalDist().inv_cdf(1 - 0.025 / max(len(tested), 1))
    raters = []
    for name, g in sorted(tested.items()):
        n = g["n"]
        low, high = (float(x) for x in wilson_interval(round(g["p_longer_wins"] * n), n, z))
        group = _entry(name, direction(low, high), g["p_longer_wins"], [round(low, 4), round(high, 4)], n)
        kind = kinds.get(name.split(":", 1)[0])
        if _differs(group, pooled) and (kind is None or _differs(group, kind)):
            raters.append(group)
    return {"kinds": list(kinds.values()), "raters": raters}


def _entry(name: str, way: str | None, p: float | None, ci, n: int) -> dict:
    return {"name": name, "direction": way, "p_longer_wins": p, "ci95": list(ci or (0.0, 1.0)), "n": n}


def _differs(group: dict, than: dict) -> bool:
    """A clear preference that `than` does not share: another direction, or strong where it is not."""
    if group["direction"] is None:
        return False
    return group["direction"] != than["direction"] or (_strong([group]) and not _strong([than]))


def findings(lb: dict) -> list[tuple[str, bool]]:
    """The report's findings about hidden biases: one for the kinds, one for the raters (each a
    problem when one of its groups is strongly biased)."""
    found = hidden_biases(lb)
    out = []
    if found["kinds"]:
        out.append(("The overall length figure hides what rater kinds do: "
                    + "; ".join(_describe(f"{g['name']} raters prefer", g) for g in found["kinds"]) + ".",
                    _strong(found["kinds"])))
    if found["raters"]:
        named = found["raters"][:SHOWN]
        more = f"; and {len(found['raters']) - SHOWN} more" if len(found["raters"]) > SHOWN else ""
        out.append((f"{len(found['raters'])} rater(s) have a length preference the overall figure does "
                    "not show (intervals corrected for the number of raters): "
                    + "; ".join(_describe(f"{g['name']} prefers", g) for g in named) + more + ".",
                    _strong(found["raters"])))
    return out


def _describe(who: str, g: dict) -> str:
    """'ai raters prefer the longer answer (it wins 74%, CI 70%–78%, n=455)'."""
    low, high = g["ci95"]
    places = 1 if 50 in (round(low * 100), round(high * 100)) else 0  # never show 50% as a bound
    return (f"{who} the {g['direction']} answer (the longer wins {g['p_longer_wins']:.{places}%}, "
            f"CI {low:.{places}%}–{high:.{places}%}, n={g['n']:,})")


def _strong(groups: list) -> bool:
    return any(g["p_longer_wins"] is not None and abs(g["p_longer_wins"] - 0.5) > STRONG for g in groups)
