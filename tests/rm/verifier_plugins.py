"""Verifiers the pool tests register by import path (workers import them; functions cannot travel)."""

import time

from rm.verifiers import Verdict


def sleepy(response, ground_truth, seconds: float = 30.0):
    """A checker that hangs: sleeps `seconds`, then claims success."""
    time.sleep(seconds)
    return Verdict(1.0, True, True, "ok", response)


def crash(response, ground_truth):
    """A checker whose process dies without answering."""
    import os

    os._exit(3)
