"""The store's errors, apart from annotation/store.py so that the modules it is built from
(annotation/snapshots.py) raise them without importing the store."""

from pathlib import Path


class StoreError(ValueError):
    """A problem with the store that the user can fix; the message says how."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file (DuckDB allows one writer, and no reader beside it)."""


def locked_by(path: str, pid: str) -> StoreLockedError:
    """The error for a store another process holds: its whole command line, and `--server` only
    when that process is a `bradley serve`, the one holder that can take the work.

    >>> str(locked_by("s.duckdb", "0"))[:60]
    's.duckdb is locked by another process (PID 0); DuckDB allows'
    """
    argv = _command_line(pid)
    holder = f"PID {pid}: {' '.join(argv)}" if argv else f"PID {pid}"
    if is_bradley_serve(argv):
        return StoreLockedError(
            f"{path} is held by a running `bradley serve` ({holder}); DuckDB allows one writing "
            "process: send the work to that server with `bradley --server URL COMMAND …` (the key "
            "from env BRADLEY_API_KEY), or stop it")
    return StoreLockedError(f"{path} is locked by another process ({holder}); DuckDB allows one "
                            "writing process: wait for it to finish, or stop it")


def is_bradley_serve(argv: list[str]) -> bool:
    """Whether a command line runs `bradley serve` (the console script, also under its
    interpreter, or `python -m service.cli`), global flags (`--db PATH`) before the command.

    >>> is_bradley_serve(["/venv/bin/python", "/venv/bin/bradley", "--db", "s", "serve", "--port", "1"])
    True
    >>> is_bradley_serve(["/venv/bin/bradley", "ingest", "serve"])
    False
    """
    args = _bradley_args(argv)
    i = 0
    while args is not None and i < len(args) and args[i].startswith("-"):
        i += 1 if "=" in args[i] else 2  # --db PATH, --server URL
    return args is not None and i < len(args) and args[i] == "serve"


def _bradley_args(argv: list[str]) -> list[str] | None:
    """The arguments after `bradley` (None: the command line is not bradley's)."""
    for i, arg in enumerate(argv[:3]):
        if Path(arg).name == "bradley":
            return argv[i + 1:]
        # `python -m service.cli[.main]`: matched by its package, as a command line, not an import
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1].partition(".")[0] == "service":
            return argv[i + 2:]
    return None


def _command_line(pid: str) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
