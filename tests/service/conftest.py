"""Fixtures for the service tests: two tiny reward models (hidden 64, 2 layers) built from a config,
real prompts and responses from hh-rlhf, a store with both models registered, and a live uvicorn
server on 127.0.0.1 shared by the tests that need real HTTP."""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-0123456789"
HH_FILE = "hh-rlhf/harmless-base-test.jsonl.gz"
SEP = "\n\nAssistant:"


@pytest.fixture(scope="session", autouse=True)
def one_forward_thread():
    """The service gives its model every core by default; tests share 2 cores with the rest of the
    suite, so servers here run one forward thread, and the session's settings are restored."""
    import os

    import torch

    wanted = {"BRADLEY_TORCH_THREADS": "1"}
    previous, saved = torch.get_num_threads(), {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    yield
    torch.set_num_threads(previous)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def hh_items(shared_data) -> list[tuple[str, str]]:
    """(prompt, response) pairs from the first 100 hh-rlhf test pairs (chosen and rejected)."""
    items = []
    with gzip.open(shared_data / HH_FILE, "rt", encoding="utf-8") as f:
        for line, _ in zip(f, range(100), strict=False):
            row = json.loads(line)
            for text in (row["chosen"], row["rejected"]):
                cut = text.rindex(SEP) + len(SEP)
                items.append((text[:cut].strip(), text[cut:].strip()))
    return items


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, hh_items) -> dict[str, str]:
    """model id -> folder; two tiny Llama reward models that differ only in their seed."""
    from rm.model.reward_model import build_tiny_reward_model

    root = tmp_path_factory.mktemp("models")
    texts = [p + " " + r for p, r in hh_items]
    return {name: str(build_tiny_reward_model(root / name, texts, seed=seed))
            for name, seed in (("rm-tiny-a", 0), ("rm-tiny-b", 1))}


@pytest.fixture(scope="session")
def offline(tiny_models):
    """The same models loaded directly, for reference scores computed without the service."""
    from rm.model.reward_model import RewardModel

    return {name: RewardModel.load(path, device="cpu") for name, path in tiny_models.items()}


def make_db(path, tiny_models) -> str:
    from annotation.store import Store

    with Store(path) as store:
        for name, folder in tiny_models.items():
            store.register_model("rm", "tiny-llama", folder, None, {}, {}, model_id=name)
    return str(path)


@dataclass
class Live:
    url: str
    db: str
    server: object
    app: object

    @property
    def service(self):
        return self.app.state.service


def start_live(settings) -> Live:
    import uvicorn

    from service.api.app import create_app

    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.05)
    server.thread = thread
    return Live(f"http://127.0.0.1:{settings.port}", settings.db, server, app)


def stop_live(live: Live) -> None:
    live.server.should_exit = True
    live.server.thread.join(30)


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny_models):
    """A real uvicorn server in this process (a thread), serving rm-tiny-a, writes keyed."""
    from service.api.settings import load_settings

    db = make_db(tmp_path_factory.mktemp("live") / "live.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, port=free_port(),
                             max_body_bytes=64 * 1024, max_text_chars=20_000, device="cpu")
    server = start_live(settings)
    yield server
    stop_live(server)


@pytest.fixture
def auth() -> dict:
    return {"Authorization": f"Bearer {API_KEY}"}
