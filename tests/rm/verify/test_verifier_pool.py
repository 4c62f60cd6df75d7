"""Verifier calls in killable worker processes (rm/verify/pool.py) and the code verifier
(rm/verify/sandbox.py): acceptance 4 and the synthetic half of 5."""

from __future__ import annotations

import os
import time

import pytest

from rm.verify.pool import VerifierPool
from rm.verify.sandbox import run_code
from rm.verify.worker import WorkerProcess

PLUGINS = {"sleepy": "tests.rm.verify.verifier_plugins:sleepy", "crash": "tests.rm.verify.verifier_plugins:crash"}


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(workers=2, timeout_s=2.0, plugins=PLUGINS) as p:
        assert p.wait_ready()  # both workers up before timing anything
        yield p


def test_a_hanging_verifier_times_out_and_the_next_call_scores(pool):
    before = pool.counts["timeout"]
    started = time.monotonic()
    [check] = pool.verify([("sleepy", "x", None, None)])
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, elapsed
    assert (check.reward, check.status, check.correct) == (0.0, "timeout", None)
    assert pool.counts["timeout"] == before + 1
    assert [v.reward for v in pool.verify([("gsm8k", "#### 10", 10, None)])] == [pytest.approx(1.1)]


def test_a_timeout_inside_a_chunk_leaves_the_other_calls_scored(pool):
    calls = [("gsm8k", "#### 10", 10, None), ("sleepy", "x", None, {"seconds": 30}),
             ("gsm8k", "#### 3", 10, None), ("exact", "a", "a", None)]
    checks = pool.verify(calls)
    assert [v.status for v in checks] == ["ok", "timeout", "ok", "ok"]
    assert [v.reward for v in checks] == pytest.approx([1.1, 0.0, 0.1, 1.0])


def test_the_limit_counts_from_when_the_worker_starts_the_call(pool):
    # Two calls of 1.5 s each in one chunk: 3 s in all, yet neither is over its own 2 s.
    checks = pool.verify([("sleepy", "a", None, {"seconds": 1.5}),
                            ("sleepy", "b", None, {"seconds": 1.5})])
    assert [v.status for v in checks] == ["ok", "ok"]


def test_a_dying_worker_is_an_error_not_a_silent_zero(pool):
    before = pool.counts["error"]
    checks = pool.verify([("crash", "x", None, None), ("exact", "y", "y", None)])
    assert [v.status for v in checks] == ["error", "ok"]
    assert "died" in checks[0].detail and pool.counts["error"] == before + 1


def test_unknown_names_and_big_requests(pool):
    assert pool.verify([("nope", "x", 1, None)])[0].status == "error"
    calls = [("gsm8k", f"#### {i}", i % 7, None) for i in range(200)]  # several chunks, both workers
    assert [v.correct for v in pool.verify(calls)] == [i == i % 7 for i in range(200)]


# -- code -----------------------------------------------------------------------------------------

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]


def test_code_reward_is_the_share_of_tests_passed():
    v = run_code("def add(a, b):\n    return a + b\n", TESTS)
    assert (v.reward, v.status, v.extracted) == (pytest.approx(2 / 3), "ok", "2/3 passed")
    assert run_code("def add(a, b):\n    return a + b\n", TESTS, all_or_nothing=True).reward == 0.0
    assert run_code("def add(a, b):\n    return None\n", TESTS).reward == 0.0
    assert run_code("def add(a, b) return", TESTS).reward == 0.0  # a syntax error fails every test


def test_code_infinite_loop_is_a_timeout_within_the_limit():
    started = time.monotonic()
    v = run_code("while True:\n    pass\n", ["assert True"], timeout_s=2.0)
    assert v.status == "timeout" and v.reward == 0.0
    assert time.monotonic() - started < 3.0


def test_code_allocating_10gb_is_an_error():
    v = run_code("def grab():\n    return bytearray(10 * 1024 ** 3)\n", ["assert grab()"])
    assert (v.reward, v.status) == (0.0, "error") and "Memory" in v.detail


def test_code_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    program = f"def write():\n    open({str(target)!r}, 'w').write('x')\n    return True\n"
    v = run_code(program, ["assert write()"])
    assert v.reward == 0.0 and "PermissionError" in v.detail
    assert not target.exists()
    inside = "def write():\n    open('mine.txt', 'w').write('x')\n    return open('mine.txt').read()\n"
    assert run_code(inside, ["assert write() == 'x'"]).reward == 1.0
    assert run_code("import os\nos.system('true')\n", ["assert True"]).reward == 0.0


def test_code_options_from_requests_are_bounded():
    v = run_code("def grab():\n    return bytearray(6 * 1024 ** 3)\n", ["assert grab()"],
                 memory_mb=10 ** 9)  # asks for a petabyte, gets MAX_MEMORY_MB (4 GiB)
    assert v.status == "error" and "Memory" in v.detail


def test_code_sees_a_clean_environment(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEYS", "secret-secret")
    v = run_code("import os\n", ["assert 'BRADLEY_API_KEYS' not in os.environ"])
    assert v.reward == 1.0


def test_code_through_the_pool_keeps_the_server_process_alive(pool):
    checks = pool.verify([
        ("code", "def grab():\n    return bytearray(10 * 1024 ** 3)\n", ["assert grab()"], None),
        ("code", "def add(a, b):\n    return a + b\n", TESTS[:2], None),
        ("code", "while True:\n    pass\n", ["assert True"], {"timeout_s": 1.0}),
    ])
    assert [v.status for v in checks] == ["error", "ok", "timeout"]
    assert [v.reward for v in checks] == [0.0, 1.0, 0.0]


def test_a_program_dies_with_its_worker():
    """A worker killed mid-call (by the pool at its limit, or at shutdown) takes the program with
    it (PR_SET_PDEATHSIG). A program that sleeps forever leaves its pid in its working directory."""
    import glob
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    program = "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(3600)\n"
    pattern = os.path.join(tempfile.gettempdir(), "bradley-code-*")
    before = set(glob.glob(pattern))
    worker = subprocess.Popen([sys.executable, "-c", "import sys; from rm.verify.sandbox import "
                               "run_code; run_code(sys.argv[1], ['assert True'], timeout_s=30)",
                               program])
    deadline = time.monotonic() + 20
    while not (new := [f for f in set(glob.glob(pattern)) - before
                       if os.path.exists(os.path.join(f, "pid"))]):
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.1)
    time.sleep(0.2)
    pid = int(open(os.path.join(new[0], "pid")).read())
    assert os.path.exists(f"/proc/{pid}")
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(0.5)
    alive = os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
    shutil.rmtree(new[0], ignore_errors=True)  # its worker died before it could clean up
    assert not alive, "the program outlived its worker"


def test_a_worker_killed_between_calls_costs_nothing():
    """The OOM killer (or an operator) takes an idle worker: the next chunk is sent again whole to
    a fresh one, and no call is blamed for a death it did not cause."""
    import os
    import signal

    with VerifierPool(workers=1, timeout_s=5.0) as pool:
        assert pool.wait_ready()
        os.kill(pool._workers[0].proc.pid, signal.SIGKILL)
        time.sleep(0.3)
        checks = pool.verify([("gsm8k", "#### 10", 10, None), ("exact", "a", "a", None)])
        assert [v.status for v in checks] == ["ok", "ok"]
        assert pool.counts["error"] == 0 and pool.restarts == 1


# -- one message per batch (IPC per message, not per call) -----------------------------------------


def test_item_3_of_10_hangs_the_rest_are_scored_within_the_limit():
    """Ten calls whose fourth hangs: it alone is `timeout`; the calls that shared its message (their
    checks died with the killed worker) run again on the other worker while the killed one is
    replaced, so everything is answered within the limit + 1 s."""
    calls = [("gsm8k", f"#### {i}", 10, None) for i in range(10)]
    calls[3] = ("sleepy", "x", None, {"seconds": 30})
    with VerifierPool(workers=2, timeout_s=2.0, plugins=PLUGINS) as pool:
        assert pool.wait_ready()
        started = time.monotonic()
        checks = pool.verify(calls)
        elapsed = time.monotonic() - started
        assert elapsed < 3.0, elapsed
        assert [v.status for v in checks] == ["ok"] * 3 + ["timeout"] + ["ok"] * 6
        assert [v.reward for v in checks] == pytest.approx([0.1] * 3 + [0.0] + [0.1] * 6)
        assert "limit" in checks[3].detail
        assert (pool.counts["timeout"], pool.counts["ok"], pool.restarts) == (1, 9, 1)


def test_requests_queued_together_travel_as_one_message_and_a_hang_blames_one_call():
    """Twelve requests submitted while the one worker is busy are sent as one message (fewer
    messages than requests); the hung call of one of them is the only timeout, every other call of
    every request in that message is scored, each request gets its own checks in order."""
    with VerifierPool(workers=1, timeout_s=2.0, plugins=PLUGINS) as pool:
        assert pool.wait_ready()
        first = pool._workers[0]
        busy = pool.submit([("sleepy", "b", None, {"seconds": 1.0})])
        deadline = time.monotonic() + 10
        while first.running(1) is None:  # message 1 (the busy call) has started
            assert time.monotonic() < deadline
            time.sleep(0.01)
        requests = [[("gsm8k", f"#### {r * 10 + i}", r * 10 + i, None) for i in range(5)]
                    for r in range(12)]
        requests[7][2] = ("sleepy", "x", None, {"seconds": 30})
        futures = [pool.submit(calls) for calls in requests]
        results = [f.result(timeout=10) for f in futures]
        assert busy.result()[0].status == "ok"
        for r, checks in enumerate(results):
            want = ["timeout" if (r, i) == (7, 2) else "ok" for i in range(5)]
            assert [v.status for v in checks] == want
            assert [v.correct for v in checks] == [None if s == "timeout" else True for s in want]
        # the first worker got two messages: the busy call, then all twelve requests at once
        assert (first.seq, pool.restarts, pool._workers[0].seq) == (2, 1, 1)


def test_a_message_larger_than_the_pipe_buffer_round_trips():
    """Hundreds of kB each way (the pipe holds 64 kB): written whole, read whole, in order."""
    long = "word " * 400
    calls = [("exact", f"{i}{long}", f"{i + i % 2}{long}", None) for i in range(600)]
    with VerifierPool(workers=2, timeout_s=5.0) as pool:
        checks = pool.verify(calls)
    assert [v.status for v in checks] == ["ok"] * 600
    assert [v.correct for v in checks] == [i % 2 == 0 for i in range(600)]
    assert [v.extracted[:3] for v in checks[:3]] == ["0wo", "1wo", "2wo"]


def test_a_ground_truth_beyond_64_bits_travels_exactly():
    with VerifierPool(workers=1, timeout_s=5.0) as pool:
        [check] = pool.verify([("exact", str(10 ** 30), 10 ** 30, None)])
    assert check.correct is True


def test_a_worker_that_cannot_start_leaves_nothing_open():
    """Its shared page is closed: a broken plugin retried for every batch must not
    use up the server's descriptors (each also holding a /dev/shm file)."""
    opened = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        with pytest.raises(EOFError):
            WorkerProcess({"bad": "no_such_module_for_bradley:check"}, 5.0)
    assert len(os.listdir("/proc/self/fd")) == opened


def test_time_outside_the_calls_is_no_calls_fault_but_is_bounded(monkeypatch):
    """Answering after the last call is not that call's time (it finished: no timeout for it);
    answering that takes longer than OUTSIDE_CALLS_S kills the worker, blaming none the first
    time; sent again, the same message kills the next worker too and its first call is answered
    `error` (two bounded waits and a worker's start, not the 30 s it would take); a replacement
    scores the next call."""
    import rm.verify.pool

    monkeypatch.setattr(rm.verify.pool, "OUTSIDE_CALLS_S", 2.5)
    plugins = {"slow_to_answer": "tests.rm.verify.verifier_plugins:slow_to_answer"}
    with VerifierPool(workers=1, timeout_s=1.0, plugins=plugins) as pool:
        [check] = pool.verify([("slow_to_answer", "a", None, {"seconds": 1.5})])
        assert (check.status, check.reward) == ("ok", 1.0)
        started = time.monotonic()
        [check] = pool.verify([("slow_to_answer", "a", None, {"seconds": 30})])
        assert check.status == "error" and "answering took over 2.5 s" in check.detail
        assert time.monotonic() - started < 15 and pool.restarts == 2
        assert [v.reward for v in pool.verify([("exact", "a", "a", None)])] == [1.0]
