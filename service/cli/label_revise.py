"""`bradley label --generate` and `--revise`: the two halves of the RLAIF recipe that write text.

* `--generate POLICY --prompts FILE --n 2 --temperature 0.8`: a local causal LM samples `n`
  responses per prompt; every pair of distinct samples becomes a comparison that the judge then
  labels in both orders (Bai et al. 2022, §4: the RL phase's preference data).
* `--revise`: the supervised phase (§3). For each response of the selected comparisons the judge
  model critiques it against a principle drawn from the constitution and rewrites it; the pair
  (revision ≻ original) is stored with rater `…:revise`, strength 1. Greedy decoding, so a rerun
  writes the same rows (one batch, found by its sha256: nothing new).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path


def read_prompts(path: str) -> list[str]:
    """JSONL rows with a `prompt` field, or plain text lines."""
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                value = json.loads(line).get("prompt")
            except (json.JSONDecodeError, AttributeError):
                raise ValueError(f"{path}:{number}: prompt: not a JSON object") from None
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{path}:{number}: prompt: missing or empty")
            prompts.append(value)
        else:
            prompts.append(line.strip())
    if not prompts:
        raise ValueError(f"{path}:1: prompt: the file holds no prompts")
    return prompts


def generate_comparisons(args) -> list:
    from annotation.rlaif.orders import Comparison
    from rm.judge.generate import sample
    from rm.judge.local import load_judge_model

    if not args.prompts:
        raise ValueError("--generate needs --prompts FILE (JSONL with a prompt field, or text lines)")
    if args.n < 2:
        raise ValueError("--n must be at least 2: a comparison needs two responses")
    prompts = read_prompts(args.prompts)[:args.limit]
    model, tokenizer = load_judge_model(args.generate)
    samples = sample(model, tokenizer, prompts, n=args.n, temperature=args.temperature,
                     max_new_tokens=args.max_new_tokens, seed=args.seed)
    name = Path(args.generate).name
    return [Comparison(prompt, None, a, b, name, name)
            for prompt, texts in zip(prompts, samples, strict=True)
            for a, b in itertools.combinations(sorted(set(texts)), 2)]


def revise(store, judge, constitution, comparisons, rater, args) -> dict:
    from annotation.rlaif.orders import critique_prompt, plan, revision_prompt
    from service.remote.stores import write_judgments

    if not hasattr(judge, "model"):
        raise ValueError("--revise needs a local judge (local:PATH): it writes text with the model")
    originals = list(dict.fromkeys((c.prompt, text) for c in comparisons for text in (c.a, c.b)))
    tasks = plan([f"{p}\0{r}" for p, r in originals], constitution, "sample", args.seed)[::2]
    rows = []
    for (prompt, response), task in zip(originals, tasks, strict=True):
        principle = constitution.principles[task.principle].text
        critique = _one(judge, critique_prompt(prompt, response, principle), args)
        revision = _one(judge, revision_prompt(prompt, response, principle, critique), args)
        if not revision or revision == response:
            continue  # nothing rewritten: no pair to learn from
        rows.append({"prompt": prompt, "response_a": revision, "response_b": response,
                     "winner": "a", "strength": 1.0, "rater": rater, "source": "rlaif",
                     "rationale": f"principle: {principle}; critique: {critique[:500]}"})
    written = write_judgments(store, rows, f"rlaif:{constitution.name}:revise")[0] if rows else 0
    return {"pairs_judged": len(originals), "judgments_written": written, "forwards": None,
            "position_consistency": None, "ties": 0, "failures": len(originals) - len(rows),
            "rater": rater, "batch_id": None}


def _one(judge, prompt: str, args) -> str:
    from rm.judge.generate import sample

    return sample(judge.model, judge.tokenizer, [prompt], n=1, temperature=0.0,
                  max_new_tokens=args.max_new_tokens, device=judge.device)[0][0]
