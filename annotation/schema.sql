-- bradley store, schema version 2. The only schema; store.py applies it and later migrations
-- (annotation/migrations.py).
-- Ids are content-derived (annotation/ids.py), so the same text, or judgment, is one row however often
-- and by whichever route it arrives.
-- prompts, responses and judgments declare no PRIMARY KEY on purpose: keeping an ART index up to date
-- cost four index inserts per ingested row and 4/5 of ingest time. Their ids are still unique; store.py
-- keeps them so: a batch writes each new id once (ingest remembers the ids it has written) and then
-- removes the copies of ids that were in the store before it (ingest/inserts.py), in the same
-- transaction. Writes are serialized: DuckDB lets one process hold the file, and the server writes
-- from one thread.

CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

-- What each migration of this store did, in a line (annotation/migrations.py).
CREATE TABLE IF NOT EXISTS migrations (
    version    INTEGER NOT NULL,
    applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    summary    VARCHAR NOT NULL
);

CREATE TABLE IF NOT EXISTS prompts (
    id       VARCHAR NOT NULL,         -- unique; content_id(text) or content_id(canonical messages JSON)
    text     VARCHAR NOT NULL,         -- plain text; for conversations a rendering of the messages
    messages JSON                      -- list of {"role","content"} when the prompt came as a conversation
);

CREATE TABLE IF NOT EXISTS responses (
    id           VARCHAR NOT NULL,     -- unique; content_id(prompt key, text)
    prompt_id    VARCHAR NOT NULL,
    text         VARCHAR NOT NULL,
    source_model VARCHAR               -- which model wrote it, when known
);

-- Provenance: one row per ingested file, HTTP upload or labeling run.
CREATE TABLE IF NOT EXISTS batches (
    id            VARCHAR PRIMARY KEY,
    seq           BIGINT NOT NULL UNIQUE,   -- increasing; snapshots are "every batch up to seq N"
    source        VARCHAR NOT NULL,         -- file path, "http:/judgments", "rlaif:<constitution>", ...
    sha256        VARCHAR NOT NULL,         -- of the raw content; the same sha256 is never ingested twice
    rows_in       BIGINT NOT NULL,
    rows_ok       BIGINT NOT NULL,
    rows_rejected BIGINT NOT NULL,
    created_at    TIMESTAMP NOT NULL DEFAULT current_timestamp
);
CREATE UNIQUE INDEX IF NOT EXISTS batches_sha256 ON batches (sha256);

CREATE TABLE IF NOT EXISTS rejects (
    batch_id VARCHAR NOT NULL,
    line     BIGINT NOT NULL,           -- 1-based line (JSONL/CSV) or row number (JSON list, Parquet, HF)
    reason   VARCHAR NOT NULL,          -- "field: what is wrong"
    raw      VARCHAR                    -- the offending row as text, cut to 10k characters
);

-- One row per rater per comparison: the truth. Pairs are derived from it (view below).
CREATE TABLE IF NOT EXISTS judgments (
    id         VARCHAR NOT NULL,        -- unique: judgment_id(...) below, over what the judgment is,
                                        -- so the same judgment by any route is one row
    prompt_id  VARCHAR NOT NULL,
    response_a VARCHAR NOT NULL,        -- response ids, in the order the rater saw them
    response_b VARCHAR NOT NULL,
    winner     VARCHAR NOT NULL CHECK (winner IN ('a', 'b', 'tie')),
    strength   DOUBLE,                  -- optional confidence / margin given by the rater
    rater      VARCHAR NOT NULL,        -- human:<id> | ai:<model>:<constitution>
    source     VARCHAR NOT NULL,        -- input format: trl | hh | judgments | label-studio | rlaif | http
    batch_id   VARCHAR NOT NULL,
    created_at TIMESTAMP,
    rationale  VARCHAR,
    metadata   JSON,                    -- extra input columns, kept as they came
    given_id   VARCHAR                  -- the row's own id as it came, where it is part of `id` (a
                                        -- rater's deliberate repeat says so with an id); an export writes it back
    -- response_a = response_b is allowed: two models can write the same text and the vote is still
    -- real (MT-Bench has such ties). Pairs and verdict arrays leave these self-comparisons out.
);

-- Unpaired thumbs up/down (KTO).
CREATE TABLE IF NOT EXISTS feedback (
    id          VARCHAR PRIMARY KEY,   -- feedback_id(...) below
    prompt_id   VARCHAR NOT NULL,
    response_id VARCHAR NOT NULL,
    label       BOOLEAN NOT NULL,
    rater       VARCHAR NOT NULL,
    batch_id    VARCHAR NOT NULL,
    given_id    VARCHAR                -- as in judgments
);

-- A judgment's id: content_id over what it is, as ids.judgment_content lists it (rater, the response
-- ids in the order shown, which carry the prompt and texts; verdict; strength as printf %.17g; time as
-- epoch microseconds; the text model_a and model_b of its metadata; the row's own id), nulls as empty
-- text. Ingest computes the same in Python (ids.with_ids); the migration to content ids
-- (annotation/migrations.py) uses these.
CREATE OR REPLACE MACRO vote_model(metadata, path) AS
    CASE WHEN json_type(metadata, path) = 'VARCHAR' THEN json_extract_string(metadata, path) END;
CREATE OR REPLACE MACRO judgment_id(rater, response_a, response_b, winner, strength, created_at, metadata,
                                    given_id) AS
    left(sha256(concat_ws(chr(31), rater, response_a, response_b, winner,
                          coalesce(printf('%.17g', strength), ''),
                          coalesce(CAST(epoch_us(created_at) AS VARCHAR), ''),
                          coalesce(vote_model(metadata, '$.model_a'), ''),
                          coalesce(vote_model(metadata, '$.model_b'), ''), coalesce(given_id, ''))), 24);
CREATE OR REPLACE MACRO feedback_id(rater, response_id, label, given_id) AS
    left(sha256(concat_ws(chr(31), rater, response_id, CAST(label AS VARCHAR), coalesce(given_id, ''))), 24);

-- Judgment and feedback ids of stores made before content ids, and what they became: an export
-- written then carries them, and ingesting it again must add nothing.
CREATE TABLE IF NOT EXISTS former_ids (
    former_id VARCHAR NOT NULL,
    id        VARCHAR NOT NULL
);

-- What a training or report run read: a rater filter plus "every batch with seq <= max_batch_seq".
CREATE TABLE IF NOT EXISTS snapshots (
    id           VARCHAR PRIMARY KEY,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp,
    filter       JSON NOT NULL,
    n_judgments  BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS models (
    id          VARCHAR PRIMARY KEY,
    kind        VARCHAR NOT NULL,       -- rm | dpo | ipo | kto | simpo | orpo
    base_model  VARCHAR NOT NULL,
    path        VARCHAR NOT NULL,
    snapshot_id VARCHAR,
    config      JSON,
    metrics     JSON,
    created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- Reference-model log-probs, computed once per (reference model, chat template, response).
CREATE TABLE IF NOT EXISTS ref_logps (
    model_hash    VARCHAR NOT NULL,
    template_hash VARCHAR NOT NULL,
    response_id   VARCHAR NOT NULL,
    logp          DOUBLE NOT NULL,      -- sum of log-probs over the response tokens
    n_tokens      INTEGER NOT NULL,
    PRIMARY KEY (model_hash, template_hash, response_id)
);

-- Judgments withdrawn by a later batch: a Label Studio annotation that was edited (the new version
-- is a new judgment) or deleted. The rows stay in judgments, so a snapshot taken before still replays
-- exactly; judgments_in leaves out what a batch inside the snapshot retracted.
CREATE TABLE IF NOT EXISTS retractions (
    judgment_id VARCHAR NOT NULL,
    batch_id    VARCHAR NOT NULL,       -- the batch that retracted it
    reason      VARCHAR NOT NULL        -- updated | deleted | cancelled
);

-- Label Studio (annotation/label_studio/ledger.py holds their SQL). One store pairs with one Label Studio
-- server: its annotation ids are unique across that server's projects, and export files do not say
-- which server they came from.
CREATE TABLE IF NOT EXISTS ls_projects (
    url         VARCHAR NOT NULL,       -- the server's base URL, as given to setup
    project_id  BIGINT NOT NULL,
    title       VARCHAR NOT NULL,
    overlap     INTEGER NOT NULL,       -- maximum_annotations: raters per task
    pull_cursor VARCHAR,                -- newest task updated_at a pull has taken in
    created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (url, project_id)
);

-- One row per pair pushed as a task: a pair is pushed to a project once.
CREATE TABLE IF NOT EXISTS ls_tasks (
    url        VARCHAR NOT NULL,
    project_id BIGINT NOT NULL,
    task_id    BIGINT NOT NULL,
    prompt_id  VARCHAR NOT NULL,
    response_a VARCHAR NOT NULL,        -- the pair's order: ascending response id
    response_b VARCHAR NOT NULL,
    swapped    BOOLEAN NOT NULL,        -- response_b was shown on the left
    strategy   VARCHAR NOT NULL,        -- uncertain | disagreement | coverage | random
    pushed_at  TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (url, project_id, prompt_id, response_a, response_b)
);

-- Every Label Studio annotation the store has seen, whichever way it came (export file, webhook,
-- pull): its newest version and the judgments that version counts as, so nothing is counted twice.
CREATE TABLE IF NOT EXISTS ls_annotations (
    annotation_id BIGINT PRIMARY KEY,
    task_id       BIGINT,
    version       VARCHAR NOT NULL,     -- updated_at (UTC ISO); a later version replaces this one
    judgment_ids  VARCHAR[] NOT NULL,   -- empty when cancelled or deleted
    deleted       BOOLEAN NOT NULL,     -- deleted in Label Studio: never counted again
    batch_id      VARCHAR NOT NULL
);

-- The judgments a snapshot reads: every batch up to max_seq (NULL: all) by raters whose id starts
-- with rater_prefix (NULL: all), less those retracted by a batch up to max_seq. Views and exports
-- read through this, so a snapshot replays exactly.
CREATE OR REPLACE MACRO judgments_in(max_seq, rater_prefix) AS TABLE
    SELECT j.*
    FROM judgments j JOIN batches b ON b.id = j.batch_id
    WHERE (max_seq IS NULL OR b.seq <= max_seq)
      AND (rater_prefix IS NULL OR starts_with(j.rater, rater_prefix))
      AND j.id NOT IN (SELECT r.judgment_id FROM retractions r JOIN batches rb ON rb.id = r.batch_id
                       WHERE max_seq IS NULL OR rb.seq <= max_seq);

-- One voice per (prompt, unordered response pair, rater). A rater who judged a comparison more than
-- once (an AI judge asks in both presentation orders, annotation/rlaif/constitution.py) counts once, never twice
-- against a human's single vote. p_lo is the mean over the rater's verdicts of P(lo better): 1, 0 or
-- 1/2 for a plain a/b/tie verdict, the judge's probability for a source 'rlaif' verdict (its strength
-- is P(winner better)). The voice is lo or hi by that mean, and a tie when the mean is 1/2 or when
-- its verdicts point opposite ways by more than 0.1 each (a position-biased judge that preferred
-- whatever was shown first). A human's single verdict gives p_lo 1, 0 or 1/2, as before.
CREATE OR REPLACE MACRO voices_in(max_seq, rater_prefix) AS TABLE
    WITH oriented AS (
        SELECT prompt_id,
               -- rows without a rater are each their own anonymous voice (formats.ANONYMOUS)
               CASE WHEN rater = 'human:anonymous' THEN rater || '#' || id ELSE rater END AS rater,
               least(response_a, response_b)    AS lo,
               greatest(response_a, response_b) AS hi,
               CASE WHEN winner = 'tie' THEN 0.5
                    WHEN (CASE winner WHEN 'a' THEN response_a ELSE response_b END)
                         = least(response_a, response_b) THEN p_winner
                    ELSE 1.0 - p_winner END AS p_lo
        FROM (SELECT *, CASE WHEN source = 'rlaif' AND strength BETWEEN 0 AND 1 THEN strength
                             ELSE 1.0 END AS p_winner
              FROM judgments_in(max_seq, rater_prefix)
              WHERE response_a <> response_b)
    ), per_rater AS (
        SELECT prompt_id, lo, hi, rater, avg(p_lo) AS p_lo, max(p_lo) AS p_max, min(p_lo) AS p_min
        FROM oriented
        GROUP BY prompt_id, lo, hi, rater
    )
    SELECT prompt_id, lo, hi, rater, p_lo,
           CASE WHEN p_max > 0.6 AND p_min < 0.4 THEN 'tie'
                WHEN p_lo > 0.5 + 1e-9 THEN 'lo'
                WHEN p_lo < 0.5 - 1e-9 THEN 'hi'
                ELSE 'tie' END AS vote
    FROM per_rater;

-- Per (prompt, unordered response pair): the majority verdict over the raters' voices (above).
-- p_chosen is the mean of the voices' probabilities for the chosen side (for one-verdict raters: the
-- vote share with ties as half; for an AI judge alone: its order-averaged probability, the soft label
-- of `train rm --soft-labels`); an exact split keeps the lower id as "chosen" with p_chosen = 0.5.
CREATE OR REPLACE MACRO pairs_in(max_seq, rater_prefix) AS TABLE
    WITH votes AS (
        SELECT prompt_id, lo, hi,
               count(*) FILTER (WHERE vote = 'lo') AS votes_lo,
               count(*) FILTER (WHERE vote = 'hi') AS votes_hi,
               count(*) FILTER (WHERE vote = 'tie') AS ties,
               avg(p_lo) AS p_lo
        FROM voices_in(max_seq, rater_prefix)
        GROUP BY prompt_id, lo, hi
    )
    SELECT prompt_id,
           CASE WHEN votes_hi > votes_lo THEN hi ELSE lo END AS chosen_id,
           CASE WHEN votes_hi > votes_lo THEN lo ELSE hi END AS rejected_id,
           greatest(votes_lo, votes_hi) AS votes_chosen,
           least(votes_lo, votes_hi)    AS votes_rejected,
           ties,
           votes_lo + votes_hi + ties   AS n_votes,
           CASE WHEN votes_hi = votes_lo THEN 0.5
                WHEN votes_hi > votes_lo THEN 1.0 - p_lo ELSE p_lo END AS p_chosen
    FROM votes;

CREATE OR REPLACE VIEW pairs AS SELECT * FROM pairs_in(NULL, NULL);
