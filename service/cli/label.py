"""`bradley label`: an LLM judge labels comparisons against a constitution (RLAIF).

The edge composes the layers: store → comparisons → judge prompts (annotation.rlaif.constitution) → judge
(rm.judge.local) → judgment rows, both presentation orders (annotation.rlaif.orders) → one ingest batch
(source `rlaif`). With `--server URL` the comparisons come from that running server's store and the
verdicts go to its POST /judgments (service/remote/stores.py), as uploads of at most 4 MiB. Nothing is written until every comparison is judged, so a bad judge or a dead
server leaves the store as it was. The last stdout line is one JSON object: pairs judged, judgments
written, forwards, seconds, pairs/s, position consistency, ties, failures and the rater id.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

CHUNK = 8  # comparisons per judge call: the progress bar's step, and the prefix groups' batch


def add(sub) -> None:
    p = sub.add_parser("label", help="RLAIF: an LLM judge labels pairs against a constitution")
    p.add_argument("--constitution", default="default", help="a TOML file, or default | helpful")
    p.add_argument("--judge", required=True, help="local:PATH|ID | openai:URL (…/v1)")
    p.add_argument("--pairs", default="unlabeled", choices=["unlabeled", "all"],
                   help="unlabeled: comparisons this rater has not judged yet (reruns add nothing)")
    p.add_argument("--principles", default="sample", choices=["sample", "all"],
                   help="sample: one seeded principle per comparison; all: every principle, weighted")
    p.add_argument("--limit", type=int, default=None, help="judge at most this many comparisons")
    p.add_argument("--raters-prefix", default=None,
                   help="only comparisons judged by raters with this prefix (human: to measure agreement)")
    p.add_argument("--judge-name", default=None, help="model name in the rater id (default: from --judge)")
    p.add_argument("--seed", type=int, default=0, help="seed of the principle draws and sampling")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per judge forward")
    p.add_argument("--no-prefix-reuse", action="store_true", help="judge every sequence whole")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (local judge)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (openai judge)")
    p.add_argument("--retries", type=int, default=3, help="retries on 429/5xx/timeouts (openai judge)")
    p.add_argument("--concurrency", type=int, default=4, help="requests at once (openai judge)")
    p.add_argument("--generate", default=None, metavar="POLICY",
                   help="sample responses with this local causal LM for --prompts, then judge them")
    p.add_argument("--prompts", default=None, metavar="FILE", help="JSONL with a prompt field, or text lines")
    p.add_argument("--n", type=int, default=2, help="responses sampled per prompt (--generate)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (--generate)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per sampled response or revision")
    p.add_argument("--revise", action="store_true",
                   help="critique and rewrite responses with the judge; store (revision ≻ original)")


def run(args) -> int:
    from annotation.rlaif.constitution import load_constitution

    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    constitution = load_constitution(args.constitution)
    _check_models(args)
    from service.remote.stores import open_store

    rater = constitution.rater(_model_name(args), ":revise" if args.revise else "")
    # the store before the judge loads: a missing or locked store fails first; --generate makes
    # its own comparisons, so it may start a new store
    with open_store(args, create=bool(args.generate)) as store:
        judge = _judge(args, constitution)
        if args.generate:
            from service.cli.label_revise import generate_comparisons

            comparisons = generate_comparisons(args)
        else:
            comparisons = _comparisons(store, args, rater)
        started = time.perf_counter()
        if args.revise:
            from service.cli.label_revise import revise

            summary = revise(store, judge, constitution, comparisons, rater, args)
        else:
            summary = _label(store, judge, constitution, comparisons, rater, args)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    summary["pairs_per_s"] = round(summary["pairs_judged"] / max(summary["seconds"], 1e-9), 3)
    print(json.dumps(summary), flush=True)
    return 0


def _model_name(args) -> str:
    if args.judge_name:
        name = args.judge_name
    else:
        target = args.judge.partition(":")[2].rstrip("/")
        name = Path(target).name if args.judge.startswith("local:") else re.sub(r"^https?://", "", target)
    return re.sub(r"[^A-Za-z0-9_.@/-]+", "-", name).replace("/", "-") or "judge"


def _check_models(args) -> None:
    """A local judge or policy that cannot be loaded is refused here, in one line, before any work."""
    from service.cli.model_refs import check_model_ref

    fix = "; pass a causal LM folder or run `bradley models prepare smollm2`"
    if args.judge.startswith("local:"):
        check_model_ref(args.judge.partition(":")[2], "--judge local:", causal=True, fix=fix)
    if args.generate:
        check_model_ref(args.generate, "--generate", causal=True, fix=fix)


def _judge(args, constitution):
    from rm.judge import make_judge
    from rm.model import device as devices

    options = {"labels": constitution.labels, "batch_size": args.batch_size,
               "reuse_prefix": not args.no_prefix_reuse, "timeout": args.timeout,
               "retries": args.retries, "concurrency": args.concurrency}
    if args.judge.startswith("local:"):
        options["device"] = str(devices.resolve(args.device))
    return make_judge(args.judge, constitution.split, **options)


def _comparisons(store, args, rater: str) -> list:
    from annotation.rlaif.orders import Comparison

    table = store.comparisons(args.raters_prefix, rater if args.pairs == "unlabeled" else None,
                              args.limit)
    return [Comparison(r["prompt"], json.loads(r["messages"]) if r["messages"] else None,
                       r["a"], r["b"], r["model_a"], r["model_b"]) for r in table.to_pylist()]


def _label(store, judge, constitution, comparisons, rater, args) -> dict:
    from annotation.rlaif.orders import plan

    tasks = plan([c.key for c in comparisons], constitution, args.principles, args.seed)
    probs: dict[tuple[int, str], list[tuple[float, float]]] = {}
    failures = 0
    bar = _bar(len(comparisons))
    per = max(len(tasks) // max(len(comparisons), 1), 1)
    for start in range(0, len(tasks), CHUNK * per):
        chunk = tasks[start:start + CHUNK * per]
        items = [_item(comparisons[t.comparison], t.order, constitution.principles[t.principle].text)
                 for t in chunk]
        for task, p in zip(chunk, judge.prefer(items), strict=True):
            if p is None:
                failures += 1
                continue
            weight = constitution.principles[task.principle].weight
            probs.setdefault((task.comparison, task.order), []).append((p, weight, task.principle))
        bar.update(len({t.comparison for t in chunk}))
    bar.close()
    return _write(store, constitution, comparisons, probs, rater, failures, judge)


def _item(c, order: str, principle: str) -> tuple:
    first, second = (c.a, c.b) if order == "ab" else (c.b, c.a)
    return (c.prompt, first, second, principle)


def _write(store, constitution, comparisons, probs, rater, failures, judge) -> dict:
    from annotation.rlaif.orders import collapsed_winner, judgment_row, weighted_mean

    rows, both, consistent, ties = [], 0, 0, 0
    for i, c in enumerate(comparisons):
        p = {}
        for order in ("ab", "ba"):
            got = probs.get((i, order))
            if not got:
                continue
            p[order] = weighted_mean([g[0] for g in got], [g[1] for g in got])
            texts = [constitution.principles[g[2]].text for g in got]
            rows.append(judgment_row(c, order, p[order], texts, rater))
        if len(p) == 2:
            both += 1
            consistent += (p["ab"] > 0.5) == (p["ba"] < 0.5)
            ties += collapsed_winner(p["ab"], p["ba"]) == "tie"
    written, batch = 0, None
    if rows:
        from service.remote.stores import write_judgments

        written, batch = write_judgments(store, rows, f"rlaif:{constitution.name}")
    return {"pairs_judged": len(comparisons), "judgments_written": written,
            "forwards": getattr(judge, "forwards", None),
            "position_consistency": round(consistent / both, 4) if both else None,
            "ties": ties, "failures": failures, "rater": rater, "batch_id": batch}


def _bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="label", unit="pair", file=sys.stderr, disable=None)
