"""The store's errors, apart from annotation/store.py so that the modules it is built from
(annotation/snapshots.py) raise them without importing the store."""


class StoreError(ValueError):
    """A problem with the store that the user can fix; the message says how."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file (DuckDB allows one writer, and no reader beside it)."""
