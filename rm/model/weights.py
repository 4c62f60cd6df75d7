"""What a model id promises: the sha256 of its weights, recorded at training and checked at load.

A registered model's folder can be overwritten by a later run that writes to the same place;
serving it under the old id would then score with other weights. The hash is written into
metrics.json and the store's row when a run finishes (rm/train/run.py), and checked when a registered
id is served (service/engine/registry.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def weights_sha256(folder) -> str:
    """sha256 over a model folder's safetensors files (names and bytes, in name order): what a
    registered model id promises. Written into metrics.json and the store's row at training.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "model.safetensors").write_bytes(b"abc")
    >>> weights_sha256(d)[:12]
    '454ca76ef900'
    """
    digest = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} holds no *.safetensors weights; pass a folder written by "
                         "`bradley train` or `bradley models prepare`")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def check_weights(folder, expected: str | None, model_id: str) -> None:
    """Refuse a folder whose weights are not the ones registered under `model_id` (None: a model
    registered before hashes were recorded, not checked)."""
    if expected is None:
        return
    found = weights_sha256(folder)
    if found != expected:
        raise ValueError(f"model {model_id}: the weights in {folder} (sha256 {found[:12]}) are not "
                         f"the ones registered (sha256 {expected[:12]}); the folder was overwritten "
                         "by another run. Serve that run's model id, or retrain")


def share_weights(folder) -> None:
    """Give the safetensors files under `folder` the mode a new file gets (0666 less the umask):
    safetensors writes them 0600 whatever the umask, so a scorer running as another user could not
    read a model that every other file of its folder lets it read."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).rglob("*.safetensors"):
        path.chmod(mode)


def _umask() -> int:
    """The process's umask, from /proc where Linux tells it (no change, no race), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
