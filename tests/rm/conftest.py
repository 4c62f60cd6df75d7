"""Fixtures for the rm tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run far faster on one CPU thread (rm/model/device.py, SMALL_MODEL)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
