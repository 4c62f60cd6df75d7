"""What one running server holds: settings, the store (the single DuckDB writer), the served model
(or ensemble: service/engine/ensemble.py), the batcher, the metrics and the watch
(service/engine/watch.py), with the operations the routes call.

Concurrency: the event loop serves HTTP; one batcher thread runs every model forward; one store
thread runs every DuckDB statement (DuckDB allows one writer, and one connection must not be used by
two threads at once), so uploads, reports and model look-ups queue there in arrival order while
/score never waits for the store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rm.verify.pool import VerifierPool
from service.api.metrics import Metrics
from service.api.payloads import Limits, PayloadError, text_chars
from service.api.settings import Settings, plugins_setting
from service.engine.advantages import PassRates
from service.engine.batcher import Batcher
from service.engine.encoder import EncodeQueue
from service.engine.ensemble import Aggregation, Member, Scored, ScoreOptions, assemble, plan_lanes
from service.engine.registry import check_row
from service.engine.rewards import weights_setting
from service.engine.watch import Watch

log = logging.getLogger("bradley.service")
UPLOAD_FORMATS = {"judgments": "judgments", "pairs": "trl", "feedback": "kto",
                  "webhooks/label-studio": "label-studio"}
# Tokenization never runs on the event loop (a request of megabytes would hold it for seconds). Requests
# with more characters than this go to a lane of their own, so a small request never waits behind
# a large one's tokenization (each lane is one thread: they share the GIL with the loop, which the
# interpreter hands over every switch interval: 0.5 ms while serving, service.api.app.tune_interpreter).
SMALL_REQUEST_CHARS = 16_384
# Padding allowed per real token in one forward when BRADLEY_MAX_PADDING is unset. On a CPU a
# padded token costs as much as a real one; a GPU wants big batches.
AUTO_PADDING = {"cpu": 0.1, "cuda": 1.0}
# Padded tokens per forward when BRADLEY_MAX_BATCH_TOKENS is unset. On a GPU a small model's forward
# costs its kernel launches more than its arithmetic, so one row costs almost what 64 do and large
# forwards pay (bench/RESULTS.md has the H200 figures); on a CPU the cost follows the tokens.
AUTO_BATCH_TOKENS = {"cpu": 16384, "cuda": 65536}


class NotReady(ValueError):
    """No model is loaded yet (503)."""


class Forbidden(ValueError):
    """The request is understood but not allowed on this server (403)."""


class NotFound(ValueError):
    """A named thing (model, report) does not exist (404)."""


class RowsRefused(ValueError):
    """An upload with bad rows in abort mode: nothing was written (422). Worded for HTTP clients,
    who choose the mode with `?on_error=`, not the CLI's `--on-error`."""

    def __init__(self, errors: list[str], field: str | None = None):
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        super().__init__(f"{errors[0] if errors else 'bad rows'}{more}; nothing was written (fix "
                         "the rows, or send ?on_error=skip to keep the good ones)")
        self.errors, self.field = errors, field


@dataclass(frozen=True)
class LoadedModel:
    """What /score serves: one model, or an ensemble (`id` joins its members' ids with +)."""

    id: str
    path: str
    rm: object  # rm.model.reward_model.RewardModel (imported lazily: it pulls in torch); it tokenizes
    lanes: tuple = ()  # ensemble.Lane: none for one unwatched model, scored by `scorer` alone
    unwatched: str | None = None  # why the watch does not measure it (None: it does)

    @property
    def scorer(self) -> Callable[[list[list[int]]], list[float]]:
        return self.rm.score_encoded

    @property
    def members(self) -> list[Member]:
        return [m for lane in self.lanes for m in lane.members]


class Service:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.limits = Limits(settings.max_items_per_request, settings.max_text_chars,
                             max_get_reward_items=settings.max_get_reward_items)
        self.anon_limits = Limits(settings.max_items_per_request, settings.max_text_chars,
                                  settings.anon_max_request_chars, "callers without a key",
                                  settings.max_get_reward_items)
        self._encoders = {lane: ThreadPoolExecutor(1, thread_name_prefix=f"bradley-tokenize-{lane}")
                          for lane in ("small", "large")}
        # small /score requests: many per tokenizer call, the large lane one by one
        self._batched_encoder = EncodeQueue("bradley-tokenize-batched")
        self.batcher = Batcher(settings.max_batch_tokens or AUTO_BATCH_TOKENS["cpu"],
                               settings.max_batch_items,
                               settings.max_wait_ms / 1000, settings.max_queue_items,
                               on_forward=self.metrics.on_forward)
        self.metrics.queue_items.set_function(lambda: self.batcher.queued_items)
        self.metrics.queue_limit.set(settings.max_queue_items)
        self.metrics.model_ready.set_function(lambda: float(self.current is not None))
        self.metrics.read_only.set(float(settings.read_only))
        self.verifiers = VerifierPool(settings.verifier_workers, settings.verifier_timeout_s,
                                      plugins_setting(settings.verifier_plugins),
                                      on_status=self.metrics.on_check)
        self.reward_weights = weights_setting(settings.reward_weights)
        self.aggregation = Aggregation(settings.ensemble_aggregate,
                                       settings.ensemble_uncertainty_weight)
        self.watch = None if settings.watch == "off" else Watch(
            self.metrics.watch, settings.watch_window, settings.watch_max_runs,
            history_interval_s=settings.watch_history_interval_s,
            history_len=settings.watch_history_len)
        self.pass_rates = PassRates()
        self.store = None
        self.current: LoadedModel | None = None
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="bradley-store")
        self._swap_lock = threading.Lock()
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Service:
        """Open the store, load the configured model, start the batcher. Idempotent; raises
        ValueError (with the fix) on a locked store or a missing model, before any port is bound."""
        if self._started:
            return self
        self.store = _open_store(self.settings)
        if self.settings.model:
            self._install(self._load(self.settings.model))
        self.batcher.start()
        if self.watch is not None:
            self.watch.start()
        self._started = True
        return self

    def stop(self) -> None:
        """Drain the scoring queue, finish queued store work, close the store."""
        self._batched_encoder.close()  # first: what it still holds goes on to the batcher
        drained = self.batcher.close(timeout=self.settings.drain_timeout_s)
        if not drained:
            log.warning("scoring queue not drained within %.0f s", self.settings.drain_timeout_s)
        self.verifiers.close()
        if self.watch is not None:
            self.watch.close()
        self._store_thread.shutdown(wait=True)
        for encoder in self._encoders.values():
            encoder.shutdown(wait=True)
        if self.store is not None:
            self.store.close()
            self.store = None
        self._started = False

    # -- models ----------------------------------------------------------------------------------

    def _load(self, ref: str) -> LoadedModel:
        """One model, or an ensemble of the comma-separated ids or folders in `ref`."""
        members = [self._load_member(part.strip()) for part in ref.split(",") if part.strip()]
        if not members:
            raise NotFound(f"model {ref!r} names no model; pass an id or a folder")
        lanes, unwatched = plan_lanes(members, self.settings.watch)
        first = members[0]
        model_id = "+".join(m.id for m in members)
        path = first.path if len(members) == 1 else ",".join(m.path for m in members)
        return LoadedModel(model_id, path, first.rm, lanes, unwatched)

    def _load_member(self, ref: str) -> Member:
        from rm.model.reference_stats import read_reference_stats
        from rm.model.reward_model import RewardModel

        model_id, path = self._resolve(ref)
        rm = RewardModel.load(path, device=self.settings.device)
        _set_threads(self.settings.torch_threads, rm.device.type)
        model_id = model_id or rm.model_id or Path(path).name
        return Member(model_id, str(path), rm, read_reference_stats(path))

    def _resolve(self, ref: str) -> tuple[str | None, str]:
        """(store id or None for a bare folder, folder)."""
        if Path(ref).is_dir():
            return None, str(Path(ref).resolve())
        if self.store is None:
            raise NotFound(f"model {ref!r} is not a folder and no store is open; pass a model folder")
        try:
            row = self.call_store(self.store.model, ref)
        except ValueError as exc:
            raise NotFound(str(exc)) from None
        return row["id"], check_row(row)  # a retired id or changed weights: refused

    def _install(self, loaded: LoadedModel) -> None:
        device = getattr(getattr(loaded.rm, "device", None), "type", "cpu")
        padding, tokens = self.settings.max_padding, self.settings.max_batch_tokens
        self.batcher.max_padding = AUTO_PADDING.get(device, 1.0) if padding is None else padding
        self.batcher.max_batch_tokens = tokens or AUTO_BATCH_TOKENS.get(device, 65536)
        self.current = loaded  # one reference swap: requests already tokenized keep the old model
        self.metrics.on_model(loaded.id, loaded.rm.prompts)
        if self.watch is not None:
            watched = None if loaded.unwatched else {m.id: m.stats for m in loaded.members}
            self.watch.install(watched, loaded.unwatched)
        log.info("serving model %s from %s", loaded.id, loaded.path)

    async def load_model(self, ref: str) -> LoadedModel:
        """Hot swap. Loading happens off the event loop while the old model keeps serving."""
        def load_and_install():
            with self._swap_lock:
                loaded = self._load(ref)
                self._install(loaded)
                return loaded

        return await asyncio.get_running_loop().run_in_executor(None, load_and_install)

    async def models(self) -> list[dict]:
        rows = await self.in_store(self.store.models) if self.store is not None else []
        active = self.current.id if self.current else None
        listed = [{**row, "active": row["id"] == active} for row in rows]
        if self.current and not any(row["active"] for row in listed):
            listed.append({"id": self.current.id, "path": self.current.path, "active": True})
        return listed

    # -- scoring ---------------------------------------------------------------------------------

    def limits_for(self, caller) -> Limits:
        """The request limits of a caller (`service.api.deps.Caller`): a budget without a key."""
        return self.limits if caller.keyed else self.anon_limits

    async def score_detail(self, prompts: list, responses: list[str],
                           options: ScoreOptions | None = None) -> Scored:
        """Scores of the served model, or an ensemble's aggregate with its members' (each lane of
        members tokenizes once, concurrently); what the watch measures is handed to it."""
        loaded = self.current
        if loaded is None:
            raise NotReady("no model is loaded; start with --model or POST /models/{id}/load")
        options = options or ScoreOptions()
        if not loaded.lanes:
            scored = Scored(loaded.id, await self._encode_and_score(
                loaded.rm, loaded.scorer, prompts, responses))
        else:
            rows = await asyncio.gather(*(self._encode_and_score(lane.rm, lane.scorer, prompts,
                                                                 responses) for lane in loaded.lanes))
            scored = assemble(loaded.id, loaded.lanes, rows, options.aggregation or self.aggregation)
            if self.watch is not None and not loaded.unwatched:
                self.watch.record(options.run, responses, scored)
        self.metrics.on_scores(loaded.id, responses, scored.scores)
        return scored

    async def _encode_and_score(self, rm, scorer, prompts: list, responses: list[str]) -> list:
        if text_chars(prompts, responses) <= SMALL_REQUEST_CHARS:  # tokenized, then scored
            return await self._batched_encoder.encode(
                rm, prompts, responses, then=partial(self.batcher.submit, scorer))
        ids = await asyncio.get_running_loop().run_in_executor(
            self._encoders["large"], rm.encode, prompts, responses)
        return await self.batcher.score(scorer, ids)

    async def get_reward(self, req, options: ScoreOptions | None = None) -> tuple[Scored, list]:
        """OpenRLHF's queries split by the served model's template (rm/model/template.py: split_query) and
        scored like /score; returns (Scored, the Split of each query). A query that cannot
        be split honestly is counted, and refused (422 naming it) under BRADLEY_STRICT_GET_REWARD=1.
        An ensemble splits by its first member's template."""
        if self.current is None:
            raise NotReady("no model is loaded; start with --model or POST /models/{id}/load")
        splits = await self.split_queries(req)
        scored = await self.score_detail([s.prompt for s in splits], [s.response for s in splits],
                                         options)
        return scored, splits

    async def split_queries(self, req) -> list:
        """Each query as (prompt, response): by the served model's template when a model is loaded;
        without one (a verifier-only server) by the given prompt when it is a prefix, else unsplit."""
        from rm.model.template import Split, split_query

        loaded = self.current
        given = req.prompts or [None] * len(req.queries)

        def split_all():
            if loaded is None:
                return [Split(p, q[len(p):], "prompt_prefix") if p and q.startswith(p)
                        else Split("", q, "unsplit") for q, p in zip(req.queries, given, strict=True)]
            return [split_query(loaded.rm.tokenizer, q, p) for q, p in zip(req.queries, given, strict=True)]

        # string work grows with the texts: off the event loop, in the tokenizer lane of this size
        lane = "small" if text_chars([], req.queries) <= SMALL_REQUEST_CHARS else "large"
        splits = await asyncio.get_running_loop().run_in_executor(self._encoders[lane], split_all)
        for split in splits:
            self.metrics.get_reward_splits.labels(split.how).inc()
        unsplit = [i for i, s in enumerate(splits) if s.how == "unsplit"]
        if unsplit and self.settings.strict_get_reward:
            raise PayloadError(f"query[{unsplit[0]}]", f"{len(unsplit)} of {len(splits)} queries cannot "
                               "be split into prompt + response (the prompt is not a prefix of the "
                               "query and the query carries no chat template); send `prompts` that "
                               "the queries start with, or unset BRADLEY_STRICT_GET_REWARD")
        return splits

    # -- the store -------------------------------------------------------------------------------

    def call_store(self, fn, *args, **kwargs):
        """Run on the store thread and wait (for callers that are already off the event loop)."""
        return self._store_thread.submit(fn, *args, **kwargs).result()

    async def in_store(self, fn, *args, **kwargs):
        if self.store is None:
            raise Forbidden("no store is open on this server (read-only replica without a database)")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store_thread, lambda: fn(*args, **kwargs))

    async def ingest(self, route: str, records: list[dict], on_error: str = "abort"):
        if self.settings.read_only:
            raise Forbidden("this server is read-only (--read-only); upload to the writer instead")
        from annotation.ingest.batch import IngestError, ingest_records

        def run():
            return ingest_records(self.store, records, fmt=UPLOAD_FORMATS[route],
                                  source=f"http:/{route}", on_error=on_error)

        try:
            result = await self.in_store(run)
        except ValueError as exc:
            self.metrics.on_ingest(route, 0, len(records), "rejected")
            if isinstance(exc, IngestError):
                raise RowsRefused(exc.errors, exc.field) from None
            raise
        outcome = "failed" if result.failed else ("duplicate" if result.duplicate else "ok")
        self.metrics.on_ingest(route, result.rows_ok, result.rows_rejected, outcome)
        return result

    async def label_studio_event(self, kind: str, payload) -> dict:
        """A Label Studio webhook event (service.api.webhook.webhook_event): a verdict is ingested
        like an export (an edit replaces, a cancelled annotation retracts), deleted annotations are
        retracted. An invalid annotation is a 422 naming it, and nothing is stored."""
        from annotation.label_studio import ledger as ls_ledger
        from annotation.label_studio import mapping as ls_mapping

        route = "webhooks/label-studio"
        if self.settings.read_only:
            raise Forbidden("this server is read-only (--read-only); send webhooks to the writer")
        ann = payload["annotations"][0] if kind == "verdict" else None
        if kind == "deleted" or ann.get("was_cancelled"):
            reason = "deleted" if kind == "deleted" else "cancelled"
            gone = ({i: None for i in payload} if kind == "deleted"
                    else {ann["id"]: ls_mapping.version(ann)})
            retracted = await self.in_store(ls_ledger.remove, self.store, gone, reason,
                                            f"http:/{route}")
            return {reason: len(gone), "retracted": retracted}
        try:
            result = await self.ingest(route, [payload])
        except RowsRefused as exc:
            problem = exc.errors[0].partition(": ")[2].partition(": ")[2]  # after "where:line: field"
            raise PayloadError(exc.field, f"{problem}; the annotation "
                               "was not stored (Label Studio accepted it, bradley cannot read it "
                               "as a verdict)") from None
        return {k: getattr(result, k, None) for k in ("batch_id", "rows_ok", "duplicate")}


def _set_threads(threads: int | None, device: str) -> None:
    """One batcher thread runs every forward, so on a CPU it gets every core this process may use
    (BRADLEY_TORCH_THREADS or OMP_NUM_THREADS override): the event loop needs a small share."""
    import torch

    if threads is None and device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        threads = len(os.sched_getaffinity(0))
    if threads:
        torch.set_num_threads(threads)


def _open_store(settings: Settings):
    from annotation.store import Store

    if settings.read_only:
        return Store(settings.db, read_only=True) if Path(settings.db).exists() else None
    return Store(settings.db)
