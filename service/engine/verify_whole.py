"""A verifier-only /score request answered whole inside a verifier worker process.

Why: under 64 trainer clients the main process spent about 11 µs of CPU per gsm8k item (decoding,
validating, fanning calls out, gathering verdicts, answering) against 2.2 µs for the check itself,
and its one GIL held the server to 0.18 of a plain in-process loop (issue 19's profile). A worker
given the raw body does all of that with the same functions (`parse_score`, `parse_checks`,
`assemble`), in parallel with the other workers; the main process relays bytes.

When: the body mentions "ground_truth" and the pool has as many requests in flight as workers
(`VerifierPool.wants_whole`: alone, a request is better spread over every worker), counting those
the route has announced and not yet submitted (a burst's requests are decoded at once). The worker
(`answer_in_worker`) answers one of

- `{"fallback": why}`: the main path takes the request, as before this module existed. So it is
  for anything but a well-formed verifier-only request of fast checks: a body orjson refuses or a
  field the validators refuse (the main path's exact decoder words the error: the worker decodes
  with orjson alone, skipping the scan for integers beyond 64 bits, 0.47 µs per item); a ground
  truth, option or weight that may be such an integer rounded to a float (`_exact`); items
  without ground truth or a weight on the reward model; checks slower than microseconds
  (`rm.verify.rules.FAST`: a lone math request is better spread over every worker);
- `{"counts": [[verifier, status, n], ...], "group": {...}?}` and the reply's bytes. Group fields
  (advantages, running pass rates) are added in the main process, which holds the pass rates.

A call past its limit kills the worker as always; the main path then runs the request with that
call answered `timeout` (`known`): the call is not run again, so the answer comes within the
limit, while the request's other calls are (their verdicts died with the worker), as in the split
path.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from operator import itemgetter

import orjson
from starlette.responses import Response

from rm.verify.rules import FAST, VERIFIERS, Verdict
from service.api.errors import FastJSON
from service.api.payloads import Limits, PayloadError, ScoreRequest, parse_score
from service.engine.rewards import assemble, group_fields, parse_checks, parse_weights, weigh

GROUND_TRUTH = b'"ground_truth"'


def context_of(svc, limits: Limits) -> dict:
    """What the worker needs from the main process's state, per request."""
    return {"limits": dataclasses.asdict(limits), "default_verifier": svc.settings.default_verifier,
            "reward_weights": svc.reward_weights, "model_loaded": svc.current is not None}


async def score_whole(svc, body: bytes, limits: Limits
                      ) -> tuple[Response | None, dict[int, Verdict] | None]:
    """(the response, None) when a worker answered the request; (None, verdicts already given)
    when the main path must answer it."""
    answer = await svc.verifiers.averify_whole(body, context_of(svc, limits))
    if answer[0] == "lost":
        _, index, status, detail = answer
        known = None if index is None else {index: Verdict(0.0, None, False, status, detail=detail)}
        return None, known
    _, meta, reply = answer
    if "fallback" in meta:
        return None, None
    if "group" not in meta:  # meta["counts"] went to /metrics in the pool, as the answer came
        return Response(reply, media_type="application/json"), None
    out, group = orjson.loads(reply), meta["group"]
    size, n = group["group_size"], len(out["scores"])
    prompts: list = [None] * n
    prompts[::size] = group["prompts"]
    req = ScoreRequest(prompts, [], size, group["advantage"], group["std_ddof"],
                       group["dynamic_sampling"])
    out.update(group_fields(svc, req, out["scores"], out["correct"]))
    return FastJSON(out), None


def answer_in_worker(body: bytes, context: dict, run: Callable[[list], list[Verdict]]
                     ) -> tuple[dict, bytes]:
    """Runs in a verifier worker: (meta, reply bytes) for a raw /score body; `run` makes the
    calls, each under the pool's clock."""
    limits, names = Limits(**context["limits"]), set(VERIFIERS)
    try:
        value = orjson.loads(body)
        req = parse_score(value, limits)
        checks = parse_checks(value["items"], limits, names, context["default_verifier"])
        weights = parse_weights(value.get("weights"), names)
    except (orjson.JSONDecodeError, PayloadError) as exc:
        return {"fallback": f"refused: {exc}"[:300]}, b""
    if not all(checks):
        return {"fallback": "items without a verifier go to the reward model"}, b""
    names_used = set(map(_VERIFIER, checks))
    if not FAST.issuperset(names_used):
        return {"fallback": "slow checks are spread over every worker"}, b""
    if not _exact(checks, weights):
        return {"fallback": "a number orjson may have rounded"}, b""
    merged = {**context["reward_weights"], **(weights or {})}
    per_item, wants_rm = weigh(merged, checks, context["model_loaded"])
    if wants_rm:
        return {"fallback": "the reward model is weighted in"}, b""
    verdicts = run(list(zip(map(_VERIFIER, checks), req.responses, map(_TRUTH, checks),
                             map(_OPTIONS, checks), strict=True)))
    reply = assemble(checks, per_item, verdicts, None, None).reply()
    meta: dict = {"counts": _counts(names_used, reply["status_counts"], checks, verdicts)}
    if req.group_size is not None:
        if not all(map(math.isfinite, reply["scores"])):  # JSON would carry a NaN as null
            return {"fallback": "a reward that is not a finite number, in a group"}, b""
        meta["group"] = {"group_size": req.group_size, "advantage": req.advantage,
                         "std_ddof": req.std_ddof, "dynamic_sampling": req.dynamic_sampling,
                         "prompts": req.prompts[::req.group_size]}
    return meta, orjson.dumps(reply)


def _counts(names: set[str], by_status: dict[str, int], checks: list, verdicts: list) -> list:
    """[[verifier, status, n], ...] for /metrics: the reply's status counts when one verifier
    checked every item (the usual request)."""
    if len(names) == 1:
        [name] = names
        return [[name, status, n] for status, n in by_status.items()]
    counts = Counter(zip(map(_VERIFIER, checks), map(_STATUS, verdicts), strict=True))
    return [[name, status, n] for (name, status), n in counts.items()]



BEYOND_64_BITS = 2.0 ** 63  # orjson reads an integer literal this large as a (rounded) float


def _exact(checks: list, weights: dict[str, float] | None) -> bool:
    """Whether no number that decides a reward (ground truths, verifier options, weights) is a
    float this large: it may have been an integer literal orjson rounded (`10**30` as a ground
    truth is exact on the main path). Checked in C (map, set) for the usual request.

    >>> from service.engine.rewards import Check
    >>> _exact([Check("exact", 1.2345678901234568e+26)], None), _exact([Check("gsm8k", 10)], None)
    (False, True)
    >>> _exact([Check("numeric", "3", {"atol": 0.5})], {"rm": 1e20})
    False
    """
    numbers = list(map(_TRUTH, checks))
    if any(map(_OPTIONS, checks)):
        numbers += [v for c in checks if c.options for v in c.options.values()]
    numbers += (weights or {}).values()
    if float not in set(map(type, numbers)):
        return True
    return all(abs(x) < BEYOND_64_BITS for x in numbers if type(x) is float)


_VERIFIER, _TRUTH, _OPTIONS = itemgetter(0), itemgetter(1), itemgetter(2)  # of a Check
_STATUS = itemgetter(3)  # of a Verdict (reward, correct, format_ok, status, extracted, detail)
