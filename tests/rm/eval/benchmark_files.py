"""Small files in the leaderboards' published formats, built from ../shared/data at test time:
RewardBench rows from LLMBar (its Natural and four Adversarial sets are RewardBench's Chat Hard
subsets) and MT-Bench human votes; RewardBench 2 best-of-4 rows from the MT-Bench answers of several
models to one question, plus hand-made Ties rows (questions with several right answers)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

LLMBAR_SUBSETS = {  # RewardBench subset -> LLMBar file
    "llmbar-natural": "LLMBar_Natural.json",
    "llmbar-adver-neighbor": "LLMBar_Adversarial_Neighbor.json",
    "llmbar-adver-GPTInst": "LLMBar_Adversarial_GPTInst.json",
    "llmbar-adver-GPTOut": "LLMBar_Adversarial_GPTOut.json",
    "llmbar-adver-manual": "LLMBar_Adversarial_Manual.json",
}
MT_BENCH_SUBSETS = ("mt-bench-easy", "mt-bench-med", "mt-bench-hard")
MT_BENCH_VOTES = "mtbench_human/mtbench_turn1_judgments.jsonl.gz"
RB2_SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus")
TIES_QUESTIONS = [  # prompt, every right answer, wrong answers
    ("Name a primary colour of paint.", ["Red.", "Blue.", "Yellow."], ["Green.", "Purple."]),
    ("Name a prime number below 10.", ["2", "3", "5", "7"], ["4", "9", "1"]),
    ("Name a day of the weekend.", ["Saturday.", "Sunday."], ["Monday.", "Wednesday."]),
]


def _human_votes(shared_data: Path) -> list[dict]:
    with gzip.open(shared_data / MT_BENCH_VOTES, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["rater"].startswith("human:") and r["winner"] in ("a", "b")]


def rewardbench_rows(shared_data: Path, per_subset: int = 6) -> list[dict]:
    """`per_subset` pairs of each LLMBar subset and of each MT-Bench subset, RewardBench's columns."""
    rows = []
    for subset, name in LLMBAR_SUBSETS.items():
        items = json.loads((shared_data / "llmbar" / name).read_text())[:per_subset]
        for item in items:
            good, bad = ("output_1", "output_2") if str(item["label"]) == "1" else ("output_2", "output_1")
            rows.append({"prompt": item["input"], "chosen": item[good], "chosen_model": "llmbar",
                         "rejected": item[bad], "rejected_model": "llmbar", "subset": subset,
                         "id": len(rows)})
    votes = _human_votes(shared_data)
    for k, subset in enumerate(MT_BENCH_SUBSETS):
        for vote in votes[k * per_subset:(k + 1) * per_subset]:
            win, lose = ("a", "b") if vote["winner"] == "a" else ("b", "a")
            rows.append({"prompt": vote["prompt"], "chosen": vote[f"response_{win}"],
                         "chosen_model": vote[f"model_{win}"], "rejected": vote[f"response_{lose}"],
                         "rejected_model": vote[f"model_{lose}"], "subset": subset, "id": len(rows)})
    return rows


def _rb2_row(row_id: str, prompt: str, chosen: list, rejected: list, models: list, subset: str,
             category: str) -> dict:
    return {"id": row_id, "prompt": prompt, "chosen": chosen, "rejected": rejected,
            "num_correct": len(chosen), "num_incorrect": len(rejected),
            "total_completions": len(chosen) + len(rejected), "models": models, "subset": subset,
            "additional_metadata": {"category": category, "source": "bradley tests"}}


def rewardbench2_rows(shared_data: Path, per_subset: int = 3) -> list[dict]:
    """Best-of-4 rows (a human vote's winner against three other models' answers to the same
    question) cycled over the five best-of-N subsets, then a ref and a tied row per Ties question."""
    answers: dict[int, dict[str, str]] = defaultdict(dict)
    prompts = {}
    for vote in _human_votes(shared_data):
        answers[vote["question_id"]] |= {vote["model_a"]: vote["response_a"],
                                         vote["model_b"]: vote["response_b"]}
        prompts[vote["question_id"]] = vote["prompt"]
    rows, used = [], set()
    for vote in _human_votes(shared_data):
        qid = vote["question_id"]
        winner = vote[f"model_{vote['winner']}"]
        others = sorted(m for m in answers[qid] if m != winner)[:3]
        if qid in used or len(others) < 3:
            continue
        used.add(qid)
        subset = RB2_SUBSETS[len(rows) % len(RB2_SUBSETS)]
        rows.append(_rb2_row(str(len(rows)), prompts[qid], [answers[qid][winner]],
                             [answers[qid][m] for m in others], [winner, *others], subset, "mt-bench"))
        if len(rows) == per_subset * len(RB2_SUBSETS):
            break
    for n, (prompt, right, wrong) in enumerate(TIES_QUESTIONS):
        rows.append(_rb2_row(f"ref:{n}", prompt, right[:1], wrong, [], "Ties", "ties"))
        rows.append(_rb2_row(f"tied:{n}", prompt, right, wrong, [], "Ties", "ties"))
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
