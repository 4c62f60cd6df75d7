"""The CLI's side of a running `bradley serve`: the store it reads and writes over HTTP, and the
commands that go through the server (`bradley --server URL ...`)."""

from __future__ import annotations

import contextlib
import urllib.error

from service.client import ClientError


@contextlib.contextmanager
def translated(url: str, what: str | None = None):
    """The server's refusals and an unreachable server as the ValueError / OSError the CLI prints
    as one line."""
    try:
        yield
    except ClientError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        raise ValueError(f"{what or url}: the server refused it: {exc}{where}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise OSError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
