"""decode_json's fast path (orjson) against its checked path (json with field-naming checks): the
same value or the same error for every body, and text full of digits stays on the fast path."""

import json

import pytest

from service.api import payloads
from service.api.payloads import PayloadError, decode_json

SAME = [
    '{"items": [{"prompt": "x = 6.666666666666667 and 1234567890123456", "response": "r"}]}',
    '{"ground_truth": 123456789012345678}',            # 18 digits: orjson holds it exactly
    '{"ground_truth": 1234567890123456789}',           # 19 digits
    '{"ground_truth": 1234567890123456789012345}',     # beyond 64 bits: orjson would make a float
    '{"ground_truth": -9223372036854775809}',          # one below int64
    '{"ground_truth": 18446744073709551616}',          # one above uint64
    '{"ground_truth": 0.1, "w": 1.7976931348623157e308, "z": 1e-400, "n": -0.0}',
    '{"text": "\\ud83d\\ude00 paired surrogates are one character"}',
]


@pytest.mark.parametrize("body", SAME)
def test_fast_and_checked_paths_agree(body):
    got = decode_json(body.encode())
    assert got == json.loads(body) and json.dumps(got) == json.dumps(json.loads(body))


@pytest.mark.parametrize("body, field", [
    ('{"items": [{"prompt": "p", "response": "\\ud800"}]}', "items[0].response"),
    ('{"items": [{"prompt": "\\udfff\\ud800", "response": "r"}]}', "items[0].prompt"),
    ('{"weights": {"rm": 1e400}}', "weights.rm"),
    ('{"weights": {"rm": NaN}}', "weights.rm"),
])
def test_what_orjson_refuses_gets_the_checked_paths_message(body, field):
    with pytest.raises(PayloadError) as caught:
        decode_json(body.encode())
    assert caught.value.field == field


def test_digits_inside_strings_stay_on_the_fast_path(monkeypatch):
    """GSM8K-style solutions print floats such as 6.666666666666667 (16 digits); the old pre-scan
    sent a third of the benchmark's bodies down the slow path for them."""
    def checked(*args):
        raise AssertionError("took the checked path")

    monkeypatch.setattr(payloads, "_loads", checked)
    text = "So each gets 6.666666666666667 apples, 12345678901234567 in all.\n#### 6.67"
    body = json.dumps({"items": [{"prompt": "q", "response": text, "ground_truth": 6.67}]})
    assert decode_json(body.encode())["items"][0]["response"] == text
    with pytest.raises(AssertionError, match="checked path"):  # 19 digits in a row: checked
        decode_json(b'{"n": 1234567890123456789}')
