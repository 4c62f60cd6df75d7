"""A property test: arbitrary JSON bodies (and near-valid ones with hostile values: lone
surrogates, 5,000-digit integers, NaN, deep nesting, wrong types) sent to /score, /get_reward, the
upload routes and the Label Studio webhook over ONE persistent HTTP/1.1 connection to a real
uvicorn server. Never a 5xx; never a dropped connection (a response may close it only by saying
`Connection: close`); the store unchanged by every refused upload."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.service.conftest import API_KEY

ROUTES = ["/score", "/get_reward", "/judgments", "/pairs", "/feedback", "/judgments?on_error=skip",
          "/webhooks/label-studio"]
UPLOADS = ("/judgments", "/pairs", "/feedback", "/webhooks")
NASTY_TEXT = ["\ud800", "ok \udfff", "\x00", "", " ", "\u202e", "😀", "a" * 300, "human:1", "b"]
# raw JSON fragments json.dumps cannot write (Python refuses ints over 4300 digits, writes NaN bare)
RAW_NUMBERS = ["9" * 5000, "-" + "1" * 4500, "1e400", "NaN", "-Infinity", "1e-400", "0.5", "7"]
KEYS = ["items", "prompt", "response", "query", "prompts", "labels", "group_size", "advantage",
        "chosen", "rejected", "completion", "label", "response_a", "response_b", "winner", "rater",
        "strength", "action", "annotation", "task", "data", "result", "role", "content", "id"]

texts = st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=20))
plain = st.one_of(st.text(max_size=40), st.text("ab \n", min_size=1, max_size=40))
some_texts = st.one_of(plain, plain, plain, texts)  # mostly usable, sometimes hostile
raw_number = st.sampled_from(RAW_NUMBERS).map(lambda s: RawNumber(s))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts,
                    raw_number)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner,
                                                 max_size=5)), max_leaves=12)
near_score = st.fixed_dictionaries({"items": st.lists(st.fixed_dictionaries(
    {"prompt": values, "response": values}), max_size=3)}, optional={
    "group_size": values, "advantage": values})
near_reward = st.fixed_dictionaries({"query": values}, optional={"prompts": values, "labels": values})
# mostly valid: string texts (some hostile), small group sizes, a known or odd advantage
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "x"]),
                                           "content": some_texts}), min_size=1, max_size=2)
valid_ish_score = st.fixed_dictionaries({"items": st.lists(st.fixed_dictionaries(
    {"prompt": some_texts | messages, "response": some_texts}), min_size=1, max_size=4)}, optional={
    "group_size": st.integers(-1, 4) | raw_number, "advantage": st.sampled_from(["grpo", "dr_grpo"]) | values})
valid_ish_reward = st.fixed_dictionaries({"query": st.lists(some_texts, min_size=1, max_size=4) | plain},
                                         optional={"prompts": st.lists(some_texts, max_size=4)})
near_record = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
bodies = st.one_of(values, near_score, near_reward, valid_ish_score, valid_ish_reward, near_record,
                   st.lists(near_record, max_size=3))


class RawNumber:
    def __init__(self, text: str):
        self.text = text


def encode(value) -> bytes:
    """JSON text with RawNumber spliced in verbatim (ensure_ascii writes lone surrogates as \\ud800)."""
    marks: list[str] = []

    def default(obj):
        marks.append(obj.text)
        return f"@@raw{len(marks) - 1}@@"

    text = json.dumps(value, default=default)
    for i, raw in enumerate(marks):
        text = text.replace(f'"@@raw{i}@@"', raw)
    return text.encode()


@pytest.fixture(scope="module")
def connection(live):
    port = int(live.url.rsplit(":", 1)[1])
    holder = {"conn": http.client.HTTPConnection("127.0.0.1", port, timeout=60), "port": port}
    yield holder
    holder["conn"].close()


def counts(live) -> dict:
    return live.service.call_store(live.service.store.counts)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(route=st.sampled_from(ROUTES), body=bodies, keyed=st.booleans())
@example("/score", {"items": [{"prompt": "p", "response": "r"}], "group_size": 1, "advantage": []},
         False)  # five bodies that once gave 500s, always tried
@example("/score", {"items": [{"prompt": "p", "response": "r"}], "group_size": 1, "advantage": {}},
         False)
@example("/score", {"items": [{"prompt": "\ud800", "response": "r"}]}, False)
@example("/score", {"items": [{"prompt": "p", "response": "\ud800"}]}, True)
@example("/get_reward", {"query": ["\ud800"]}, False)
@example("/pairs", [{"prompt": "p", "chosen": "a", "rejected": "b", "strength": RawNumber("9" * 5000)}],
         True)
def test_arbitrary_bodies_never_5xx_never_drop_the_connection(live, connection, route, body, keyed):
    conn, raw = connection["conn"], encode(body)
    upload = route.startswith(UPLOADS)
    before = counts(live) if upload else None
    headers = {"Content-Type": "application/json"}
    if upload or keyed:  # scoring is fuzzed with and without a key (two sets of limits)
        headers["Authorization"] = f"Bearer {API_KEY}"
    conn.request("POST", route, body=raw, headers=headers)
    response = conn.getresponse()  # a dropped connection raises here (RemoteDisconnected)
    answer = response.read()
    assert response.status < 500, (route, raw[:300], answer[:300])
    if response.status >= 400:
        assert json.loads(answer)["error"]
        if upload:
            assert counts(live) == before, (route, raw[:300])
    if response.getheader("connection") == "close":
        conn.close()
        connection["conn"] = http.client.HTTPConnection("127.0.0.1", connection["port"], timeout=60)
