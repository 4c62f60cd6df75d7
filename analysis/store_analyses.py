"""The report's three analyses of a store, in memory that does not grow with it.

`Store.verdict_codes` (annotation/verdict_codes.py, where the SQL lives) codes the snapshot's
verdicts as integers inside DuckDB, which spills to disk beyond its memory limit. Length bias reads
the verdicts counted by (rater, winner, length difference, sources); agreement and cycles read every
verdict sorted by item, a block of whole prompts at a time, add up each block's counts
(`agreement.block_counts`, `cycles.block_counts`) and finish once. The figures are those of
`length_bias.analyze`, `agreement.analyze` and `cycles.analyze` on the whole verdict table sorted
by item (prompt, then the item's two response ids): items, their order and the order of their
responses are what the Bradley–Terry gauge and the choice among equally bad cycles follow.
Below the bootstrap's budget (cycles.default_n_boot) every verdict is one block, since the
bootstrap refits all of them at once.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from analysis import agreement, cycles, length_bias
from analysis.verdicts import coded_verdicts

BLOCK_VERDICTS = 1 << 18  # verdicts per block of prompts
STREAM_COLUMNS = ("prompt", "lo", "hi", "rater", "winner", "swapped")


def analyze(store, snapshot_id: str, progress: bool = False, timings: dict | None = None) -> dict | None:
    """n_judgments, n_prompts, n_raters, length_bias, agreement and cycles of one snapshot (None
    when it holds no verdict). `timings`, when given, receives the seconds of each phase."""
    timings = {} if timings is None else timings
    with _progress_bar(progress) as bar:
        with _timed(timings, "coding"):
            codes = store.verdict_codes(snapshot_id)
        with codes:
            n_judgments, n_prompts = codes.counts()
            return None if n_judgments == 0 else _analyses(codes, n_judgments, n_prompts, bar, timings)


def _analyses(codes, n_judgments: int, n_prompts: int, bar, timings: dict) -> dict:
    rater_names = np.array(codes.rater_names(), dtype=object)
    out = {"n_judgments": n_judgments, "n_prompts": n_prompts, "n_raters": len(rater_names)}
    with _timed(timings, "length_bias"):
        out["length_bias"] = length_bias.analyze_cells(_length_columns(codes, rater_names))
    voices = codes.voices_per_rater()
    load = np.zeros(len(rater_names), dtype=np.int64)
    load[voices["rater"].to_numpy()] = voices["n"].to_numpy()
    busy = agreement.busiest_raters(load)
    n_boot = cycles.default_n_boot(n_judgments)
    bar.reset(total=n_judgments)
    bar.set_description("report: prompts")
    # the bootstrap refits every verdict at once: then one block holds them all
    with _timed(timings, "blocks"):  # agreement and cycles, and reading the verdicts for them
        counts, last_block = _stream(codes, rater_names, busy,
                                     n_judgments + 1 if n_boot else BLOCK_VERDICTS, bar, timings)
    with _timed(timings, "finish"):
        out["agreement"] = agreement.finish(counts["agreement"], rater_names, busy)
        out["cycles"] = cycles.finish(counts["cycles"], n_boot, last_block)
        _name_cycles(codes, out["cycles"]["worst_cycles"])
    return out


def _stream(codes, rater_names, busy, block_verdicts: int, bar, timings: dict) -> tuple:
    """Both analyses' counts over every block of prompts, and the last block (the whole data when
    it is the only one)."""
    agree = cyc = v = None
    for block in blocks_of_prompts(codes.verdict_batches(block_verdicts), block_verdicts):
        v = coded_verdicts(*(block[c] for c in STREAM_COLUMNS), rater_names)
        with _timed(timings, "agreement"):
            agree = agreement.add_counts(agree, agreement.block_counts(v, busy))
        with _timed(timings, "cycles"):
            cyc = cycles.add_counts(cyc, cycles.block_counts(v))
        bar.update(len(v.item))
    return {"agreement": agree, "cycles": cyc}, v


def blocks_of_prompts(batches, block_verdicts: int):
    """Record batches sorted by prompt, regrouped into blocks of at least `block_verdicts` rows
    (or what is left) that never split a prompt: dicts of numpy columns.

    >>> import pyarrow as pa
    >>> batches = [pa.record_batch({"prompt": [1, 1, 2]}), pa.record_batch({"prompt": [2, 3, 3]})]
    >>> [b["prompt"].tolist() for b in blocks_of_prompts(batches, 2)]
    [[1, 1], [2, 2], [3, 3]]
    """
    held: list[dict] = []
    rows = 0
    for batch in batches:
        held.append({name: batch.column(name).to_numpy(zero_copy_only=False)
                     for name in batch.schema.names})
        rows += batch.num_rows
        if rows < block_verdicts:
            continue
        columns = {name: np.concatenate([h[name] for h in held]) for name in held[0]}
        prompt = columns["prompt"]
        cut = int(np.searchsorted(prompt, prompt[-1], side="left"))  # the last prompt may go on
        if cut == 0:
            held = [columns]
            continue
        yield {name: column[:cut] for name, column in columns.items()}
        held, rows = [{name: column[cut:] for name, column in columns.items()}], len(prompt) - cut
    if rows:
        yield {name: np.concatenate([h[name] for h in held]) for name in held[0]}


def _length_columns(codes, rater_names) -> dict:
    """The verdicts counted by (rater, winner, delta, sources) as `length_bias.analyze_cells`
    takes them; sources only when every verdict has both and there are two or more."""
    cells = codes.length_cells()
    delta = cells["delta"].to_numpy().astype(float)
    cols = {"winner": cells["winner"].to_numpy().astype(np.int8), "len_a": delta,
            "len_b": np.zeros(len(delta)), "count": cells["n"].to_numpy(),
            "rater": cells["rater"].to_numpy().astype(np.int64), "rater_names": list(rater_names),
            "source_names": []}
    source_a, source_b = cells["source_a"], cells["source_b"]
    if source_a.null_count == 0 and source_b.null_count == 0:
        a, b = source_a.to_numpy(), source_b.to_numpy()
        used, local = np.unique(np.concatenate([a, b]), return_inverse=True)
        if len(used) >= 2:
            names = codes.source_names()
            cols.update(source_names=[names[s] for s in used], source_a=local[:len(a)],
                        source_b=local[len(a):])
    return cols


def _name_cycles(codes, worst_cycles: list) -> None:
    """The blocks name prompts and responses by code: the few quoted cycles get their ids back."""
    prompts = codes.prompt_ids([c["prompt_id"] for c in worst_cycles])
    responses = codes.response_ids([r for c in worst_cycles for r in c["responses"]])
    for cycle in worst_cycles:
        cycle["prompt_id"] = prompts[int(cycle["prompt_id"])]
        cycle["responses"] = [responses[int(r)] for r in cycle["responses"]]


@contextmanager
def _timed(timings: dict, phase: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - started


def _progress_bar(show: bool):
    """A bar on stderr over the verdicts (shown on a terminal only); reading the store comes first."""
    from tqdm import tqdm

    return tqdm(desc="report: reading the store", unit=" judgments", unit_scale=True, leave=False,
                disable=None if show else True)
