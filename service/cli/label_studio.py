"""`bradley label-studio setup|push|pull`: the Label Studio loop (annotation/label_studio/sync.py) from
the command line. The API key comes from LABEL_STUDIO_API_KEY only. Each action prints one JSON line.

    bradley label-studio setup --url http://127.0.0.1:8080 --title "RM round 3" --overlap 3
    bradley label-studio push --url http://127.0.0.1:8080 --select uncertain --model rm-3f2a --limit 200
    bradley label-studio pull --url http://127.0.0.1:8080
"""

from __future__ import annotations

import json
import os
import sys

URL_ENV = "LABEL_STUDIO_URL"


def add(sub) -> None:
    p = sub.add_parser("label-studio", help="set up, push to and pull from a Label Studio server",
                       description="The API key is read from LABEL_STUDIO_API_KEY (never a flag).")
    actions = p.add_subparsers(dest="action", required=True)
    setup = actions.add_parser("setup", help="find or create the pairwise project; record it")
    push = actions.add_parser("push", help="send the pairs that need labels as tasks")
    pull = actions.add_parser("pull", help="take every new, edited or deleted verdict back")
    for q in (setup, push, pull):
        q.add_argument("--url", default=os.environ.get(URL_ENV),
                       help=f"Label Studio base URL (env {URL_ENV})")
    setup.add_argument("--title", required=True, help="project title (found, or created)")
    setup.add_argument("--overlap", type=int, default=1, help="raters per task (maximum_annotations)")
    for q in (push, pull):
        q.add_argument("--project", type=int, default=None,
                       help="project id (default: the one set up last for this URL)")
    push.add_argument("--select", default="random",
                      choices=["uncertain", "disagreement", "coverage", "random"],
                      help="which pairs to send first")
    push.add_argument("--model", default=None, help="reward model (store id or folder) for uncertain")
    push.add_argument("--limit", type=int, default=100, help="pairs to send at most")
    push.add_argument("--seed", type=int, default=0, help="seed of the random selection and left/right draws")
    pull.add_argument("--on-error", default="abort", choices=["abort", "skip"],
                      help="abort: one invalid annotation writes nothing; skip: store it in rejects")
    pull.add_argument("--full", action="store_true", help="re-read every task, not only updated ones")


def run(args) -> int:
    from annotation.ingest.batch import IngestError
    from annotation.label_studio import sync as ls
    from annotation.store import Store

    if not args.url:
        raise ValueError(f"pass --url or set {URL_ENV} to the Label Studio base URL")
    client = ls.connect(args.url)
    with Store(args.db) as store:
        if args.action == "setup":
            summary = ls.setup(store, client, args.url, args.title, args.overlap)
        elif args.action == "push":
            proj = ls.project(store, args.url, args.project)
            scorer = _scorer(store, args.model) if args.model else None
            summary = ls.push(store, client, proj, args.select, args.limit, scorer, args.seed)
        else:
            proj = ls.project(store, args.url, args.project)
            try:
                summary = ls.pull(store, client, proj, args.on_error, args.full)
            except IngestError as exc:
                print("\n".join(exc.errors), file=sys.stderr)
                raise ValueError(f"{len(exc.errors)} invalid annotation(s); nothing was written "
                                 "(fix them in Label Studio, or pull --on-error skip)") from None
    print(json.dumps(summary, default=str), flush=True)
    return 0


def _scorer(store, ref: str):
    """score(prompts, responses) of a reward model given by store id or folder (rm's public API)."""
    from pathlib import Path

    from rm.model.reward_model import RewardModel

    path = ref if Path(ref).is_dir() else store.model(ref)["path"]
    model = RewardModel.load(path)
    return model.score
