"""The one `free_port()` of the project (the demo, the tests and the benchmarks start servers on it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it; another process may
    still take it before the caller binds, which is harmless for a demo, a test or a bench)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
