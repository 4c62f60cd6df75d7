"""The `code` verifier: run a Python program against tests; reward = share of tests passed (or 1/0
with `all_or_nothing=True`). Opt-in: the server refuses it unless BRADLEY_ENABLE_CODE_VERIFIER=1.

**This is not a security boundary.** It keeps honest mistakes and runaway programs from hurting the
server, nothing more: the program runs as the server's user, in a subprocess with

- a fresh temporary working directory (removed afterwards), `HOME`/`TMPDIR` pointing there;
- a clean environment (no inherited variables, so no keys or tokens) and `python -I` (no user site,
  no PYTHON* variables, the script's folder not on sys.path);
- RLIMIT_AS (memory, default 1 GiB), RLIMIT_CPU (CPU seconds), RLIMIT_FSIZE (largest file written,
  16 MiB) and RLIMIT_NPROC (processes; Linux ignores it for root);
- its own session and process group, killed with SIGKILL at the wall-clock limit (at most the
  worker pool's limit less 0.5 s), and PR_SET_PDEATHSIG so it dies with the worker if the pool
  kills that first;
- an audit hook (PEP 578) that refuses opening files for writing outside the working directory and
  refuses starting processes. Audit hooks are a Python-level tripwire: ctypes, a C extension or a
  bug in the hook gets around them.

Run untrusted programs in a real sandbox (a container with no network and a read-only root, gVisor,
nsjail, Firecracker) when the policy may be adversarial.

Ground truth is one test (a string of Python run after the program, e.g. HumanEval's
`def check(candidate): ...` followed by `check(entry_point)`) or a list of such strings, each run in
its own namespace copy after the program. A test passes when it raises nothing. Statuses:
`ok` (the tests ran; reward = share passed), `timeout` (wall clock), `error` (a resource limit was
hit: MemoryError, SIGXCPU, SIGXFSZ, or the process died from a signal; reward 0).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

from rm.verify.check import Check

DEFAULT_TIMEOUT_S = 4.0
DEFAULT_MEMORY_MB = 1024
MAX_TIMEOUT_S, MAX_MEMORY_MB = 60.0, 4096
FILE_LIMIT_BYTES = 16 * 1024 * 1024

# Runs inside the child: PEP 578 audit hook, then the program and each test; one JSON line of
# results goes to a pipe fd named on the command line, which the program does not know about (a tripwire, not a guarantee).
HARNESS = r'''
import json, os, sys
ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
REFUSED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.spawn", "os.kill", "os.killpg"}
def _outside(path):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except Exception:
        return True
    return os.path.commonpath([ROOT, real]) != ROOT
def _hook(event, args):
    if event == "open" and len(args) >= 3 and isinstance(args[0], (str, bytes)):
        mode, flags = args[1], args[2] or 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & WRITE_FLAGS
        if writing and _outside(args[0]):
            raise PermissionError(f"writing outside the working directory: {args[0]!r}")
    elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.truncate",
                   "shutil.rmtree", "os.symlink", "os.link") and args and _outside(args[0]):
        raise PermissionError(f"{event} outside the working directory")
    elif event in REFUSED:
        raise PermissionError(f"{event} is not allowed here")
out = os.fdopen(int(sys.argv[1]), "w")
sys.addaudithook(_hook)
program, tests = json.loads(sys.stdin.read())
results = []
def _run(source, namespace):
    try:
        exec(compile(source, "<program>", "exec"), namespace)
        return "pass"
    except MemoryError:
        return "memory"
    except BaseException as exc:
        return "fail:" + type(exc).__name__
namespace = {"__name__": "__main__"}
loaded = _run(program, namespace)
for test in tests:
    results.append(_run(test, dict(namespace)) if loaded == "pass" else loaded)
out.write(json.dumps({"program": loaded, "tests": results}))
out.flush()
'''


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the kill at the wall-clock limit still holds
        return None


_PRCTL = _prctl()
PR_SET_PDEATHSIG = 1


def _limits(cpu_s: int, memory_mb: int):
    def apply() -> None:  # runs in the child between fork and exec
        if _PRCTL is not None:  # die with the verifier worker, even when the pool kills it first
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_BYTES, FILE_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _pool_limit() -> float:
    """The worker pool's per-call limit (set for its workers): finishing first gives a clean
    `timeout` check with the program's own group killed, rather than the whole worker."""
    try:
        return max(float(os.environ.get("BRADLEY_VERIFIER_LIMIT_S", "inf")), 0.6)
    except ValueError:
        return float("inf")


def _tests(ground_truth) -> list[str] | None:
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, list) and ground_truth and all(isinstance(t, str) for t in ground_truth):
        return ground_truth
    return None


def run_code(response: str, ground_truth, timeout_s: float = DEFAULT_TIMEOUT_S,
             memory_mb: int = DEFAULT_MEMORY_MB, all_or_nothing: bool = False) -> Check:
    """Run `response` (a Python program) and the tests in `ground_truth` under the limits above."""
    tests = _tests(ground_truth)
    # options come from requests: keep them inside sane bounds whatever is asked
    timeout_s = min(max(float(timeout_s), 0.1), MAX_TIMEOUT_S, _pool_limit() - 0.5)
    memory_mb = min(max(int(memory_mb), 64), MAX_MEMORY_MB)
    if tests is None:
        return Check(0.0, None, False, "unparseable_gold", detail="send a test or a list of tests")
    with tempfile.TemporaryDirectory(prefix="bradley-code-") as workdir:
        read_fd, write_fd = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", HARNESS, str(write_fd)], cwd=workdir, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            pass_fds=(write_fd,), preexec_fn=_limits(int(timeout_s) + 1, memory_mb))
        os.close(write_fd)
        try:
            child.communicate(json.dumps([response, tests]).encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            os.close(read_fd)
            return Check(0.0, None, False, "timeout",
                         detail=f"killed after {time.monotonic() - started:.1f} s")
        with os.fdopen(read_fd, "rb") as f:
            report = f.read()
        _kill_group(child)  # anything the program left behind in its group
    return _check(child.returncode, report, len(tests), all_or_nothing)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


SIGNAL_ERRORS = {-signal.SIGXCPU: "CPU time limit", -signal.SIGXFSZ: "file size limit",
                 -signal.SIGKILL: "killed", -signal.SIGSEGV: "segmentation fault"}


def _check(returncode: int, report: bytes, n_tests: int, all_or_nothing: bool) -> Check:
    try:
        result = json.loads(report)
    except ValueError:
        why = SIGNAL_ERRORS.get(returncode, f"exit status {returncode}, no report")
        return Check(0.0, None, False, "error", detail=why)
    outcomes = result["tests"]
    if result["program"] == "memory" or "memory" in outcomes:
        return Check(0.0, None, False, "error", detail="MemoryError (memory limit)")
    passed = sum(o == "pass" for o in outcomes)
    share = passed / n_tests
    reward = float(passed == n_tests) if all_or_nothing else share
    failures = sorted({o for o in outcomes if o != "pass"})
    return Check(reward, passed == n_tests, result["program"] == "pass", "ok",
                 f"{passed}/{n_tests} passed", ", ".join(failures)[:300] or None)
