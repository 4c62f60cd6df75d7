"""Synthetic judgments with known truth, for the demo and for tests of the analysis.

Every response comes from one of `sources` simulated models; its latent quality is its source's
quality θ_source (plus optional per-response noise). The quality is visible in the text: each word
is neutral half the time, otherwise "good" with probability σ(1.5·q) and "bad" otherwise, so a
reward model trained on the text can learn it. Length (number of words) is drawn independently of
quality, and good and bad words have the same length distribution, so length carries no quality.

For one comparison of responses a and b the population prefers a with probability

    P(a) = σ(κ·(c_a − c_b) + β·tanh((len_a − len_b) / sd))

where c is the rater's criterion (the quality q, see below), κ = `quality_scale`, β = `length_bias`
(the planted coefficient) and sd the standard deviation of len_a − len_b over all comparisons (in
characters; AlpacaEval's length-controlled feature). A rater reports that verdict with probability
`accuracy` and its opposite otherwise (honest 1.0, noisy 0.65, adversarial 0.1 by default); a share
`tie_rate` of verdicts become ties, independent of everything else.

Cyclic prompts (a share `cycle_rate`): raters are split into two groups (even and odd rater index);
on these prompts group 1 judges by the reverse criterion c = −q. The top three responses by quality
(t0 ≻ t1 ≻ t2) are always compared; the pairs (t0, t1) and (t1, t2) are judged by group 0 only and
(t0, t2) by group 1 only, so the expected majority goes round t0 ≻ t1 ≻ t2 ≻ t0 (a Condorcet cycle).

    >>> rows, truth = simulate_rows(SimulationConfig(prompts=3, responses=3, raters=6, seed=1))
    >>> len(rows) == truth["n_judgments"] == 3 * 3 * 3
    True
    >>> sorted(rows[0])
    ['model_a', 'model_b', 'prompt', 'rater', 'response_a', 'response_b', 'winner']
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from annotation.ids import content_id, prompt_id, response_id

GOOD_WORDS = ("clear", "exact", "valid", "sound", "solid", "tested", "proven", "careful", "correct",
              "precise", "concise", "helpful", "thorough", "accurate", "rigorous", "relevant")
# Same lengths as GOOD_WORDS, word for word: the share of good words must not change the length.
BAD_WORDS = ("vague", "wrong", "messy", "bogus", "silly", "sloppy", "broken", "useless", "garbled",
             "unclear", "muddled", "invalid", "rambling", "careless", "baseless", "mistaken")
NEUTRAL_WORDS = ("the", "answer", "step", "method", "result", "value", "because", "first", "then",
                 "example", "data", "model", "check", "note", "case", "point", "which", "also",
                 "here", "we", "so", "this", "that", "and")
TOPICS = ("sorting", "caching", "recursion", "hashing", "gradient descent", "compilers", "tcp",
          "photosynthesis", "inflation", "vaccines", "tides", "transistors", "git", "sql joins")
ACCURACY = {"honest": 1.0, "noisy": 0.65, "adversarial": 0.1}


@dataclass
class SimulationConfig:
    prompts: int = 200
    responses: int = 4                  # per prompt
    raters: int = 8
    length_bias: float = 0.5            # β, on tanh of the standardized length difference
    cycle_rate: float = 0.1             # share of prompts built cyclic
    seed: int = 0
    raters_per_pair: int = 3
    pairs_per_prompt: int | None = None  # None: every pair of a prompt's responses
    sources: int = 6                    # simulated source models, qualities evenly spread in [−1.5, 1.5]
    quality_scale: float = 2.0          # κ
    quality_noise: float = 0.0          # per-response quality sd on top of the source's
    noisy_share: float = 0.25
    adversarial_share: float = 0.125
    ai_raters: int = 1                  # the last raters are named ai:sim-judge-<i>:default
    accuracies: tuple[float, ...] | None = None  # per rater; overrides the shares
    tie_rate: float = 0.05
    mean_words: float = 30.0

    def validate(self) -> None:
        """Raise ValueError naming the field and the fix."""
        n_pairs = self.responses * (self.responses - 1) // 2
        checks = [
            (self.prompts >= 1, "prompts must be at least 1"),
            (self.responses >= 2, "responses must be at least 2 per prompt"),
            (self.sources >= self.responses, "sources must be at least responses (distinct per prompt)"),
            (0 <= self.cycle_rate <= 1, "cycle_rate must lie in [0, 1]"),
            (0 <= self.tie_rate < 1, "tie_rate must lie in [0, 1)"),
            (1 <= self.raters_per_pair <= self.raters, "raters_per_pair must lie in [1, raters]"),
            (self.pairs_per_prompt is None or 1 <= self.pairs_per_prompt <= n_pairs,
             f"pairs_per_prompt must lie in [1, {n_pairs}] for {self.responses} responses"),
            (0 <= self.ai_raters <= self.raters, "ai_raters must lie in [0, raters]"),
            (self.accuracies is None or len(self.accuracies) == self.raters,
             "accuracies must give one value per rater"),
            (self.mean_words >= 3, "mean_words must be at least 3"),
        ]
        if self.cycle_rate > 0:
            checks += [
                (self.responses >= 3, "cycle_rate > 0 needs responses >= 3; set cycle_rate 0"),
                ((self.pairs_per_prompt or n_pairs) >= 3, "cycle_rate > 0 needs pairs_per_prompt >= 3"),
                (self.raters_per_pair <= self.raters // 2,
                 "cycle_rate > 0 needs raters_per_pair <= raters // 2 (each group judges alone)"),
            ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"simulate: {message}")


def rater_table(config: SimulationConfig) -> list[dict]:
    """Name, kind, accuracy and group of every rater.

    >>> [(r["name"], r["kind"]) for r in rater_table(SimulationConfig(raters=4, ai_raters=1))]
    [('human:sim-00', 'honest'), ('human:sim-01', 'honest'), ('human:sim-02', 'noisy'), ('ai:sim-judge-0:default', 'honest')]
    """
    n = config.raters
    n_adv = int(round(n * config.adversarial_share))
    n_noisy = int(round(n * config.noisy_share))
    n_humans = n - config.ai_raters
    # Humans get the noisy and adversarial slots from the end of their range; AI judges stay honest.
    kinds = ["honest"] * n
    for i in range(min(n_noisy + n_adv, n_humans)):
        kinds[n_humans - 1 - i] = "adversarial" if i < n_adv else "noisy"
    rows = []
    for i, kind in enumerate(kinds):
        name = f"human:sim-{i:02d}" if i < n_humans else f"ai:sim-judge-{i - n_humans}:default"
        accuracy = config.accuracies[i] if config.accuracies else ACCURACY[kind]
        rows.append({"name": name, "kind": kind, "accuracy": float(accuracy), "group": i % 2})
    return rows


def _texts(rng, quality: np.ndarray, mean_words: float) -> list[str]:
    """One text per quality value: word shares follow the quality, the length does not."""
    n = len(quality)
    n_words = np.clip(np.rint(mean_words * np.exp(0.5 * rng.standard_normal(n))), 3, 6 * mean_words)
    n_words = n_words.astype(np.int64)
    row = np.repeat(np.arange(n), n_words)
    total = len(row)
    n_neutral, n_good = len(NEUTRAL_WORDS), len(GOOD_WORDS)
    good = rng.random(total) < 1.0 / (1.0 + np.exp(-1.5 * quality[row]))
    pick = rng.integers(0, n_good, total)
    word = np.where(rng.random(total) < 0.5, rng.integers(0, n_neutral, total),
                    np.where(good, n_neutral + pick, n_neutral + n_good + pick))
    # Each word carries its separator; the last word of a text carries a newline to split on, so
    # the whole corpus is built by one C-level join instead of a Python loop over words.
    vocab = NEUTRAL_WORDS + GOOD_WORDS + BAD_WORDS
    with_sep = np.array([w + " " for w in vocab] + [w + "\n" for w in vocab], dtype=object)
    word[np.cumsum(n_words) - 1] += len(vocab)
    lines = "".join(with_sep[word]).split("\n")[:n]
    return [line.capitalize() + "." for line in lines]


def _pairs(config: SimulationConfig, rng, cyclic: np.ndarray, triad: np.ndarray):
    """Local (i, j) response indices of every compared pair, as (prompts × m) arrays."""
    k = config.responses
    i_loc, j_loc = np.triu_indices(k, 1)
    n_pairs = len(i_loc)
    m = config.pairs_per_prompt or n_pairs
    index = np.full((k, k), -1)
    index[i_loc, j_loc] = index[j_loc, i_loc] = np.arange(n_pairs)
    keys = rng.random((config.prompts, n_pairs))
    rows = np.nonzero(cyclic)[0]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        keys[rows, index[triad[rows, a], triad[rows, b]]] = -1.0  # triad pairs are always compared
    chosen = np.sort(np.argsort(keys, axis=1)[:, :m], axis=1)
    return i_loc[chosen], j_loc[chosen], index


def _assign_raters(config: SimulationConfig, rng, item_group: np.ndarray) -> np.ndarray:
    """raters_per_pair distinct raters per item; items with group g >= 0 draw from that group only."""
    r = config.raters
    keys = rng.random((len(item_group), r))
    group_of = np.arange(r) % 2
    restricted = item_group >= 0
    keys[restricted] += 2.0 * (group_of[None, :] != item_group[restricted, None])
    return np.argsort(keys, axis=1)[:, :config.raters_per_pair]


def _responses(config: SimulationConfig, rng) -> dict:
    """Per prompt: its text, the sources and qualities of its responses, their texts, and whether
    it is built cyclic (with its top three responses by quality, the triad)."""
    p, k = config.prompts, config.responses
    theta = np.linspace(-1.5, 1.5, config.sources)
    source = np.argsort(rng.random((p, config.sources)), axis=1)[:, :k]
    quality = theta[source] + config.quality_noise * rng.standard_normal((p, k))
    cyclic = rng.random(p) < config.cycle_rate
    triad = np.argsort(-quality, axis=1)[:, :3] if k >= 3 else np.zeros((p, 3), dtype=np.int64)
    texts = np.array(_texts(rng, quality.ravel(), config.mean_words), dtype=object).reshape(p, k)
    return {"theta": theta, "source": source, "quality": quality, "cyclic": cyclic, "triad": triad,
            "texts": texts,
            "prompts": [f"Question {i}: how does {TOPICS[i % len(TOPICS)]} work?" for i in range(p)]}


def _plan(config: SimulationConfig, rng, r: dict) -> dict:
    """Who judges what: per judgment its prompt, the local indices of responses a and b, its rater."""
    i_loc, j_loc, index = _pairs(config, rng, r["cyclic"], r["triad"])
    triad = r["triad"]
    pair_t01, pair_t12, pair_t02 = (index[triad[:, a], triad[:, b]] for a, b in ((0, 1), (1, 2), (0, 2)))
    pair_of = index[i_loc, j_loc]
    item_group = np.full(i_loc.shape, -1)
    item_group[(pair_of == pair_t01[:, None]) | (pair_of == pair_t12[:, None])] = 0
    item_group[pair_of == pair_t02[:, None]] = 1
    item_group[~r["cyclic"]] = -1
    rater = _assign_raters(config, rng, item_group.ravel()).ravel()
    per_item = config.raters_per_pair
    prompt = np.repeat(np.repeat(np.arange(config.prompts), i_loc.shape[1]), per_item)
    first, second = np.repeat(i_loc.ravel(), per_item), np.repeat(j_loc.ravel(), per_item)
    swap = rng.random(len(prompt)) < 0.5  # which response is shown first is a coin flip
    return {"prompt": prompt, "a": np.where(swap, second, first), "b": np.where(swap, first, second),
            "rater": rater}


def _verdicts(config: SimulationConfig, rng, r: dict, plan: dict, raters: list) -> tuple:
    """Winner per judgment from the planted model (see the module docstring), and the length sd."""
    jp, a, b, rater = plan["prompt"], plan["a"], plan["b"], plan["rater"]
    group = np.array([x["group"] for x in raters])[rater]
    sign = np.where(r["cyclic"][jp] & (group == 1), -1.0, 1.0)
    d_crit = sign * (r["quality"][jp, a] - r["quality"][jp, b])
    lengths = np.vectorize(len, otypes=[np.int64])(r["texts"])
    d_len = (lengths[jp, a] - lengths[jp, b]).astype(float)
    sd = float(np.std(d_len)) or 1.0
    logit = config.quality_scale * d_crit + config.length_bias * np.tanh(d_len / sd)
    a_wins = rng.random(len(jp)) < 1.0 / (1.0 + np.exp(-logit))
    a_wins ^= rng.random(len(jp)) >= np.array([x["accuracy"] for x in raters])[rater]
    winner = np.where(a_wins, "a", "b").astype(object)
    winner[rng.random(len(jp)) < config.tie_rate] = "tie"
    return winner, sd


def simulate_arrays(config: SimulationConfig) -> tuple[dict, dict]:
    """The simulation as plain columns (one entry per judgment) plus the truth dict."""
    config.validate()
    rng = np.random.default_rng(config.seed)
    r = _responses(config, rng)
    plan = _plan(config, rng, r)
    raters = rater_table(config)
    winner, sd = _verdicts(config, rng, r, plan, raters)
    jp, a, b, quality = plan["prompt"], plan["a"], plan["b"], r["quality"]
    names = np.array([f"sim-model-{s}" for s in range(config.sources)], dtype=object)
    columns = {
        "prompt": np.array(r["prompts"], dtype=object)[jp],
        "response_a": r["texts"][jp, a], "response_b": r["texts"][jp, b], "winner": winner,
        "rater": np.array([x["name"] for x in raters], dtype=object)[plan["rater"]],
        "model_a": names[r["source"][jp, a]], "model_b": names[r["source"][jp, b]],
    }
    truth = _truth(config, raters, plan["rater"], winner, quality[jp, a] > quality[jp, b],
                   quality[jp, a] != quality[jp, b])
    truth.update({
        "length_sd": sd, "n_judgments": int(len(jp)), "n_prompts": config.prompts,
        "source_quality": {str(n): float(t) for n, t in zip(names, r["theta"], strict=True)},
        **_cyclic_truth(r["prompts"], r["texts"], np.nonzero(r["cyclic"])[0], r["triad"]),
    })
    return columns, truth


def _truth(config, raters, rater, winner, better_a, differ) -> dict:
    """Planted coefficients and, per rater, the share of its decided verdicts that picked the better response."""
    decided = (winner != "tie") & differ
    picked_better = (winner == "a") == better_a
    hits = np.bincount(rater[decided], weights=picked_better[decided], minlength=len(raters))
    counts = np.bincount(rater[decided], minlength=len(raters))
    for i, r in enumerate(raters):
        r["agrees_with_better"] = float(hits[i] / counts[i]) if counts[i] else None
        r["n"] = int(np.sum(rater == i))
    return {
        "config": asdict(config),
        "length_bias": config.length_bias,
        "length_feature": "tanh((len_a - len_b) / length_sd), lengths in characters",
        "quality_scale": config.quality_scale,
        "model": "P(a) = sigmoid(quality_scale * (c_a - c_b) + length_bias * length_feature); "
                 "a rater reports it with probability accuracy, its opposite otherwise",
        "raters": {r.pop("name"): r for r in raters},
    }


def _cyclic_truth(prompt_texts, texts, rows, triad) -> dict:
    ids, triads = [], []
    for row in rows:
        pid = prompt_id(prompt_texts[row])
        ids.append(pid)
        triads.append([pid, *(response_id(pid, texts[row, t]) for t in triad[row])])
    return {"cyclic_prompts": ids, "cyclic_triads": triads,
            "cyclic_note": "each triad is [prompt_id, t0, t1, t2] with planted majority t0>t1>t2>t0"}


def simulate_rows(config: SimulationConfig) -> tuple[list[dict], dict]:
    """The judgment rows (prompt, response_a, response_b, winner, rater, model_a, model_b) and the truth."""
    columns, truth = simulate_arrays(config)
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)], truth


def simulate(out: str | Path, config: SimulationConfig) -> dict:
    """Write OUT (judgments JSONL) and OUT.truth.json; return a summary.

    Both files are written to temporary names and renamed, so a failure leaves nothing half-written.
    """
    out = Path(out)
    columns, truth = simulate_arrays(config)
    truth_path = out.with_name(out.name + ".truth.json")
    tmp, tmp_truth = out.with_name(out.name + ".tmp"), truth_path.with_name(truth_path.name + ".tmp")
    names = list(columns)
    with open(tmp, "w", encoding="utf-8") as fh:
        for values in zip(*columns.values(), strict=True):
            fh.write(json.dumps(dict(zip(names, values, strict=True)), ensure_ascii=False) + "\n")
    tmp_truth.write_text(json.dumps(truth, indent=1))
    tmp.replace(out)
    tmp_truth.replace(truth_path)
    return {"out": str(out), "truth": str(truth_path), "n_judgments": truth["n_judgments"],
            "n_prompts": truth["n_prompts"], "n_cyclic_prompts": len(truth["cyclic_prompts"]),
            "length_bias": config.length_bias}


def store_tables(columns: dict, source: str = "simulate") -> tuple[str, dict[str, pa.Table]]:
    """The simulated columns as the store's prompts/responses/judgments tables (ids as ingest derives
    them; judgment ids per row of the batch, where ingest hashes what each judgment is), with a
    content sha256 for the batch: lets tests and benchmarks load a store without ingest."""
    prompts = columns["prompt"]
    unique_prompts = dict.fromkeys(prompts)
    pid = {text: prompt_id(text) for text in unique_prompts}
    prompt_ids = np.array([pid[t] for t in prompts], dtype=object)
    responses: dict[tuple[str, str], tuple[str, str]] = {}
    ids = {}
    for side in ("a", "b"):
        rid = []
        for p, text, model in zip(prompt_ids, columns[f"response_{side}"], columns[f"model_{side}"], strict=True):
            key = (p, text)
            if key not in responses:
                responses[key] = (response_id(p, text), model)
            rid.append(responses[key][0])
        ids[side] = rid
    sha = hashlib.sha256(f"{source}:{len(prompts)}:{prompts[0]}:{prompts[-1]}".encode()).hexdigest()
    n = len(prompts)
    tables = {
        "prompts": pa.table({"id": list(pid.values()), "text": list(pid)}),
        "responses": pa.table({"id": [v[0] for v in responses.values()],
                               "prompt_id": [k[0] for k in responses],
                               "text": [k[1] for k in responses],
                               "source_model": [v[1] for v in responses.values()]}),
        "judgments": pa.table({"id": [content_id(sha, str(i)) for i in range(n)],
                               "prompt_id": prompt_ids.tolist(), "response_a": ids["a"],
                               "response_b": ids["b"], "winner": columns["winner"].tolist(),
                               "rater": columns["rater"].tolist(), "source": ["judgments"] * n}),
    }
    return sha, tables


def load_into(store, config: SimulationConfig) -> dict:
    """Simulate and write straight into a Store (one batch); returns the truth."""
    columns, truth = simulate_arrays(config)
    # The config determines the data, so it names the batch: loading the same config twice is the
    # no-op a re-ingest is, another seed or size is a new batch.
    source = f"simulate:{json.dumps(asdict(config), sort_keys=True)}"
    sha, tables = store_tables(columns, source=source)
    if store.find_batch(sha) is None:
        store.write_batch(source, sha, truth["n_judgments"], tables)
    return truth
