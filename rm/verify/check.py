"""What every verifier returns (rm/verify/rules.py, rm/verify/sandbox.py): a module of its own so the two
verifier modules need not import each other."""

from __future__ import annotations

from typing import NamedTuple


class Check(NamedTuple):
    """One checked response: `reward`, `correct` (None when the gold could not be read), `format_ok`,
    `status` (ok | no_answer | unparseable_gold | timeout | error), what was `extracted`, `detail`.
    A NamedTuple (immutable, built at C speed: the server makes one per verified item)."""

    reward: float
    correct: bool | None
    format_ok: bool
    status: str
    extracted: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict:
        return self._asdict()
