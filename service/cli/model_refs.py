"""Checks on a model a command is pointed at (`--base-model`, `--judge local:…`, `--generate`), made
before any work so that a wrong model is one line instead of a tokenizer's multi-line error after
the data was read, or five retries against a hub this machine cannot reach.

A reference is a local folder (it must hold a config.json; a causal LM's must not name an encoder
or classifier architecture), or a hub id, which must be in the local Hugging Face cache when the hub
is offline (HF_HUB_OFFLINE=1) or unreachable (a connection attempt of HUB_PROBE_S seconds).

    >>> is_causal(["LlamaForCausalLM"]), is_causal(["BertForSequenceClassification"])
    (True, False)
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from pathlib import Path

HUB_PROBE_S = 3.0
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
BUILT_IN = ("tiny",)  # built from a config by rm/ itself


class ModelRefError(ValueError):
    """A model reference that cannot be loaded; the message says what to pass instead."""


def is_causal(architectures: list[str]) -> bool:
    return any(name.endswith(CAUSAL_SUFFIXES) for name in architectures)


def check_model_ref(ref: str, what: str, causal: bool = False, fix: str = "") -> None:
    """Refuse `ref` (named `what` in the message, e.g. "--base-model") unless it can be loaded:
    a model folder (a causal LM's when `causal`), or a hub id this machine can get."""
    if ref in BUILT_IN:
        return
    folder = Path(ref).expanduser()
    if folder.is_dir():
        _check_folder(folder, ref, what, causal, fix)
    elif folder.exists() or ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelRefError(f"{what} {ref}: no such model folder{fix}")
    else:
        _check_hub_id(ref, what, fix)


def _check_folder(folder: Path, ref: str, what: str, causal: bool, fix: str) -> None:
    config = folder / "config.json"
    if not config.is_file():
        raise ModelRefError(f"{what} {ref} is not a model folder (no config.json){fix}")
    if not causal:
        return
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        raise ModelRefError(f"{what} {ref}: its config.json is not a JSON object{fix}") from None
    if names and not is_causal(names):
        kind = " (a reward model)" if (folder / "train_config.json").is_file() else ""
        raise ModelRefError(f"{what} {ref} is {names[0]}{kind}, not a causal LM; policy training "
                            f"and judging need a decoder that generates text{fix}")


def _check_hub_id(ref: str, what: str, fix: str) -> None:
    if _cached(ref):
        return
    if _offline():
        raise ModelRefError(f"{what} {ref} is not a local folder, and the hub is offline "
                            f"(HF_HUB_OFFLINE=1) with no cached copy{fix}")
    problem = _hub_unreachable()
    if problem:
        raise ModelRefError(f"{what} {ref} is not a local folder, and the hub cannot be reached "
                            f"({problem}){fix}")


def _cached(ref: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(ref, "config.json"), str)
    except (ImportError, ValueError):  # ValueError: not a valid repo id
        return False


def _offline() -> bool:
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_unreachable() -> str | None:
    """Why the hub's endpoint takes no connection (None when it does)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parts = urllib.parse.urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=HUB_PROBE_S).close()
    except OSError as exc:
        return f"{endpoint}: {exc.strerror or exc}"
    return None
