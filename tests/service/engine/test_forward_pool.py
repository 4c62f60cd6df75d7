"""Forward processes (service/engine/forward_pool.py): the same scores as the model in this process, row
for row, through the pool and through a served /score; a dead process is replaced; a hot swap and a
stop leave no process behind."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest
from fastapi.testclient import TestClient

from service.api.errors import error_response
from service.engine.batcher import Batcher
from service.engine.forward_pool import ForwardPool, ForwardProcessError, ForwardProcessExited
from tests.service.conftest import API_KEY, make_db


@pytest.fixture(scope="module")
def ids(offline, hh_items) -> list[list[int]]:
    return offline["rm-tiny-a"].encode([p for p, _ in hh_items[:24]], [r for _, r in hh_items[:24]])


@pytest.fixture(scope="module")
def pool(tiny_models):
    pool = ForwardPool(tiny_models["rm-tiny-a"], processes=1)
    yield pool
    pool.close()


def gone(process, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process.is_alive()


def test_a_forward_process_scores_exactly_as_the_model_here(pool, offline, ids):
    model = offline["rm-tiny-a"]
    assert pool.score_encoded(ids[:7]) == model.score_encoded(ids[:7])  # one packed forward
    assert pool.layout == model.layout == "packed" and pool.packs_rows  # said at load
    alone = [pool.score_encoded([row])[0] for row in ids[:7]]
    assert alone == pytest.approx(pool.score_encoded(ids[:7]), abs=1e-5)  # batch independence
    assert pool.score_encoded([]) == []


def test_a_bad_forward_fails_with_the_models_message_and_the_process_lives_on(pool, offline, ids):
    with pytest.raises(ForwardProcessError, match="cannot score an empty token sequence") as err:
        pool.score_encoded([ids[0], []])
    assert error_response(err.value).status_code == 500  # a server fault, not the client's
    assert pool.score_encoded(ids[:2]) == offline["rm-tiny-a"].score_encoded(ids[:2])


def test_a_killed_process_fails_its_forward_and_is_replaced(pool, offline, ids):
    victim = pool._workers[0][0]
    os.kill(victim.pid, signal.SIGKILL)
    assert gone(victim)
    with pytest.raises(ForwardProcessExited, match="exited during a forward; it was replaced") as err:
        pool.score_encoded(ids[:3])
    answer = error_response(err.value)  # what the client of that forward gets: retry later
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert pool._workers[0][0] is not victim and pool.processes == 1
    assert pool.score_encoded(ids[:3]) == offline["rm-tiny-a"].score_encoded(ids[:3])


def test_a_folder_that_is_not_a_model_is_refused_naming_it(tmp_path):
    with pytest.raises(ForwardProcessError, match=f"{tmp_path}.*not a model folder"):
        ForwardPool(str(tmp_path), processes=2)


def test_two_batcher_workers_put_every_row_of_a_split_request_back_in_order():
    busy = threading.Semaphore(2)

    def scorer(rows):  # slow enough that both workers hold pieces of the same request at once
        assert busy.acquire(blocking=False), "more forwards at once than workers"
        time.sleep(0.01)
        busy.release()
        return [float(row[0]) for row in rows]

    batcher = Batcher(max_batch_tokens=1000, max_batch_items=4, max_wait_s=0.0).start(workers=2)
    rows = [[k] for k in range(50)]
    futures = []
    import asyncio

    async def main():
        return await asyncio.gather(batcher.score(scorer, rows), batcher.score(scorer, rows[:5]))

    futures = asyncio.run(main())
    assert batcher.close(timeout=10)
    assert futures == [[float(k) for k in range(50)], [float(k) for k in range(5)]]
    assert batcher.stats["items"] == 55 and batcher.stats["forwards"] >= 14


def test_a_served_model_on_forward_processes_scores_as_in_process_and_leaves_none_behind(
        tmp_path, tiny_models, offline, hh_items):
    from service.api.app import create_app
    from service.api.settings import load_settings

    db = make_db(tmp_path / "pool.duckdb", tiny_models)
    body = {"items": [{"prompt": p, "response": r} for p, r in hh_items[:9]]}
    auth = {"Authorization": f"Bearer {API_KEY}"}
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, device="cpu",
                             forward_processes=2)
    with TestClient(create_app(settings)) as client:
        service = client.app.state.service
        first = service.current.pool
        assert first.processes == 2 and len(service.batcher._threads) == 2
        scores = client.post("/score", json=body).json()["scores"]
        expected = offline["rm-tiny-a"].score([p for p, _ in hh_items[:9]],
                                              [r for _, r in hh_items[:9]])
        assert scores == pytest.approx(expected, abs=1e-5)
        old = [worker[0] for worker in first._workers]
        assert client.post("/models/rm-tiny-b/load", headers=auth).status_code == 200
        del first
        gc.collect()
        assert all(gone(process) for process in old)  # the old model's processes exit
        swapped = client.post("/score", json=body).json()
        assert swapped["model"] == "rm-tiny-b" and swapped["scores"] != scores
        current = [worker[0] for worker in service.current.pool._workers]
    assert all(gone(process, 0.5) for process in current)  # stopped with the server
