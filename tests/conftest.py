"""Shared fixtures. Tests run offline on CPU; real data comes from ../shared/data beside the checkout."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("BRADLEY_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set BRADLEY_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture
def store(tmp_path):
    from annotation.store import Store

    with Store(tmp_path / "test.duckdb") as s:
        yield s
