"""Constitutions, both-order bookkeeping, and one voice per rater per comparison in the store."""

import ast
from pathlib import Path

import pytest

from annotation.ingest.batch import ingest_records
from annotation.rlaif.constitution import ConstitutionError, load_constitution
from annotation.rlaif.orders import Comparison, collapsed_winner, judgment_row, plan

ROOT = Path(__file__).resolve().parents[2]
GOOD = '''name = "t"
version = "1"
template = """{prompt} {first} {second} {principle} {label_first} {label_second} ("""

[[principles]]
text = "Which is kinder?"

[[principles]]
text = "Which is truer?"
weight = 2
'''


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_shipped_constitutions_load():
    default, helpful = load_constitution("default"), load_constitution("helpful")
    assert len(default.principles) >= 3 and len(helpful.principles) >= 1
    words = " ".join(p.text.lower() for p in default.principles)
    assert "harm" in words and "honest" in words and "help" in words
    assert default.rater("m").startswith("ai:m:default@") and len(default.sha8) == 8


def test_rater_hash_follows_the_file(tmp_path):
    one = load_constitution(str(write(tmp_path, GOOD)))
    two = load_constitution(str(write(tmp_path, GOOD.replace("kinder", "gentler"))))
    assert one.sha8 != two.sha8 and one.principles[1].weight == 2.0


@pytest.mark.parametrize("edit,where", [
    (lambda s: s.replace('version = "1"\n', ""), ":1: version: missing"),
    (lambda s: s.split("[[principles]]")[0] + "principles = []\n", ":5: principles: empty"),
    (lambda s: s.replace("{principle} ", "{principle} {mood} "), ":3: template: unknown slot {mood}"),
    (lambda s: s.replace("truer", "kinder"), ":8: principles.text: principle 2 repeats"),
    (lambda s: s.replace("{second} ", ""), ":3: template: lacks the slot {second}"),
    (lambda s: s.replace("weight = 2", "weight = -1"), ":8: principles.weight"),
])
def test_bad_constitutions_name_file_line_and_field(tmp_path, edit, where):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(ConstitutionError) as err:
        load_constitution(str(path))
    assert str(err.value).startswith(str(path)) and where in str(err.value), str(err.value)


def test_plan_judges_both_orders_and_samples_a_stable_principle():
    c = load_constitution("default")
    tasks = plan(["k1", "k2", "k3"], c, "sample", seed=3)
    assert [t.order for t in tasks] == ["ab", "ba"] * 3
    assert all(tasks[2 * i].principle == tasks[2 * i + 1].principle for i in range(3))
    assert [t.principle for t in plan(["k2"], c, "sample", seed=3)] == [t.principle for t in tasks[2:4]]
    assert len(plan(["k1"], c, "all")) == 2 * len(c.principles)


def test_prefix_shared_by_principles_holds_both_responses():
    c = load_constitution("default")
    head, tail = c.split("Q?", "first answer", "second answer")
    assert "first answer" in head and "second answer" in head and "{principle}" in tail
    assert c.render("Q?", "x", "y", "P?").endswith("The answer is: (")


def test_collapsed_winner_hand_cases():
    assert collapsed_winner(0.9, 0.9) == "tie"   # position bias: first shown wins both times
    assert collapsed_winner(0.55, 0.55) == "tie"  # mean exactly 1/2
    assert collapsed_winner(0.7, 0.45) == "a"     # (0.7 + 0.55) / 2 = 0.625
    assert collapsed_winner(0.45, 0.7) == "b"


def judgment(a, b, winner, rater, strength=None, source="judgments"):
    return {"prompt": "Which fruit is red?", "response_a": a, "response_b": b, "winner": winner,
            "rater": rater, "strength": strength, "source": source}


def one_pair(store):
    rows = store.pairs().to_pylist()
    assert len(rows) == 1
    return rows[0]


def test_second_order_does_not_double_the_ai_raters_weight(store):
    """A human says x; the judge says y in both orders. One voice each: a 1–1 split, not 2–1."""
    ingest_records(store, [judgment("x", "y", "a", "human:h")], fmt="judgments", source="t1")
    rater = "ai:m:c@00000000"
    ingest_records(store, [judgment("x", "y", "b", rater, 0.8, "rlaif")], fmt="judgments", source="t2")
    after_one = one_pair(store)
    ingest_records(store, [judgment("y", "x", "a", rater, 0.6, "rlaif")], fmt="judgments", source="t3")
    after_two = one_pair(store)
    for row in (after_one, after_two):
        assert (row["votes_chosen"], row["votes_rejected"], row["ties"], row["n_votes"]) == (1, 1, 0, 2)
        assert row["p_chosen"] == 0.5
    assert store.counts()["judgments"] == 3  # both orders are kept as raw judgments


def test_ai_alone_soft_label_is_the_order_mean(store):
    rater = "ai:m:c@00000000"
    ingest_records(store, [judgment("x", "y", "b", rater, 0.8, "rlaif"),
                           judgment("y", "x", "a", rater, 0.6, "rlaif")], fmt="judgments", source="t")
    row = one_pair(store)
    assert row["chosen"] == "y" and row["n_votes"] == 1 and row["p_chosen"] == pytest.approx(0.7)


def test_position_biased_judge_is_one_tie(store):
    rater = "ai:m:c@00000000"
    c = Comparison("Which fruit is red?", None, "x", "y")
    rows = [judgment_row(c, "ab", 0.9, ["p"], rater), judgment_row(c, "ba", 0.9, ["p"], rater)]
    ingest_records(store, rows, fmt="judgments", source="t")
    row = one_pair(store)
    assert (row["ties"], row["votes_chosen"], row["n_votes"], row["p_chosen"]) == (1, 0, 1, 0.5)


def test_humans_still_count_every_vote(store):
    rows = [judgment("x", "y", "a", "human:1"), judgment("y", "x", "b", "human:2"),
            judgment("x", "y", "b", "human:3"), judgment("x", "y", "tie", "human:4")]
    ingest_records(store, rows, fmt="judgments", source="t")
    row = one_pair(store)
    assert (row["chosen"], row["votes_chosen"], row["votes_rejected"], row["ties"]) == ("x", 2, 1, 1)
    assert row["p_chosen"] == pytest.approx(2.5 / 4)


def test_annotation_never_imports_rm():
    for path in (ROOT / "annotation").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "rm" or n.startswith(("rm.", "analysis")) for n in names), path
