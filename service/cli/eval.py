"""`bradley eval MODEL [--data FILE] [--benchmark rewardbench|rewardbench2] [--server URL]
[--html OUT]`: a reward model's accuracy on pairs (rm/eval/pairs.py), or a leaderboard's file scored by
its rules (rm/eval/benchmarks.py).

The model is a store id or a folder, loaded here; with `--server URL` the same file is scored through
that running `bradley serve`'s /score instead, after checking that it serves MODEL, so a served model
gets the numbers the local one gets, and without `--data` the validation split of the model's
snapshot comes from that server's store (service/remote/stores.py). A progress bar counts the responses
scored when stderr is a terminal. The last stdout line is the JSON result; a table goes to stderr
and `--html OUT` writes a page with a per-subset bar chart (service/cli/eval_html.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rm.eval.benchmarks import BENCHMARKS
from service.cli.model_refs import check_model_ref
from service.client import MAX_ITEMS, ClientError

REQUEST_BYTES = 4 * 1024 * 1024  # first guess at a /score body; halved while the server says 413


def add(sub) -> None:
    p = sub.add_parser("eval", help="accuracy, calibration and length correlation of a reward model, "
                                    "or its RewardBench / RewardBench 2 scores")
    p.add_argument("model", metavar="MODEL", help="model id in the store or a model folder")
    p.add_argument("--data", default=None, help="prompt/chosen/rejected rows or LLMBar JSON; with "
                   "--benchmark, the benchmark's own Parquet or JSONL file")
    p.add_argument("--benchmark", default=None, choices=list(BENCHMARKS),
                   help="score --data by the leaderboard's rules: subsets, sections and overall score")
    p.add_argument("--html", default=None, metavar="OUT", help="also write an HTML page with a "
                   "per-subset bar chart")
    p.add_argument("--reference-stats", action="store_true",
                   help="also write the model's reference statistics into its folder (what "
                        "ensembles and the serving watch compare with): hidden-state mean and "
                        "covariance from the snapshot's training pairs (with --data: half of the "
                        "file's prompts), scores and distances from the evaluated pairs (the other "
                        "half)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch-size", type=int, default=16, help="responses per forward")


def run(args) -> int:
    if args.benchmark and not args.data:
        raise ValueError("--benchmark needs --data FILE: the benchmark's Parquet or JSONL file")
    if Path(args.model).is_dir():
        check_model_ref(args.model, "model", fix="; pass a folder a reward model was saved to, or a "
                        "registered model id (`bradley models list`)")
    if args.reference_stats and (args.server or args.benchmark):
        raise ValueError("--reference-stats reads hidden states of pairs: load the model here "
                         "(no --server) and evaluate pairs (no --benchmark)")
    if args.server:
        from service.remote.commands import server

        with server(args.server, f"eval through {args.server}") as client:
            scorer = ServedScorer(client, expected_model_id(args.model))
            rows = _rows(args, {} if args.data else _served_config(args))
            result = {"model_id": scorer.model_id, "server": args.server,
                      "data": args.data or "validation", **_evaluate(args, scorer, rows)}
    else:
        from rm.model.reward_model import RewardModel

        folder, config = _folder_and_config(args)
        rows = _rows(args, config)
        model = RewardModel.load(folder, device=args.device)
        result = {"model_id": model.model_id, "path": str(folder), "data": args.data or "validation",
                  **_evaluate(args, ScoringProgress(model), rows)}
        if args.reference_stats:
            result["reference_stats"] = _write_reference_stats(args, model, folder, config, rows)
    _report(args, result)
    print(json.dumps(result, default=str), flush=True)
    return 0


def _rows(args, config: dict) -> list[dict]:
    if args.benchmark:
        from rm.eval.benchmarks import read_benchmark

        return read_benchmark(args.data, args.benchmark)
    if args.data:
        from rm.eval.pairs import load_pairs_file

        return load_pairs_file(args.data)
    from rm.eval.pairs import validation_split

    return validation_split(_snapshot_pairs(args, config), config.get("val_fraction", 0.1))


def _evaluate(args, scorer, rows: list[dict]) -> dict:
    """The benchmark's scores, or the pairs statistics; `scorer.score(prompts, responses,
    batch_size=)` is a RewardModel's or a ServedScorer's."""
    if args.benchmark:
        from rm.eval.benchmarks import evaluate_benchmark

        def score(prompts, responses):
            return scorer.score(prompts, responses, batch_size=args.batch_size)

        return evaluate_benchmark(score, rows, args.benchmark)
    from rm.eval.pairs import evaluate_rows

    return evaluate_rows(scorer, rows, args.batch_size)


def _report(args, result: dict) -> None:
    from service.cli.eval_html import table, write_html

    print(table(result), file=sys.stderr, flush=True)
    if args.html:
        write_html(args.html, result)


def _write_reference_stats(args, model, folder: str, config: dict, rows: list[dict]) -> dict:
    """rm/model/reference_stats.py's statistics, written into `folder`. Validation side: the
    evaluated pairs' responses; fitting side: the snapshot's training pairs, or with --data the
    pairs of half the file's prompts (by prompt hash), the other half being the validation side."""
    from rm.model.reference_stats import compute_reference_stats, write_reference_stats
    from rm.train.reward_data import row_prompt, split_of

    def items(pairs):
        return [(row_prompt(r), r[side]) for r in pairs for side in ("chosen", "rejected")]

    if args.data:
        halves = [split_of(json.dumps(r["prompt"], sort_keys=True), 0.5) for r in rows]
        fit = [r for r, h in zip(rows, halves, strict=True) if h == "train"]
        rows = [r for r, h in zip(rows, halves, strict=True) if h == "val"]
        source = f"--data {args.data}"
    else:
        fraction, source = config.get("val_fraction", 0.1), f"snapshot {config['snapshot_id']}"
        fit = [r for r in _snapshot_pairs(args, config)
               if split_of(r["prompt_id"], fraction) == "train"]
    stats = compute_reference_stats(model, items(fit), items(rows), batch_size=args.batch_size,
                                    source=source)
    path = write_reference_stats(folder, stats)
    print(f"reference statistics: {path}", file=sys.stderr, flush=True)
    return {**stats.as_json(), "path": str(path)}


def _snapshot_pairs(args, config: dict) -> list[dict]:
    """The pairs of the model's snapshot, which training split by prompt hash (`val_fraction`)."""
    from service.remote.stores import open_store

    if not config.get("snapshot_id"):
        raise ValueError("the model records no snapshot to take a validation split from; "
                         "pass --data FILE")
    with open_store(args, read_only=True) as store:
        return store.pairs(config["snapshot_id"]).to_pylist()


# --- the model: a folder, a registered id, or a server ----------------------------------------


def _folder_and_config(args) -> tuple[str, dict]:
    from rm.model.reward_model import TRAIN_CONFIG, read_json

    if Path(args.model).is_dir():
        return args.model, read_json(Path(args.model) / TRAIN_CONFIG)
    if "/" in args.model or args.model.startswith("."):
        raise ValueError(f"{args.model}: no such model folder (and model ids have no /)")
    return _registered(args, args.model)


def _registered(args, model_id: str) -> tuple[str, dict]:
    """(folder, train config) of a registered model, its weights checked against the registry."""
    from rm.model.reward_model import TRAIN_CONFIG, read_json
    from service.engine.registry import check_row
    from service.remote.stores import open_store

    with open_store(args, read_only=True) as store:
        row = store.model(model_id)
    folder = check_row(row)
    return folder, {**read_json(Path(folder) / TRAIN_CONFIG), **(row.get("config") or {})}


def _served_config(args) -> dict:
    """The train config of the model a server serves: its folder's here, or its registered row's
    (the folder is the server's and need not be here)."""
    from service.remote.stores import open_store

    if Path(args.model).is_dir():
        return _folder_and_config(args)[1]
    with open_store(args, read_only=True) as store:
        return store.model(args.model).get("config") or {}


def expected_model_id(model: str) -> str:
    """The id a server reports for MODEL: a folder's recorded model_id (else its name, as
    RewardModel.load names it), or MODEL itself."""
    from rm.model.reward_model import TRAIN_CONFIG, read_json

    folder = Path(model)
    if folder.is_dir():
        config = read_json(folder / TRAIN_CONFIG) if (folder / TRAIN_CONFIG).is_file() else {}
        return config.get("model_id", folder.name)
    return model


def _bar(total: int):
    from tqdm import tqdm

    # mininterval=0: a batch's update always shows, even one that ends the bar within 0.1 s
    return tqdm(total=total, desc="eval", unit="response", file=sys.stderr, disable=None, leave=False,
                mininterval=0)


class ScoringProgress:
    """A RewardModel's `score` with a progress bar: the batches RewardModel.score forms (length-
    sorted, `batch_size` sequences each), so the scores are the same to the bit."""

    def __init__(self, model):
        self.model = model

    def score(self, prompts: list, responses: list, batch_size: int = 32) -> list[float]:
        ids = self.model.encode(prompts, responses)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        scores = [0.0] * len(ids)
        with _bar(len(ids)) as bar:
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                for i, value in zip(chunk, self.model.score_encoded([ids[i] for i in chunk]),
                                    strict=True):
                    scores[i] = value
                bar.update(len(chunk))
        return scores


class ServedScorer:
    """Scores through a server's /score in requests of at most MAX_ITEMS items and `budget` bytes
    (halved while the server answers 413), each answer checked to come from `model_id`."""

    def __init__(self, client, model_id: str):
        served = client.request("GET", "/readyz").get("model")
        if served != model_id:
            raise ValueError(f"{client.url} serves {served}, not {model_id}; evaluate {served}, or "
                             f"load {model_id} there first (POST /models/{model_id}/load)")
        self.client, self.model_id, self.budget = client, model_id, REQUEST_BYTES

    def score(self, prompts: list, responses: list, batch_size: int | None = None) -> list[float]:
        scores: list[float] = []
        start, bar = 0, _bar(len(responses))
        while start < len(responses):
            end = self._chunk_end(prompts, responses, start)
            try:
                answer = self.client.score_full(prompts[start:end], responses[start:end])
            except ClientError as exc:
                if exc.status != 413 or end - start == 1:
                    raise
                self.budget //= 2
                continue
            if answer.get("model") != self.model_id:
                raise ValueError(f"{self.client.url} switched from {self.model_id} to "
                                 f"{answer.get('model')} during the evaluation; run it again")
            scores += answer["scores"]
            start = end
            bar.update(len(answer["scores"]))
        bar.close()
        return scores

    def _chunk_end(self, prompts: list, responses: list, start: int) -> int:
        """The end of the longest run of items from `start` whose JSON fits the byte budget (at
        least one item)."""
        size, end = 0, start
        while end < len(responses) and end - start < MAX_ITEMS:
            size += len(json.dumps({"prompt": prompts[end], "response": responses[end]})) + 2
            if size > self.budget and end > start:
                break
            end += 1
        return end
