"""The request and response bodies of /score and /get_reward, as OpenAPI shows them.

The routes read their bodies with `service.api.payloads` (orjson, with checks that name the field and
the fix); these models only describe those bodies for the schema at `GET /openapi.json` and the HTTP
reference generated from it, so documenting a field never changes how a request is parsed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.engine.advantages import ADVANTAGES


class Message(BaseModel):
    role: str = Field(description="`system`, `user` or `assistant`")
    content: str


class ScoreItem(BaseModel):
    prompt: str | list[Message] = Field(description="the prompt as text, or as chat messages")
    response: str = Field(description="the response to score")
    ground_truth: Any = Field(None, description="the gold answer; the item is then checked by a verifier")
    verifier: str | dict[str, Any] | None = Field(
        None, description="a verifier name, or `{\"name\": ..., options}`")
    data_source: str | None = Field(None, description="verl's field: picks the verifier by dataset")


class ScoreBody(BaseModel):
    items: list[ScoreItem] = Field(description="the (prompt, response) items to score")
    group_size: int | None = Field(
        None, description="GRPO: consecutive items per prompt; adds advantages and group_stats")
    advantage: str = Field(
        "grpo", description=f"how group advantages are computed: {', '.join(sorted(ADVANTAGES))}")
    std_ddof: Literal[0, 1] = Field(1, description="0: population std, 1: sample std")
    dynamic_sampling: bool = Field(False, description="adds `keep`: groups that carry a signal")
    weights: dict[str, float] | None = Field(
        None, description="how the reward model and verifiers combine, e.g. {\"rm\": 0, \"gsm8k\": 1}")
    aggregate: Literal["mean", "min", "uwo"] | None = Field(
        None, description="an ensemble's aggregate of its standardised members (default: the "
                          "server's): mean, min, or uwo (mean - λ·std)")
    uncertainty_weight: float | None = Field(None, description="λ of uwo (default: the server's)")
    run: str | None = Field(None, description="the training run, for the reward-hacking watch "
                                              "(or the X-Bradley-Run header); 1-64 of [A-Za-z0-9_.:@/-]")


class ScoreReply(BaseModel):
    scores: list[float | None] = Field(description="one reward per item, in request order")
    model: str | None = Field(description="the reward model's id (None: verifiers alone)")
    verifier: list[str | None] | None = Field(None, description="each item's verifier")
    verifier_rewards: list[float | None] | None = None
    correct: list[bool | None] | None = None
    status: list[str | None] | None = Field(
        None, description="ok, no_answer, unparseable_gold, timeout or error")
    extracted: list[str | None] | None = None
    rm_scores: list[float | None] | None = None
    status_counts: dict[str, int] | None = None
    advantages: list[float] | None = Field(None, description="with group_size")
    degenerate_groups: int | None = Field(None, description="groups whose rewards are all equal")
    group_stats: dict[str, Any] | None = None
    keep: list[bool] | None = Field(None, description="with dynamic_sampling")
    members: dict[str, list[float]] | None = Field(
        None, description="an ensemble's: each member's standardised scores, by model id")
    disagreement: list[float] | None = Field(
        None, description="an ensemble's: the std of its members' standardised scores per item")


class GetRewardBody(BaseModel):
    query: str | list[str] = Field(description="prompt + response, each as one decoded text")
    prompts: list[str] | None = Field(None, description="the prompts, to split each query")
    labels: list[Any] | None = Field(None, description="ground truth per query")
    aggregate: Literal["mean", "min", "uwo"] | None = Field(
        None, description="an ensemble's aggregate (default: the server's)")
    uncertainty_weight: float | None = Field(None, description="λ of uwo (default: the server's)")
    run: str | None = Field(None, description="the training run (or the X-Bradley-Run header)")


class GetRewardReply(BaseModel):
    rewards: float | list[float]
    scores: float | list[float] = Field(description="0/1 correctness where a verifier applies")
    extra_logs: dict[str, Any] = Field(description="numbers per item, averaged by OpenRLHF")


def documented(body: type[BaseModel], reply: type[BaseModel]) -> dict:
    """A route's `openapi_extra`: the body and the 200 reply, with nested models written inline."""
    def schema(model):
        return _inline(model.model_json_schema())

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema(body)}}},
            "responses": {"200": {"description": "Successful Response",
                                  "content": {"application/json": {"schema": schema(reply)}}}}}


def _inline(schema: dict) -> dict:
    """`schema` with every `$ref` into its `$defs` replaced by the definition itself."""
    defs = schema.pop("$defs", {})

    def resolve(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)
