"""`ScoreClient` fits its requests to the server's GET /limits: a batch over the anonymous character
budget or the body limit goes as several requests of whole groups (the same scores as one request
to an unbounded server), and one body over the limit is refused here as 413 naming it."""

from __future__ import annotations

import pytest

from service.api.settings import load_settings
from service.client import ClientError, ScoreClient
from tests.service.conftest import API_KEY, free_port, make_db, start_live, stop_live


@pytest.fixture(scope="module")
def narrow(tmp_path_factory, tiny_models):
    """3,000 characters per anonymous request, 16 KiB per body, one anonymous request at a time."""
    db = make_db(tmp_path_factory.mktemp("narrow") / "narrow.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, port=free_port(),
                             device="cpu", anon_max_request_chars=3_000, anon_max_concurrent=1,
                             max_body_bytes=16 * 1024)
    server = start_live(settings)
    yield server
    stop_live(server)


def _batch(hh_items, n: int):
    items = [(p[:300], r[:300]) for p, r in hh_items[:n]]
    return [p for p, _ in items], [r for _, r in items]


def test_the_limits_route_says_what_applies_to_the_caller(narrow):
    with ScoreClient(narrow.url) as anonymous, ScoreClient(narrow.url, api_key=API_KEY) as keyed:
        assert anonymous.limits()["max_request_chars"] == 3_000
        assert anonymous.limits()["max_concurrent"] == 1
        assert keyed.limits()["max_request_chars"] is None
        assert keyed.limits()["max_body_bytes"] == 16 * 1024


def test_a_batch_over_the_anonymous_budget_goes_as_several_requests(narrow, hh_items, offline):
    prompts, responses = _batch(hh_items, 24)
    assert sum(map(len, prompts + responses)) > 3 * 3_000
    with ScoreClient(narrow.url) as client:
        got = client.score(prompts, responses, group_size=2)
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, responses), abs=1e-5)


def test_a_batch_over_the_body_limit_goes_as_several_requests(narrow, hh_items, offline):
    prompts, responses = _batch(hh_items, 60)
    with ScoreClient(narrow.url, api_key=API_KEY) as client:
        got = client.score(prompts, responses)
    assert got == pytest.approx(offline["rm-tiny-a"].score(prompts, responses), abs=1e-5)


def test_one_body_over_the_limit_is_refused_before_it_is_sent(narrow):
    with ScoreClient(narrow.url, api_key=API_KEY, retries=0) as client:
        with pytest.raises(ClientError) as info:
            client.upload("judgments", [{"prompt": "p" * 20_000, "response_a": "a",
                                         "response_b": "b", "winner": "a", "rater": "human:x"}])
    assert info.value.status == 413 and info.value.field == "body"
    assert "over the server's limit of 16,384 (BRADLEY_MAX_BODY_BYTES)" in str(info.value)
