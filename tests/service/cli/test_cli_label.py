"""The label command's edges that need no model: prompt files, rater names, option checks."""

import argparse

import pytest

from service.cli.label import _model_name
from service.cli.label_revise import read_prompts


def test_read_prompts_jsonl_or_lines_and_bad_rows_name_file_line(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "Name a red fruit."}\n\nWhat colour is the sky?\n')
    assert read_prompts(str(good)) == ["Name a red fruit.", "What colour is the sky?"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: prompt: missing or empty"):
        read_prompts(str(bad))


@pytest.mark.parametrize("judge,name,expected", [
    ("local:/models/smollm2-135m-instruct/", None, "smollm2-135m-instruct"),
    ("openai:http://127.0.0.1:8080/v1", None, "127.0.0.1-8080-v1"),
    ("local:x", "my:judge", "my-judge"),
])
def test_model_name_in_the_rater_id_has_no_colon(judge, name, expected):
    assert _model_name(argparse.Namespace(judge=judge, judge_name=name)) == expected
