"""bradley's reward models and policies as a library: typed configs in, rows in, numbers out.

A reward model from pairs, then scores::

    from rm import RewardRunConfig, RunInputs, TrainConfig, train_reward_model, RewardModel
    config = RewardRunConfig(base_model="tiny", out="models/my-rm", train=TrainConfig(steps=20))
    metrics = train_reward_model(config, RunInputs(pairs="pairs.parquet"))
    RewardModel.load(metrics["path"]).score(["2+2?"], ["4"])

A policy the same way, with `PolicyRunConfig(objective=PoConfig(loss="dpo"))` and `train_policy`.
Nothing here opens a store or imports the service: the `bradley` CLI builds the same configs from its
flags and hands in a snapshot of the store.

Names load on first use (PEP 562), so `import rm` and the verifier workers stay free of torch until
a model is needed.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_HOMES = {
    # models: load, score, save
    "RewardModel": "rm.model.reward_model",
    "prepare_model": "rm.model.prepare",
    # training runs: configs, inputs, entry points
    "TrainConfig": "rm.train.loop",
    "RunInputs": "rm.train.run",
    "RewardRunConfig": "rm.train.reward",
    "train_reward_model": "rm.train.reward",
    "PoConfig": "rm.train.objectives",
    "PolicyRunConfig": "rm.train.policy",
    "train_policy": "rm.train.policy",
    # losses (pure functions) and evaluation
    "LOSSES": "rm.train.losses",
    "evaluate_rows": "rm.eval.pairs",
    "load_pairs_file": "rm.eval.pairs",
    "read_benchmark": "rm.eval.benchmarks",
    "evaluate_benchmark": "rm.eval.benchmarks",
    # AI judges and rule-based verifiers
    "make_judge": "rm.judge",
    "VERIFIERS": "rm.verify.rules",
    "run_verifier": "rm.verify.rules",
    "Check": "rm.verify.check",
    "VerifierPool": "rm.verify.pool",
}
# where a public name differs from the defining module's own
_ALIASES = {"prepare_model": "prepare"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'rm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
