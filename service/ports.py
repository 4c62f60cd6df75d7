"""The one `free_port()` of the project (the demo, the tests and the benchmarks start servers on it),
and `check_port`, which `bradley serve` runs before it loads anything."""

from __future__ import annotations

import errno
import socket


class PortInUse(OSError):
    """Another process listens on the address `bradley serve` was asked to use (exit 4)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it; another process may
    still take it before the caller binds, which is harmless for a demo, a test or a bench)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port(host: str, port: int) -> None:
    """Refuse an address that `bradley serve` could not listen on, as uvicorn would bind it (with
    SO_REUSEADDR: a port left in TIME_WAIT by a stopped server is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} on {host} is already in use by another process; "
                                "stop it, or pass --port N (env BRADLEY_PORT)") from None
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass --host "
                          "with an address of this machine (env BRADLEY_HOST)") from None
