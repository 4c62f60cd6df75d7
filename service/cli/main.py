"""`bradley` command line: argparse in front of the library; errors are translated here, once.

Each subcommand is a pair: `_add_<name>(subparsers)` declares its arguments, `cmd_<name>(args)` calls
the library and prints; larger ones live in a module of their own (service/cli/train.py: `train`,
service/cli/eval.py: `eval`) and are only registered in COMMANDS here. Heavy imports (torch, transformers) happen inside the command that needs them,
so `bradley --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from service.cli import eval as cli_eval
from service.cli import label as cli_label  # subcommands in modules of their own
from service.cli import label_studio as cli_label_studio
from service.cli import models as cli_models
from service.cli import snapshots as cli_snapshots
from service.cli import train as cli_train
from service.cli import watch as cli_watch
from service.ports import PortInUse
from service.remote.stores import open_store

# Exit statuses (docs/getting-started.md lists them): 0 done, 1 an error (one line on stderr), 2 a
# command line argparse refused, 3 a `report --fail-on` rule crossed (analysis/report.py), 4
# `serve`'s port is in use, 130 interrupted.
EXIT_ERROR = 1
EXIT_PORT_IN_USE = 4
UVICORN_STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot bind (the port taken meanwhile)


def _print_json(obj) -> None:
    print(json.dumps(obj, default=str), flush=True)


# --- ingest / export / simulate ---------------------------------------------------------------


def _add_ingest(sub) -> None:
    p = sub.add_parser("ingest", help="load labeled comparisons or feedback into the store")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="JSONL/JSON/CSV/Parquet (optionally .gz), a saved HF dataset folder, or hf:SPEC")
    p.add_argument("--format", default="auto",
                   choices=["auto", "trl", "hh", "judgments", "kto", "label-studio", "hf"],
                   help="row format (auto: from the first row's columns)")
    p.add_argument("--on-error", default="abort", choices=["abort", "skip"],
                   help="abort: a bad row writes nothing from that file; skip: store bad rows in rejects")
    p.add_argument("--source-model", default=None, help="record this model as the author of responses")


def cmd_ingest(args) -> int:
    from annotation.ingest.batch import IngestError, ingest_file

    status = 0
    with open_store(args, create=True) as store:
        for path in args.files:
            try:
                result = ingest_file(store, path, fmt=args.format, on_error=args.on_error,
                                     progress=sys.stderr.isatty(), source_model=args.source_model)
            except IngestError as exc:  # abort mode: every bad row, then on to the next file
                print("\n".join(exc.errors), file=sys.stderr)
                print(exc.result.summary() if exc.result else f"{path}: nothing written",
                      file=sys.stderr, flush=True)
                status = EXIT_ERROR
                continue
            print(result.summary(), flush=True)
    return status


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write resolved pairs or judgments out of the store")
    p.add_argument("out", metavar="OUT", help="a file (written through a symlink), a FIFO, or - for "
                                              "standard output")
    p.add_argument("--format", required=True, choices=["trl", "jsonl", "parquet", "hf"],
                   help="trl: resolved pairs; jsonl, parquet: every judgment; hf: a saved dataset")
    p.add_argument("--snapshot", default=None, help="reproduce exactly what a past run read")
    p.add_argument("--raters", default=None, help="human | ai | a rater id prefix")
    p.add_argument("--as", dest="shape", default="auto", choices=["auto", "text", "conversational"],
                   help="trl: one prompt shape for the whole file (auto: the store's, "
                        "conversational when it holds both)")


def cmd_export(args) -> int:
    from annotation.export import export
    from annotation.outputs import is_stdout

    with open_store(args, read_only=True) as store:
        summary = export(store, args.format, args.out, snapshot_id=args.snapshot, raters=args.raters,
                         shape=args.shape)
    # the rows went to standard output: the summary must not join them
    print(json.dumps(summary, default=str), file=sys.stderr if is_stdout(args.out) else sys.stdout,
          flush=True)
    return 0


def _add_simulate(sub) -> None:
    p = sub.add_parser("simulate", help="write synthetic judgments with known truth (+ OUT.truth.json)")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--prompts", type=int, default=200, help="prompts to simulate")
    p.add_argument("--responses", type=int, default=4, help="responses per prompt")
    p.add_argument("--raters", type=int, default=8, help="raters in all (human and ai)")
    p.add_argument("--length-bias", type=float, default=0.5,
                   help="planted logistic coefficient on the standardized length difference")
    p.add_argument("--cycle-rate", type=float, default=0.1,
                   help="share of prompts where two rater groups judge by different criteria")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed, the same file")
    p.add_argument("--raters-per-pair", type=int, default=3, help="raters who judge each pair")
    p.add_argument("--pairs-per-prompt", type=int, default=None, help="default: every pair")
    p.add_argument("--ai-raters", type=int, default=1, help="how many raters are ai:… judges")
    p.add_argument("--noisy-share", type=float, default=0.25, help="share of noisy raters")
    p.add_argument("--adversarial-share", type=float, default=0.125,
                   help="share of adversarial raters (report the opposite verdict)")
    p.add_argument("--tie-rate", type=float, default=0.05, help="share of verdicts that are ties")


def cmd_simulate(args) -> int:
    from annotation.simulate import SimulationConfig, simulate

    names = ("prompts", "responses", "raters", "length_bias", "cycle_rate", "seed", "raters_per_pair",
             "pairs_per_prompt", "ai_raters", "noisy_share", "adversarial_share", "tie_rate")
    config = SimulationConfig(**{name: getattr(args, name) for name in names})
    _print_json(simulate(args.out, config))
    return 0


# --- report -----------------------------------------------------------------------------------


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="length bias, agreement, cycles and loss floors of the store")
    p.add_argument("--raters", default=None, help="human | ai | a rater id prefix")
    p.add_argument("--snapshot", default=None,
                   help="re-read exactly what an earlier report or training run read (its snapshot id)")
    p.add_argument("--html", default=None, metavar="OUT", help="write one self-contained HTML page "
                                                               "(- for standard output)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the full report as JSON (- for "
                                                               "standard output)")
    p.add_argument("--fail-on", default=None, metavar="RULES",
                   help="e.g. 'length_bias>0.65,alpha<0.2,gap>0.05' (names: length_bias, slope, "
                        "alpha, agreement, gap, entropy_floor, bt_floor, cyclic_triads, or a dotted "
                        "path into the JSON): exit 3 when crossed")
    p.add_argument("--memory-limit", default="512MB", metavar="SIZE",
                   help="memory for DuckDB's share of the report (e.g. 256MB, 2GB; it spills to disk "
                        "beyond it; the rest works on blocks of prompts); default 512MB")


def cmd_report(args) -> int:
    from analysis import report

    return report.run(args.db, raters=args.raters, snapshot_id=args.snapshot, html=args.html,
                      json_out=args.json, fail_on=args.fail_on, memory_limit=args.memory_limit)


# --- serving and the rest ---------------------------------------------------------------------


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="HTTP service: /score, uploads, reports, metrics",
                       description="Every setting also reads BRADLEY_<NAME> from the environment "
                       "(BRADLEY_API_KEYS, BRADLEY_MAX_WAIT_MS, ...; see service/api/settings.py).")
    p.add_argument("--host", default=None, help="default 127.0.0.1 (env BRADLEY_HOST)")
    p.add_argument("--port", type=int, default=None, help="default 8000 (env BRADLEY_PORT)")
    p.add_argument("--model", default=None, action="append",
                   help="model id in the store or a model folder; repeated, an ensemble whose "
                        "members' standardised scores are combined (env BRADLEY_MODEL=A,B)")
    p.add_argument("--aggregate", default=None, choices=["mean", "min", "uwo"],
                   help="how an ensemble combines its members: mean, min (worst case) or uwo "
                        "(mean - λ·std); default mean (env BRADLEY_ENSEMBLE_AGGREGATE)")
    p.add_argument("--uncertainty-weight", type=float, default=None, metavar="λ",
                   help="λ of uwo; default 1 (env BRADLEY_ENSEMBLE_UNCERTAINTY_WEIGHT)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (env BRADLEY_DEVICE)")
    p.add_argument("--read-only", action="store_true", help="serve scores only; refuse writes")


def cmd_serve(args) -> int:
    from service.api import app
    from service.api.settings import load_settings
    from service.ports import PortInUse, check_port

    settings = load_settings(host=args.host, port=args.port)
    check_port(settings.host, settings.port)  # before the store and the model are loaded
    try:
        return app.serve_from_args(args)
    except SystemExit as exc:
        if exc.code != UVICORN_STARTUP_FAILURE:
            raise
        raise PortInUse(f"could not listen on {settings.host}:{settings.port} (taken since it was "
                        "checked?); pass --port N (env BRADLEY_PORT)") from None


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="simulate → ingest → report → train a small RM → serve → score")
    p.add_argument("--workdir", default="demo", help="folder for the demo's files")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated data")


def cmd_demo(args) -> int:
    from service.cli import demo

    return demo.run(main, args.workdir, db=args.db, seed=args.seed)


# Commands that work through a running `bradley serve` with --server URL: ingest and report in
# service/remote/commands.py, the others read and write through service/remote/stores.py's RemoteStore.
SERVER_COMMANDS = ("ingest", "report", "export", "train rm", "train po", "eval", "label",
                   "snapshots", "models list", "models register", "watch")
REMOTE_HANDLERS = ("ingest", "report")
NO_STORE = ("simulate", "models prepare", "watch")  # commands that never open a store
COMMANDS: dict[str, tuple[Callable, Callable]] = {
    "ingest": (_add_ingest, cmd_ingest),
    "export": (_add_export, cmd_export),
    "simulate": (_add_simulate, cmd_simulate),
    "report": (_add_report, cmd_report),
    "train": (cli_train.add, cli_train.run),
    "eval": (cli_eval.add, cli_eval.run),
    "label": (cli_label.add, cli_label.run),
    "label-studio": (cli_label_studio.add, cli_label_studio.run),
    "serve": (_add_serve, cmd_serve),
    "models": (cli_models.add, cli_models.run),
    "demo": (_add_demo, cmd_demo),
    "snapshots": (cli_snapshots.add, cli_snapshots.run),
    "watch": (cli_watch.add, cli_watch.run),
}
DB_HELP = "DuckDB store (env BRADLEY_DB)"
SERVER_HELP = ("work through this running `bradley serve`, which holds the store (key from env "
               "BRADLEY_API_KEY); commands: " + ", ".join(SERVER_COMMANDS))


class DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, unless there is none to show (None, a switch
    that is off) or the help already says it.

    >>> parser = argparse.ArgumentParser(prog="x", formatter_class=DefaultsShown)
    >>> _ = parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    >>> "learning rate (default: 0.1)" in parser.format_help()
    True
    """

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if not action.option_strings or nothing or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)".lstrip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bradley", formatter_class=DefaultsShown,
        description="Preference data and reward models: ingest comparisons, analyse them, train a "
                    "Bradley-Terry reward model or a policy, and serve scores over HTTP.")
    parser.add_argument("--db", default=os.environ.get("BRADLEY_DB", "bradley.duckdb"),
                        help=DB_HELP)  # shown with its default (DefaultsShown)
    parser.add_argument("--server", default=None, metavar="URL", help=SERVER_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    for path, leaf in leaves(parser, every=True):
        leaf.formatter_class = DefaultsShown
        if leaf.can_take_store_flags and " ".join(path) not in NO_STORE:
            add_store_flags(leaf, server=" ".join(path) in SERVER_COMMANDS)
    return parser


def leaves(parser: argparse.ArgumentParser, path: tuple = (), every: bool = False):
    """(command path, parser) of every command that takes no further subcommand (`every`: and of
    those that do, marked `can_take_store_flags = False`)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parser.can_take_store_flags = not subs
    if path and (every or not subs):
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*path, name), every)


def add_store_flags(parser: argparse.ArgumentParser, server: bool) -> None:
    """--db (and --server) after the command too: given there, they win over the ones before it
    (SUPPRESS: an absent flag leaves the global value alone)."""
    parser.add_argument("--db", default=argparse.SUPPRESS, help=DB_HELP + "; also before the command")
    if server:
        parser.add_argument("--server", default=argparse.SUPPRESS, metavar="URL",
                            help="work through this running `bradley serve` (key from env "
                                 "BRADLEY_API_KEY); also before the command")


def command_name(args) -> str:
    """`train rm`, `models list`, `eval`: the command as SERVER_COMMANDS names it."""
    sub = getattr(args, "kind", None) if args.command == "train" else getattr(args, "action", None)
    return f"{args.command} {sub}" if sub and args.command in ("train", "models") else args.command


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler, name = COMMANDS[args.command][1], command_name(args)
    if args.server:
        if name not in SERVER_COMMANDS:
            print(f"bradley {name}: error: --server works with {', '.join(SERVER_COMMANDS)}; "
                  f"the server's other routes are in the manual's HTTP reference (docs/)", file=sys.stderr)
            return EXIT_ERROR
        if args.command in REMOTE_HANDLERS:
            from service.remote import commands as cli_server

            handler = getattr(cli_server, args.command)
    try:
        return handler(args) or 0
    except BrokenPipeError:  # `bradley report | head -1`: the reader has what it wanted
        quiet_stdout()
        return 0
    except PortInUse as exc:
        print(f"bradley {name}: error: {exc}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    except (ValueError, OSError) as exc:  # library errors name the fix; no traceback for bad input
        print(f"bradley {name}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"bradley {name}: interrupted", file=sys.stderr)
        return 130


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail on the
    closed pipe too (the recipe of Python's signal documentation, "Note on SIGPIPE")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (captured in a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
