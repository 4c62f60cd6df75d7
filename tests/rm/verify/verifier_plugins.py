"""Verifiers the pool tests register by import path (workers import them; functions cannot travel)."""

import time

from rm.verify.rules import Check


def sleepy(response, ground_truth, seconds: float = 30.0):
    """A checker that hangs: sleeps `seconds`, then claims success."""
    time.sleep(seconds)
    return Check(1.0, True, True, "ok", response)


def crash(response, ground_truth):
    """A checker whose process dies without answering."""
    import os

    os._exit(3)


class _SlowFloat:
    """A reward the worker can only send through `json`'s fallback, which calls float() on it:
    after its last call, while the worker answers the message."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __float__(self) -> float:
        time.sleep(self.seconds)
        return 1.0


def slow_to_answer(response, ground_truth, seconds: float = 30.0):
    """A checker that returns at once, with a reward that takes `seconds` to send."""
    return Check(_SlowFloat(seconds), True, True, "ok")
