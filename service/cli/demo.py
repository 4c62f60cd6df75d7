"""`bradley demo`: the whole product on simulated data, offline, in a few minutes on a laptop CPU.

simulate → ingest → report (terminal + HTML) → train a small reward model → evaluate it → a short DPO
run on a tiny policy → serve the reward model over HTTP → score a few pairs with the client, and grade
a GRPO group with the gsm8k verifier → shut down.
Each step goes through the same CLI a user types, so the demo is also a smoke test of the CLI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from annotation.simulate import BAD_WORDS, GOOD_WORDS
from service.ports import free_port

# The demo's reward model learns the simulator's signal: quality shows as the share of good words
# (clear, tested, correct…) against bad ones (vague, sloppy, garbled…), and each bad word has the
# length of the good word it replaces. So the two answers scored at the end differ in those words
# only, at equal length: the score difference can come from nothing else.
SCORE_PROMPT = "Question 3: how does hashing work?"
GOOD_ANSWER = ("The answer is a clear and tested method: check the value first, then the result is "
               "correct, precise and accurate.")
BAD_ANSWER = re.sub(r"[a-z]+", lambda m: dict(zip(GOOD_WORDS, BAD_WORDS, strict=True)).get(m[0], m[0]),
                    GOOD_ANSWER)
# A GRPO group graded by the gsm8k verifier (ground truth 10): right with the format bonus, wrong
# but formatted, right but unmarked, right as 10.0. Rewards 1.1, 0.1, 0.0, 1.1 (docs/verifiable-rewards.md).
GROUP_PROMPT = "Tom has 12 apples and gives 2 away. How many are left?"
GROUP_ANSWERS = ["12 - 2 = 10\n#### 10", "12 + 2 = 14\n#### 14", "He has 10 apples left.",
                 "12 - 2 = 10.0\n#### 10.0"]
SCORE_NOTE = ("The tiny model learned the simulator's word signal (good vs bad words), not advice: "
              "these scores rank word choice. Train on real preferences for scores that mean more.")


def _step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def _bradley(command: Callable[[list[str]], int], db: str, *argv: str) -> None:
    status = command(["--db", db, *argv])
    if status:
        raise SystemExit(f"demo step `bradley {' '.join(argv)}` failed with exit code {status}")


def _latest_model(db: str, kind: str) -> dict:
    from annotation.store import Store

    with Store(db, read_only=True) as store:
        rows = [m for m in store.models() if m["kind"] == kind]
    if not rows:
        raise SystemExit(f"demo: no {kind} model was registered in {db}")
    return rows[-1]


def _serve_and_score(db: str, model_id: str) -> None:
    from service.client import ScoreClient

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", db, "serve",
                               "--port", str(port), "--model", model_id], env=os.environ.copy())
    try:
        client = ScoreClient(f"http://127.0.0.1:{port}")
        client.wait_ready(timeout=120)
        responses = [GOOD_ANSWER, BAD_ANSWER]
        scores = client.score([SCORE_PROMPT] * len(responses), responses)
        print(f"prompt: {SCORE_PROMPT}")
        for response, score in zip(responses, scores, strict=True):
            print(f"{score:+.3f}  {response}")
        print(SCORE_NOTE)
        print(f"\nA GRPO group graded by the gsm8k verifier (ground truth 10): {GROUP_PROMPT}")
        print("\n".join(grade_group(client)))
    finally:
        server.terminate()  # SIGTERM: the server drains its queue, then exits
        server.wait(timeout=60)


def grade_group(client) -> list[str]:
    """One /score request with ground truth and group_size: per answer its verifier reward,
    status and group-relative advantage, then the group's statistics."""
    n = len(GROUP_ANSWERS)
    out = client.score_full([GROUP_PROMPT] * n, GROUP_ANSWERS, group_size=n,
                            extras={"ground_truth": ["10"] * n, "verifier": ["gsm8k"] * n})
    lines = [f"reward {r:.1f}  advantage {a:+.3f}  {status:9}  {answer!r}" for r, a, status, answer
             in zip(out["scores"], out["advantages"], out["status"], GROUP_ANSWERS, strict=True)]
    stats = out["group_stats"]
    lines.append(f"accuracy {stats['mean_accuracy']:.2f}; groups whose rewards are all equal "
                 f"(no signal for GRPO): {stats['all_equal_share']:.0%}")
    return lines


def run(command: Callable[[list[str]], int], workdir: str = "demo", db: str | None = None,
        seed: int = 0) -> int:
    """The demo, each step through `command`: the CLI's own entry point, handed in by the CLI."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    db = db or str(work / "bradley.duckdb")
    data = str(work / "judgments.jsonl")
    started = time.perf_counter()
    bradley = partial(_bradley, command, db)

    _step("1. simulate judgments with known truth")
    bradley("simulate", data, "--prompts", "300", "--responses", "4", "--raters", "8",
             "--length-bias", "1.5",
             "--seed", str(seed))
    _step("2. ingest")
    bradley("ingest", data)
    _step("3. report (what the data allows before training)")
    bradley("report", "--html", str(work / "report.html"), "--json", str(work / "report.json"))
    print(f"HTML report: {work / 'report.html'}")
    _step("4. train a small Bradley-Terry reward model")
    # --overwrite: a second demo in the same folder replaces (and retires) the first demo's models
    bradley("train", "rm", "--base-model", "tiny", "--epochs", "3",
             "--out", str(work / "rm-tiny"), "--overwrite")
    model = _latest_model(db, "rm")
    _step("5. evaluate it")
    bradley("eval", model["id"])
    _step("6. a short DPO run on a tiny policy (watch the margin rise)")
    bradley("train", "po", "--loss", "dpo", "--base-model", "tiny", "--steps", "30",
             "--out", str(work / "dpo-tiny"), "--overwrite")
    policy = _latest_model(db, "dpo")["metrics"]
    # Per-step margins are single batches of 8 and noisy; the held-out split shows the trend.
    print(f"DPO on held-out pairs: margin 0.000 at step 1 (policy = reference) → "
          f"{policy['val_margin']:+.3f}, accuracy {policy['val_accuracy']:.2f}, "
          f"loss ln 2 = 0.693 → {policy['val_loss']:.3f}")
    _step("7. serve the reward model, score with the client, grade a GRPO group by a verifier")
    _serve_and_score(db, model["id"])
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s; files in {work}/")
    print(next_steps(db, work), flush=True)
    return 0


def next_steps(db: str, work: Path) -> str:
    """What to type next, with the line that puts `bradley` on the PATH when it is not (`make demo`
    runs it from .venv/bin, which a fresh shell does not know).

    >>> print(next_steps("demo/bradley.duckdb", Path("demo")))  # doctest: +ELLIPSIS
    Next: ...
      bradley --db demo/bradley.duckdb report --html demo/report.html
      bradley --db demo/bradley.duckdb snapshots
    """
    here = Path(sys.executable).parent
    found = shutil.which("bradley")
    lines = ["Next: open demo/report.html, or try these commands:" if str(work) == "demo"
             else f"Next: open {work / 'report.html'}, or try these commands:"]
    if found is None or Path(found).parent != here:
        lines.append(f"  source {_shown(here / 'activate')}    # or: export PATH=\"{here}:$PATH\"")
    lines += [f"  bradley --db {db} report --html {work / 'report.html'}",
              f"  bradley --db {db} snapshots"]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it (.venv/bin/activate)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
