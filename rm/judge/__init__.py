"""Judges by name: `local:PATH|ID` (rm/judge/local.py, next-token log-probs of a causal LM) or `openai:URL`
(rm/judge/openai_server.py, an OpenAI-compatible server). A module of its own so that neither judge module
imports the other's dispatch."""

from __future__ import annotations

from rm.judge.local import JudgeError, LocalJudge, Template
from rm.judge.openai_server import OpenAIJudge


def make_judge(spec: str, template: Template, **options):
    """`local:PATH|ID` or `openai:URL` → a judge with `name`, `prefer(items)` and `forwards`."""
    kind, _, target = spec.partition(":")
    if kind not in JUDGES or not target:
        raise JudgeError(f"--judge {spec!r}: expected local:PATH (a causal LM folder or id) or "
                         "openai:URL (an OpenAI-compatible server, e.g. openai:http://127.0.0.1:8080/v1)")
    return JUDGES[kind](target, template, **options)


def _local(target: str, template: Template, **options):
    known = {"labels", "batch_size", "reuse_prefix", "device"}
    return LocalJudge(target, template, **{k: v for k, v in options.items() if k in known})


def _openai(target: str, template: Template, **options):
    known = {"labels", "timeout", "retries", "concurrency", "model"}
    return OpenAIJudge(target, template, **{k: v for k, v in options.items() if k in known})


JUDGES = {"local": _local, "openai": _openai}
