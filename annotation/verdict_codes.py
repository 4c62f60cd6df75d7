"""A snapshot's verdicts as integer codes inside DuckDB, for statistics on stores larger than memory.

`VerdictCodes(store, snapshot_id)` joins the snapshot's judgments (self-comparisons left out, as in
`Store.verdict_arrays`) with their prompts, responses and raters once, into a temp table of
integers on a cursor of its own: one row per verdict with prompt, lo, hi (the item's two responses,
lower id first), rater, winner (0 'a', 1 'b', 2 'tie'), swapped (response_a is the item's hi),
delta (len_a − len_b in characters) and the two responses' source codes. Every code follows the
sort order of what it codes (ids, rater names, source model names), so ordering by codes is ordering
by ids. Grouping and counting then run on integers in DuckDB, which spills to disk beyond its
memory limit; the per-prompt work reads `verdict_batches`, sorted by item.

    >>> from annotation.store import Store
    >>> from annotation.simulate import SimulationConfig, load_into
    >>> store = Store(":memory:")
    >>> _ = load_into(store, SimulationConfig(prompts=2, responses=3, raters=6, seed=1))
    >>> with VerdictCodes(store) as codes:
    ...     print(codes.counts(), codes.rater_names()[:3])
    (18, 2) ['ai:sim-judge-0:default', 'human:sim-00', 'human:sim-01']
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

BUILD = (
    """CREATE TEMP TABLE report_raters AS
       SELECT rater AS name, (row_number() OVER (ORDER BY rater) - 1)::INTEGER AS code
       FROM (SELECT DISTINCT rater FROM judgments_in($1, $2) WHERE response_a <> response_b)""",
    """CREATE TEMP TABLE report_prompts AS
       SELECT id, (row_number() OVER (ORDER BY id) - 1)::INTEGER AS code FROM prompts""",
    """CREATE TEMP TABLE report_sources AS
       SELECT source_model AS name, (row_number() OVER (ORDER BY source_model) - 1)::INTEGER AS code
       FROM (SELECT DISTINCT source_model FROM responses WHERE source_model IS NOT NULL)""",
    # lengths first, into a table of their own: ranking the ids beside the texts sorts the texts too
    """CREATE TEMP TABLE report_response_lengths AS
       SELECT r.id, length(r.text)::BIGINT AS len, s.code AS source
       FROM responses r LEFT JOIN report_sources s ON s.name = r.source_model""",
    """CREATE TEMP TABLE report_responses AS
       SELECT id, (row_number() OVER (ORDER BY id) - 1)::INTEGER AS code, len, source
       FROM report_response_lengths""",
    "DROP TABLE report_response_lengths",
    """CREATE TEMP TABLE report_verdicts AS
       SELECT p.code AS prompt, least(a.code, b.code) AS lo, greatest(a.code, b.code) AS hi,
              r.code AS rater,
              (CASE j.winner WHEN 'a' THEN 0 WHEN 'b' THEN 1 ELSE 2 END)::TINYINT AS winner,
              a.code > b.code AS swapped, a.len - b.len AS delta,
              a.source AS source_a, b.source AS source_b
       FROM judgments_in($1, $2) j
       JOIN report_prompts p ON p.id = j.prompt_id
       JOIN report_responses a ON a.id = j.response_a
       JOIN report_responses b ON b.id = j.response_b
       JOIN report_raters r ON r.name = j.rater
       WHERE j.response_a <> j.response_b""",
)
TEMP_TABLES = ("report_verdicts", "report_responses", "report_response_lengths", "report_sources",
               "report_prompts", "report_raters")


class VerdictCodes:
    """The coded verdicts of one snapshot (or of everything now, with a rater filter), on a cursor
    that holds them until `close()`."""

    def __init__(self, store, snapshot_id: str | None = None, raters: str | None = None):
        self.cur = store.cursor()
        params = list(store.snapshot_filter(snapshot_id, raters))
        try:
            for statement in BUILD:
                self.cur.execute(statement, params if "$1" in statement else [])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for table in TEMP_TABLES:
            self.cur.execute(f"DROP TABLE IF EXISTS {table}")  # names are constants
        self.cur.close()

    def __enter__(self) -> VerdictCodes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _arrow(self, query: str, params: Sequence = ()) -> pa.Table:
        return self.cur.sql(query, params=list(params)).to_arrow_table()

    # -- dictionaries ---------------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(verdicts, distinct prompts)."""
        return self.cur.sql("SELECT count(*), count(DISTINCT prompt) FROM report_verdicts").fetchall()[0]

    def rater_names(self) -> list[str]:
        """Rater ids by code (sorted)."""
        return [r[0] for r in self.cur.sql("SELECT name FROM report_raters ORDER BY code").fetchall()]

    def source_names(self) -> list[str]:
        """Source model names by code (sorted), every source in the store."""
        return [r[0] for r in self.cur.sql("SELECT name FROM report_sources ORDER BY code").fetchall()]

    def prompt_ids(self, codes: Sequence[int]) -> dict[int, str]:
        rows = self.cur.sql("SELECT code, id FROM report_prompts WHERE list_contains($1, code)",
                            params=[list(map(int, codes))]).fetchall()
        return dict(rows)

    def response_ids(self, codes: Sequence[int]) -> dict[int, str]:
        rows = self.cur.sql("SELECT code, id FROM report_responses WHERE list_contains($1, code)",
                            params=[list(map(int, codes))]).fetchall()
        return dict(rows)

    # -- aggregates -----------------------------------------------------------------------------

    def length_cells(self) -> pa.Table:
        """Verdicts counted by (rater, winner, delta, source_a, source_b): column n; sorted."""
        return self._arrow("SELECT rater, winner, delta, source_a, source_b, count(*) AS n "
                           "FROM report_verdicts GROUP BY ALL ORDER BY ALL")

    def voices_per_rater(self) -> pa.Table:
        """How many items each rater judged (rater, n): a rater's repeated verdicts on an item are one voice."""
        return self._arrow("SELECT rater, count(*) AS n FROM (SELECT DISTINCT prompt, lo, hi, rater "
                           "FROM report_verdicts) GROUP BY rater ORDER BY rater")

    def verdict_batches(self, rows: int) -> pa.RecordBatchReader:
        """prompt, lo, hi, rater, winner, swapped of every verdict, sorted by (prompt, lo, hi), in
        record batches of `rows`."""
        relation = self.cur.sql("SELECT prompt, lo, hi, rater, winner, swapped FROM report_verdicts "
                                "ORDER BY prompt, lo, hi")
        # to_arrow_reader is DuckDB 1.4's name; fetch_record_batch the older one
        reader = getattr(relation, "to_arrow_reader", None) or relation.fetch_record_batch
        return reader(rows)
