"""Typed settings of the scoring service, read from the environment (prefix `BRADLEY_`) and validated
once, at start-up, so a bad value stops the server with a message instead of failing a request later.

    >>> s = load_settings(api_keys="key-one-1, key-two-2", port=9000)
    >>> s.api_keys, s.port, s.host
    (('key-one-1', 'key-two-2'), 9000, '127.0.0.1')
    >>> load_settings(port=0)
    Traceback (most recent call last):
    ...
    service.api.settings.SettingsError: BRADLEY_PORT: Input should be greater than or equal to 1 (got 0)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SECRET_FIELDS = {"api_keys", "label_studio_webhook_secret"}


class SettingsError(ValueError):
    """A setting is missing or out of range; the message names the variable to fix."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BRADLEY_", extra="ignore", frozen=True)

    db: str = "bradley.duckdb"
    # model id in the store, or a model folder; several, comma-separated: an ensemble
    # (service/engine/ensemble.py), its members standardised by their reference statistics
    model: str | None = None
    # how an ensemble combines its members per item: mean, min (worst case) or uwo (mean - λ·std,
    # λ: BRADLEY_ENSEMBLE_UNCERTAINTY_WEIGHT); a /score request may choose its own
    ensemble_aggregate: Literal["mean", "min", "uwo"] = "mean"
    ensemble_uncertainty_weight: float = Field(1.0, ge=0)  # the weight λ of uwo: mean - λ·std
    # the reward-hacking watch (service/engine/watch.py): auto watches models that have reference
    # statistics, on refuses a model without them, off turns it off
    watch: Literal["auto", "on", "off"] = "auto"
    watch_window: int = Field(1024, ge=10, le=1_000_000)  # items per (model, run) window
    watch_max_runs: int = Field(8, ge=1, le=1000)  # run names per model; the rest count as `other`
    watch_history_interval_s: float = Field(10.0, gt=0)  # GET /watch history: one summary per this
    watch_history_len: int = Field(360, ge=1, le=100_000)  # summaries kept per (model, run)
    device: str = "auto"
    torch_threads: int | None = Field(None, ge=1)  # forward threads (default: every usable core)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # Comma-separated in the environment; NoDecode keeps pydantic-settings from expecting JSON.
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    score_requires_key: bool = False
    read_only: bool = False
    # padded tokens per forward (rows x longest row); unset: 16384 on CPU, 65536 on GPU
    # (service/engine/runtime.py: AUTO_BATCH_TOKENS)
    max_batch_tokens: int | None = Field(None, ge=1)
    max_batch_items: int = Field(256, ge=1)
    # padded tokens allowed per real token in one forward; unset: 0.1 on CPU, 1.0 on GPU
    # (service/engine/runtime.py: AUTO_PADDING)
    max_padding: float | None = Field(None, ge=0)
    max_wait_ms: float = Field(3.0, ge=0, le=10_000)
    max_queue_items: int = Field(50_000, ge=1)   # beyond this, /score answers 503 (retry later)
    max_items_per_request: int = Field(4096, ge=1)
    # /get_reward: OpenRLHF's older client posts one whole rollout batch (often > 4096 samples)
    max_get_reward_items: int = Field(65_536, ge=1)
    strict_get_reward: bool = False  # 422 for a query that cannot be split into prompt + response
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # a request's whole body must arrive within this many seconds of its headers, else 408: a
    # client that sends part of a body and then nothing would hold its slot (and a worker) forever
    body_read_timeout_s: float = Field(10.0, gt=0, le=3600)
    max_text_chars: int = Field(200_000, ge=1)     # per prompt or response; longer is refused (422)
    # Callers without a key (when /score needs none): characters of all texts of one request, and
    # requests in flight per client address; beyond them 413 and 429 (README "Hostile clients").
    anon_max_request_chars: int = Field(262_144, ge=1)
    anon_max_concurrent: int = Field(64, ge=1)
    # /metrics without a key (Prometheus scrapes usually carry none); it names the served model only
    metrics_require_key: bool = False
    drain_timeout_s: float = Field(30.0, ge=0)
    # Verifiable rewards (service/engine/rewards.py): worker processes, the per-call wall-clock limit, the
    # default weights ("rm=0,gsm8k=1"), the checker for ground truth that names none, and extra
    # checkers by import path ("name=module:function,...", imported by the workers).
    verifier_workers: int = Field(2, ge=1, le=64)
    verifier_timeout_s: float = Field(5.0, gt=0, le=600)
    reward_weights: str = ""
    default_verifier: str = ""  # for ground truth that names no verifier; "" = the RM judges
    verifier_plugins: str = ""
    # Label Studio sends it in the X-Bradley-Webhook-Secret header (the webhook's custom headers);
    # unset: the webhook needs a bearer API key like any other write
    label_studio_webhook_secret: str | None = Field(None, min_length=16)
    log_level: str = "info"

    @field_validator("reward_weights")
    @classmethod
    def _check_weights(cls, value):
        from service.engine.rewards import weights_setting

        weights_setting(value)
        return value

    @field_validator("verifier_plugins")
    @classmethod
    def _check_plugins(cls, value):
        plugins_setting(value)
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value):
        if isinstance(value, str):
            value = value.split(",")
        keys = tuple(k.strip() for k in value if k and k.strip())
        if any(len(k) < 8 for k in keys):
            raise ValueError("every key needs at least 8 characters")
        return keys


def plugins_setting(text: str) -> dict[str, str]:
    """BRADLEY_VERIFIER_PLUGINS `name=module:function,...` -> {name: "module:function"}.

    >>> plugins_setting("slow=tests.rm.verify.verifier_plugins:sleepy")
    {'slow': 'tests.rm.verify.verifier_plugins:sleepy'}
    """
    plugins = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, path = part.partition("=")
        if not name.strip() or ":" not in path:
            raise ValueError(f"{part!r} is not name=module:function")
        plugins[name.strip()] = path.strip()
    return plugins


def load_settings(**overrides) -> Settings:
    """Environment first, then non-None `overrides` (from the CLI); raises SettingsError naming the
    variable to fix."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "settings"
        shown = "" if field in SECRET_FIELDS else f" (got {str(err['input'])[:40]})"
        problems.append(f"BRADLEY_{field.upper()}: {err['msg']}{shown}")
    return "; ".join(problems)
