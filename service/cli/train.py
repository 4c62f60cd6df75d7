"""`bradley train rm|po`: arguments → typed run configs, the store's snapshot
handed to rm/ as rows with its loss floors, the model registered afterwards.

The library (rm/train/reward.py, rm/train/policy.py) never opens the store: this edge reads the
snapshot on rank 0 only (under torchrun every rank runs the CLI; rm/train/run.py calls `inputs()` on
rank 0), hands the reference-log-prob cache to policy runs, and registers the published folder
(service/engine/registry.py: refuses a registered `--out` unless `--overwrite`, which retires the older id).

The store is the `--db` file, or with `--server URL` the store of a running `bradley serve`
(service/remote/stores.py): the snapshot is taken and its rows streamed from the server, training runs
here, and the model is registered through the server's POST /models. When the file is locked by the
time training ends, the weights stay where they were published and the error says how to register
them (`bradley models register FOLDER`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from service.remote.stores import open_store

LOSSES = ("dpo", "ipo", "kto", "simpo", "orpo")


def add(sub) -> None:
    p = sub.add_parser("train", help="train a reward model (rm) or a policy (po)")
    kinds = p.add_subparsers(dest="kind", required=True)
    rm = kinds.add_parser("rm", help="Bradley-Terry reward model")
    po = kinds.add_parser("po", help="preference optimization: dpo, ipo, kto, simpo, orpo")
    po.add_argument("--loss", required=True, choices=LOSSES, help="the objective")
    for q in (rm, po):
        _add_common(q)
    rm.add_argument("--soft-labels", action="store_true", help="train on vote shares p̂, not majorities")
    rm.add_argument("--margin", action="store_true", help="use judgment strength as a BT margin")
    rm.add_argument("--center", type=float, default=0.0, help="reward-centering coefficient λ")
    po.add_argument("--beta", type=float, default=0.1, help="strength of the pull towards the "
                    "reference policy (DPO, IPO, KTO) or reward scale (SimPO)")
    po.add_argument("--gamma", type=float, default=0.5, help="SimPO target margin")
    po.add_argument("--lambda", dest="lam", type=float, default=0.1, help="ORPO odds-ratio weight")
    po.add_argument("--label-smoothing", type=float, default=0.0,
                    help="DPO: assumed share of flipped labels (conservative DPO)")
    po.add_argument("--robust", action="store_true", help="DPO: unbiased robust variant of the smoothing")
    po.add_argument("--desirable-weight", type=float, default=1.0, help="KTO weight λ_D")
    po.add_argument("--undesirable-weight", type=float, default=1.0, help="KTO weight λ_U")


def _add_common(q) -> None:
    q.add_argument("--base-model", default="tiny", help="HF id, local folder, or 'tiny'")
    q.add_argument("--out", default=None, help="output folder (default models/<id>)")
    q.add_argument("--overwrite", action="store_true",
                   help="replace the registered model in --out (its id is retired)")
    q.add_argument("--snapshot", default=None,
                   help="train on this snapshot's data again (default: a new snapshot of all now)")
    q.add_argument("--raters", default=None, help="human | ai | a rater id prefix (default: all)")
    q.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    q.add_argument("--epochs", type=float, default=1.0, help="passes over the training pairs")
    q.add_argument("--steps", type=int, default=None,
                   help="stop after N optimizer steps (default: as many as --epochs take)")
    q.add_argument("--batch-size", type=int, default=8, help="pairs per optimizer step")
    q.add_argument("--grad-accum", type=int, default=1,
                   help="batches whose gradients add up before each optimizer step")
    q.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: 1e-3 for tiny; for a pretrained base 5e-5 "
                        "for rm, 5e-6 for po, larger with --lora-rank)")
    q.add_argument("--max-length", type=int, default=512,
                   help="tokens per sequence; longer ones lose prompt tokens from the left (the "
                        "run says how many pairs were cut)")
    q.add_argument("--seed", type=int, default=0, help="seed of initialisation, split and order")
    q.add_argument("--max-seconds", type=float, default=None,
                   help="stop training after this long (default: no limit)")
    q.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of prompts held out for validation (split by prompt hash)")
    q.add_argument("--eval-every", type=int, default=None,
                   help="optimizer steps between evals (default: 5 evaluations per run)")
    q.add_argument("--patience", type=int, default=3,
                   help="evaluations without a better validation loss before stopping early")
    q.add_argument("--warmup-ratio", type=float, default=0.1,
                   help="share of the steps over which the learning rate rises to --lr")
    q.add_argument("--gradient-checkpointing", type=int, nargs="?", const=1, default=0, metavar="N",
                   help="recompute layer activations in the backward pass (every N-th layer; "
                        "default every layer): less memory, about one more forward per step")
    q.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard parameters, gradients and optimizer state over the "
                        "processes (FSDP2) instead of a whole copy in each (DDP)")
    q.add_argument("--lora-rank", type=int, default=0, metavar="R",
                   help="train low-rank adapters of rank R on the linear layers instead of every "
                        "weight (0: full fine-tuning); the folder holds the merged weights")
    q.add_argument("--lora-alpha", type=float, default=None, metavar="A",
                   help="LoRA scale numerator: updates are (A/R)·B·A (default 2·R)")
    q.add_argument("--lora-dropout", type=float, default=0.0, metavar="P", help="dropout on the adapters' input")
    q.add_argument("--lora-targets", default="all-linear", metavar="NAMES",
                   help="comma-separated module names that take adapters, or all-linear")
    q.add_argument("--keep-adapter", action="store_true",
                   help="also save the adapter (peft format, with the score head) in OUT/adapter")


# --- arguments → configs -----------------------------------------------------------------------

LOOP_FLAGS = ("lr", "epochs", "steps", "batch_size", "grad_accum", "warmup_ratio", "eval_every",
              "patience", "max_seconds", "seed", "gradient_checkpointing")
RUN_FLAGS = ("base_model", "out", "device", "max_length", "val_fraction")


def lora_settings(args):
    """rm/train/lora.py's LoraSettings from the --lora-* flags and --keep-adapter."""
    from rm.train.lora import LoraSettings

    return LoraSettings(args.lora_rank, args.lora_alpha, args.lora_dropout, args.lora_targets,
                        args.keep_adapter)


def train_config(args):
    """rm/train/loop.py's TrainConfig from the flags of the same names."""
    from rm.train.loop import TrainConfig

    return TrainConfig(**{name: getattr(args, name) for name in LOOP_FLAGS})


def _run_fields(args) -> dict:
    """The fields both run configs take; `wrapping` is how a torchrun job spreads the model over
    its processes (rm/train/loop.py WRAPPERS)."""
    return {**{name: getattr(args, name) for name in RUN_FLAGS}, "train": train_config(args),
            "wrapping": "fsdp" if args.fsdp else "ddp", "lora": lora_settings(args)}


def reward_config(args):
    from rm.train.reward import RewardRunConfig

    return RewardRunConfig(**_run_fields(args), soft_labels=args.soft_labels, margin=args.margin,
                           center=args.center)


def policy_config(args):
    from rm.train.objectives import PoConfig
    from rm.train.policy import PolicyRunConfig

    objective = PoConfig(args.loss, args.beta, args.gamma, args.lam, args.label_smoothing,
                         args.robust, args.desirable_weight, args.undesirable_weight)
    return PolicyRunConfig(**_run_fields(args), objective=objective)


# --- the store's side --------------------------------------------------------------------------


def _snapshot_inputs(args, replaced: list) -> Callable:
    """`inputs()` for a run (called on rank 0 only): refuse a registered --out, freeze a snapshot
    and read its pairs (with margins for `--margin`), KTO feedback and the loss floors."""
    from rm.train.run import RunInputs
    from service.engine.registry import refuse_registered_out

    def inputs() -> RunInputs:
        with open_store(args) as store:
            replaced[:] = refuse_registered_out(store, args.out, args.overwrite)
            snapshot_id = args.snapshot or store.create_snapshot(args.raters)
            pairs = store.pairs(snapshot_id)
            given = RunInputs(pairs=pairs, snapshot_id=snapshot_id, raters=args.raters)
            if args.kind == "po":
                if args.loss == "kto":
                    given.feedback = store.feedback(snapshot_id)
                _say_reference_scope(args, len(pairs) + len(given.feedback or []))
                return given
            if args.margin and pairs.num_rows:
                given.pairs = _with_margins(store, snapshot_id, pairs)
            from analysis.cycles import loss_floors

            given.floors = loss_floors(store.verdict_arrays(snapshot_id))
            return given

    return inputs


def _with_margins(store, snapshot_id: str, pairs):
    import pyarrow as pa

    from rm.train.reward_data import pair_margins

    margins = pair_margins(store.judgments(snapshot_id), pairs)
    return pairs.append_column("margin", pa.array(margins, pa.float64()))


class StoreRefCache:
    """The store's `ref_logps` table (the file's, or the server's) as a policy run's reference
    cache, opened per call (rank 0)."""

    def __init__(self, args):
        self.args = args

    def ref_logps(self, model_hash: str, template: str, keys: list) -> dict:
        with open_store(self.args) as store:
            return store.ref_logps(model_hash, template, keys)

    def put_ref_logps(self, model_hash: str, template: str, rows: list) -> None:
        with open_store(self.args) as store:
            store.put_ref_logps(model_hash, template, rows)


BASE_MODEL_FIX = {"rm": "; pass a model folder, a hub id, `tiny`, or `bradley models prepare minilm`",
                  "po": "; pass a causal LM folder, a hub id, `tiny`, or `bradley models prepare "
                        "smollm2`"}


def run(args) -> int:
    """Train; on rank 0 register the model and print its metrics as the last stdout line."""
    from service.cli.model_refs import check_model_ref

    check_model_ref(args.base_model, "--base-model", causal=args.kind == "po",
                    fix=BASE_MODEL_FIX[args.kind])
    replaced: list[str] = []
    inputs = _snapshot_inputs(args, replaced)
    if args.kind == "rm":
        from rm.train.reward import train_reward_model

        metrics = train_reward_model(reward_config(args), inputs)
    else:
        from rm.train.policy import train_policy

        metrics = train_policy(policy_config(args), inputs, ref_cache=StoreRefCache(args))
    if metrics is not None:  # None on non-zero ranks under torchrun
        say_how_it_stopped(args, metrics)
        say_what_was_cut(args, metrics)
        _register(args, metrics, replaced)
        print(json.dumps(metrics, default=str), flush=True)
    return 0


def _say_reference_scope(args, rows: int) -> None:
    """One stderr line when --steps uses fewer rows than the reference pass will cover: the pass
    takes the whole snapshot, because its log-probs are kept in the store's cache (ref_logps) and
    a later run on this snapshot and base model then needs none."""
    used = args.steps * args.batch_size * args.grad_accum if args.steps else None
    if used is not None and used < rows:
        print(f"bradley train po: the reference pass covers all {rows:,} rows of the snapshot, "
              f"though --steps {args.steps} uses about {used:,}: its log-probs are kept in the "
              "store, so the next run on this snapshot and base model skips it", file=sys.stderr,
              flush=True)


STOPPED = {"early_stopping": "early stopping ended the run at step {steps}{of}: the validation "
                             "loss did not improve for {patience} evaluations (--patience); the "
                             "model is the best checkpoint, from step {best}",
           "time": "--max-seconds ended the run at step {steps}{of}"}


def say_how_it_stopped(args, metrics: dict) -> None:
    """One stderr line when the run ended before its steps or epochs were done, and why."""
    template = STOPPED.get(metrics.get("stopped"))
    if template:
        of = f" of {args.steps}" if args.steps else ""
        print(f"bradley train {args.kind}: " + template.format(
            steps=metrics.get("steps"), of=of, patience=args.patience, best=metrics.get("best_step")),
            file=sys.stderr, flush=True)


def say_what_was_cut(args, metrics: dict) -> None:
    """One stderr line when sequences were longer than --max-length (hh-rlhf's transcripts at 512
    tokens: a fifth of the pairs), which training saw cut."""
    cut = metrics.get("n_truncated", metrics.get("truncated")) or 0
    total = metrics.get("n_pairs") or metrics.get("pairs") or metrics.get("completions") or 0
    if cut:
        unit = "completions" if args.kind == "po" and args.loss == "kto" else "pairs"
        print(f"bradley train {args.kind}: {cut:,} of {total:,} {unit} were longer than --max-length "
              f"{metrics.get('max_length', args.max_length)} tokens and were cut to fit (the "
              "prompt's oldest tokens first); raise --max-length to keep them whole", file=sys.stderr, flush=True)


def _register(args, metrics: dict, replaced: list[str]) -> None:
    """Register the published folder in the store (the file, or the server's); a store locked
    meanwhile is an error that says where the weights are and how to register them later."""
    from annotation.store import StoreLockedError
    from service.cli.models import register_folder

    try:
        register_folder(args, metrics["path"], retire=replaced)
    except StoreLockedError as exc:
        raise StoreLockedError(
            f"the model is trained and saved in {metrics['path']}, but it is not registered: {exc}. "
            f"Register it once the store is free, or through the server that holds it: `bradley "
            f"[--server URL] models register {metrics['path']}`") from None
