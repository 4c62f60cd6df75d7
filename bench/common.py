"""What the benchmarks share: the synthetic pairs, hh-rlhf's rows, TRL's venv, bradley in this
process, measuring a child process and driving a server over raw HTTP.

Imported as `bench.common` (each script puts the repository root on sys.path first), so the
scripts never import one another by file name.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import os
import random
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "out" / "train_vs_trl"
GOOD = ("correct", "clear", "helpful", "precise", "accurate", "careful")
BAD = ("wrong", "vague", "useless", "sloppy", "garbled", "careless")
FILLER = ("the", "answer", "is", "we", "check", "each", "step", "and", "then", "result", "value",
          "because", "first", "method", "data", "so")


def _answer(rng: random.Random, words: int, good_share: float) -> str:
    """Filler text where 30% of words carry quality: good with probability `good_share`."""
    return " ".join(rng.choice(GOOD if rng.random() < good_share else BAD)
                    if rng.random() < 0.3 else rng.choice(FILLER) for _ in range(words))


def synthetic_pairs(n: int, seed: int) -> list[dict]:
    """Pairs whose chosen answer has more good words than bad; lengths spread widely."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = rng.randint(20, 190)
        prompt = f"question {i}: " + " ".join(rng.choice(FILLER) for _ in range(rng.randint(4, 20)))
        rows.append({"prompt": prompt, "chosen": _answer(rng, words, 0.8),
                     "rejected": _answer(rng, words, 0.2)})
    return rows


def hh_rlhf_rows():
    """hh-rlhf's harmless-base test rows (under BRADLEY_SHARED_DATA, default ../shared/data), lazily."""
    data = Path(os.environ.get("BRADLEY_SHARED_DATA", ROOT.parent / "shared" / "data"))
    with gzip.open(data / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as f:
        yield from map(json.loads, f)


def cli(argv: list[str]) -> str:
    """`bradley ARGV` in this process; the last line it printed ("" if none): training's metrics."""
    from service.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    if status:
        raise SystemExit(f"bradley {' '.join(argv)} exited {status}")
    lines = out.getvalue().strip().splitlines()
    return lines[-1] if lines else ""


def ensure_trl_venv() -> Path:
    """The tests' cached TRL venv (tests/cached_venv.py): built once, about 2 minutes."""
    from tests.cached_venv import trl_venv

    return trl_venv()


def run_measured(cmd: list[str], work: Path, name: str, env: dict | None = None) -> tuple[str, float]:
    """(stdout, peak RSS in MB) of one Python child `[python, script or -m module, args...]`, as
    bench/peak_rss.py reads it (that module says why not ru_maxrss)."""
    out_path, err_path, peak_path = (work / f"{name}.{ext}" for ext in ("out", "err", "peak"))
    peak_path.unlink(missing_ok=True)
    launch = [cmd[0], str(ROOT / "bench" / "peak_rss.py"), str(peak_path), *cmd[1:]]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        code = subprocess.run(launch, stdout=out, stderr=err, cwd=work,
                              env={**os.environ, **(env or {})}).returncode
    if code != 0:
        raise SystemExit(f"{name} failed:\n{err_path.read_text()[-4000:]}")
    return out_path.read_text(), float(peak_path.read_text())


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes,
               path: str = "/score", key: str | None = None,
               method: str = "POST") -> tuple[int, bytes, float, bool]:
    """One HTTP/1.1 request over a kept-alive connection: (status, body, seconds, whether the server
    asked to close). Raw sockets, so the load generator costs the client little next to the server
    it measures. `key`: sent as a bearer key (a keyed caller is not held to the anonymous limits)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {len(body)}\r\n\r\n").encode()
    started = time.perf_counter()
    if len(body) > 65536:  # not copied just to put the head in front: the server shares the cores
        writer.write(head)
        writer.write(body)
    else:
        writer.write(head + body)
    status = int((await reader.readline()).split()[1])
    length, close = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"connection":
            close = value.strip().lower() == b"close"
    payload = await reader.readexactly(length)
    return status, payload, time.perf_counter() - started, close


def percentile_ms(ordered: list[float], q: float, digits: int = 2) -> float | None:
    """The `q` quantile of sorted seconds, in milliseconds; None when there are none."""
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits) if ordered else None


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) so far of a process: (its own, with its live descendants: a
    server's verifier workers), from Linux /proc. A descendant that exits
    while it is read counts no more."""
    own = _cpu_of(pid)
    total, seen, todo = own, {pid}, [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = {int(c) for task in Path(f"/proc/{parent}/task").iterdir()
                    for c in (task / "children").read_text().split()}
        except OSError:
            continue
        for kid in kids - seen:
            seen.add(kid)
            try:
                total += _cpu_of(kid)
            except OSError:
                continue
            todo.append(kid)
    return own, total


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(argv: list[str], url: str, seconds: float, what: str, env: dict | None = None):
    """Start a server the bench drives and wait until `url` answers 200 (`wait_ready`). Its
    stdout and stderr go to a temporary file, whose tail the error quotes if it never gets ready:
    on a machine the bench only reaches through a script (the GPU run), that is the only trace."""
    import tempfile

    log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    proc.log_path = log.name
    return wait_ready(proc, url, seconds, what)


def wait_ready(proc, url: str, seconds: float, what: str):
    """Poll `url` until it answers 200, then return `proc`; kill it and raise if it exits or
    `seconds` pass first (quoting the end of its log, when `spawn` kept one)."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    log = getattr(proc, "log_path", None)
    tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
    state = f"exited {proc.returncode}" if time.monotonic() < deadline else f"{seconds:g} s passed"
    raise RuntimeError(f"{what} did not become ready ({state})" + (f"; its log ends:\n{tail}" if tail else ""))


def stop(proc) -> None:
    """End a server the bench started: SIGTERM (it drains), SIGKILL after 60 s; its log goes."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if getattr(proc, "log_path", None):
        Path(proc.log_path).unlink(missing_ok=True)
