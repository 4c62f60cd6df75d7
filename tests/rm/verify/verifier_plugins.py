"""Verifiers the pool tests register by import path (workers import them; functions cannot travel)."""

import json
import time

from rm.verify.rules import Verdict


def sleepy(response, ground_truth, seconds: float = 30.0):
    """A checker that hangs: sleeps `seconds`, then claims success."""
    time.sleep(seconds)
    return Verdict(1.0, True, True, "ok", response)


def crash(response, ground_truth):
    """A checker whose process dies without answering."""
    import os

    os._exit(3)


def whole_calls(body, context, run):
    """A whole-request handler for the pool's own tests: the body is a JSON list of calls; the
    reply is their rewards; `context["meta"]` is added to the answer; a body "boom" raises;
    `sleep_before` / `sleep_after` seconds stall it outside its calls; `echo` answers the body."""
    body = bytes(body)  # a memoryview of the shared inbox
    if context.get("echo"):
        return {"n": len(json.loads(body))}, body
    if body == b"boom":
        raise RuntimeError("boom")
    time.sleep(context.get("sleep_before", 0))  # decoding that takes long
    verdicts = run(json.loads(body))
    time.sleep(context.get("sleep_after", 0))  # answering that takes long
    return {"n": len(verdicts), **context.get("meta", {})}, json.dumps([v.reward for v in verdicts]).encode()
