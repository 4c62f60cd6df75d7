"""Tokenized pairs: prompt-hash split, left truncation with a count, length-grouped batches."""

import numpy as np
import pyarrow as pa
import pytest

from rm.model.tokenizer import build_bpe_tokenizer, encode_prompt_response
from rm.train.reward_data import (
    collate_pairs,
    length_grouped_batches,
    padding_share,
    pair_margins,
    shard,
    split_of,
    split_pairs,
    tokenize_pairs,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_bpe_tokenizer(["question answer the long prompt word short reply"] * 20, 300)


def test_split_is_by_prompt_and_deterministic():
    prompt_ids = [f"p{i}" for i in range(2000)]
    sides = [split_of(p, 0.2) for p in prompt_ids]
    assert sides == [split_of(p, 0.2) for p in prompt_ids]
    assert 0.17 < sides.count("val") / len(sides) < 0.23


def test_no_prompt_is_in_both_splits(tokenizer):
    rows = [{"prompt": f"question {i % 30}", "prompt_id": f"q{i % 30}", "chosen": "answer",
             "rejected": "reply"} for i in range(300)]
    train, val = split_pairs(tokenize_pairs(tokenizer, rows, None), 0.3)
    assert len(train) + len(val) == 300 and len(val) > 0
    assert not set(train.prompt_ids) & set(val.prompt_ids)


def test_long_prompt_is_cut_from_the_left_and_counted(tokenizer):
    prompt = "first " + "long prompt word " * 40 + "last"
    full, n_prompt_full, cut = encode_prompt_response(tokenizer, prompt, "short reply")
    assert not cut
    ids, n_prompt, cut = encode_prompt_response(tokenizer, prompt, "short reply", max_length=40)
    assert cut and len(ids) == 40
    assert ids[n_prompt:] == full[n_prompt_full:]  # the response survives whole
    assert ids[:n_prompt] == full[n_prompt_full - n_prompt:n_prompt_full]  # the prompt's tail
    rows = [{"prompt": prompt, "chosen": "short reply", "rejected": "answer"},
            {"prompt": "question", "chosen": "answer", "rejected": "reply"}]
    pairs = tokenize_pairs(tokenizer, rows, max_length=40)
    assert len(pairs) == 2 and pairs.n_truncated == 1  # truncated, not dropped


def test_overlong_response_keeps_its_head_and_final_token(tokenizer):
    ids, n_prompt, cut = encode_prompt_response(tokenizer, "q", "word " * 100, max_length=16)
    assert cut and len(ids) == 16 and n_prompt == 0
    assert ids[-1] == tokenizer.eos_token_id


def test_length_grouped_batches_cover_everything_once_with_less_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 400, size=1000)
    batches = length_grouped_batches(lengths, 8, seed=1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    random_batches = [np.arange(i, min(i + 8, 1000)) for i in range(0, 1000, 8)]
    assert padding_share(batches, lengths) < 0.1 < padding_share(random_batches, lengths)
    assert [b.tolist() for b in length_grouped_batches(lengths, 8, seed=2)] != \
        [b.tolist() for b in batches]


def test_shard_gives_every_rank_the_same_number_of_batches():
    batches = list(range(11))
    parts = [shard(batches, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert not set(parts[0]) & set(parts[1])


def test_collate_puts_chosen_rows_before_rejected(tokenizer):
    rows = [{"prompt": "q", "chosen": "answer", "rejected": "the long reply", "p_chosen": 0.75}]
    pairs = tokenize_pairs(tokenizer, rows, None)
    batch = collate_pairs(pairs, [0], tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 2
    assert batch["attention_mask"][0].sum() == len(pairs.chosen[0])
    assert batch["attention_mask"][1].sum() == len(pairs.rejected[0])
    assert batch["p_chosen"].tolist() == [0.75]


def test_pair_margins_average_the_strength_of_votes_for_chosen():
    judgments = pa.table({"prompt_id": ["p"] * 4, "response_a": ["x", "y", "x", "x"],
                          "response_b": ["y", "x", "y", "y"], "winner": ["a", "b", "tie", "a"],
                          "strength": [2.0, 4.0, 9.0, None]})
    pairs = pa.table({"prompt_id": ["p", "p"], "chosen_id": ["x", "z"], "rejected_id": ["y", "x"]})
    assert pair_margins(judgments, pairs) == [3.0, 0.0]
