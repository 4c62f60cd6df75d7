"""Device and distributed decisions (CPU here; CUDA paths only raise clear errors without a GPU)."""

import contextlib

import pytest
import torch

from rm.model import device as devices


def test_cpu_and_auto_resolve_without_a_gpu():
    assert devices.resolve("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert devices.resolve("auto") == torch.device("cpu")


def test_bad_device_specs_name_the_fix():
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        devices.resolve("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cpu"):
            devices.resolve("cuda:0")


def test_cpu_runs_in_fp32_without_autocast():
    assert isinstance(devices.autocast(torch.device("cpu")), contextlib.nullcontext)


def test_single_process_helpers_are_identities(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    device, info = devices.setup("cpu")
    assert (info.rank, info.world_size, info.is_main, info.active) == (0, 1, True, False)
    assert devices.all_reduce_sum([1.5, 2.0], device, info) == [1.5, 2.0]
    assert devices.broadcast_json({"a": [1, 2]}, info, device) == {"a": [1, 2]}
    model = torch.nn.Linear(2, 1)
    assert devices.wrap(model, device, info) is model and devices.unwrap(model) is model


def test_small_models_get_one_cpu_thread_and_the_old_count_comes_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        assert devices.set_threads(torch.device("cpu"), devices.Dist(), n_params=160_000) == before
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
