"""Reward-model scoring: last real token for every padding, batch independence, round trips."""

import random

import pytest
import torch

from rm.model.padding import last_token_index, pad_batch
from rm.model.reward_model import (
    RewardModel,
    _tiny_tokenizer,
    build_tiny_causal_lm,
    build_tiny_reward_model,
    save_model,
)

TEXTS = [f"the answer to question {i} is clear and correct, not vague {i * 7}" for i in range(40)]




def _mixed_batch(n=32, seed=0):
    rng = random.Random(seed)
    prompts = [f"question {i} " + "about things " * rng.randint(0, 12) for i in range(n)]
    responses = [f"answer {i} " + "is clear " * rng.randint(0, 15) for i in range(n)]
    return prompts, responses


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One tiny model per (architecture, padding side, pad == eos) case."""
    cases = {"llama-right": dict(), "llama-left": dict(padding_side="left"),
             "llama-pad-eos": dict(pad_equals_eos=True),
             "llama-left-pad-eos": dict(padding_side="left", pad_equals_eos=True),
             "gpt2-left": dict(arch="gpt2", padding_side="left"), "qwen2": dict(arch="qwen2"),
             "bert": dict(arch="bert")}
    root = tmp_path_factory.mktemp("models")
    return {name: RewardModel.load(build_tiny_reward_model(root / name, TEXTS, **kw), device="cpu")
            for name, kw in cases.items()}


DECODERS = ["llama-right", "llama-left", "llama-pad-eos", "llama-left-pad-eos", "gpt2-left", "qwen2"]


@pytest.mark.parametrize("case", [*DECODERS, "bert"])
def test_score_alone_equals_score_in_batch_of_32_mixed_lengths(models, case):
    rm = models[case]
    ids = rm.encode(*_mixed_batch())
    assert len({len(x) for x in ids}) > 10  # really mixed lengths
    together = rm.score_encoded(ids)
    alone = [rm.score_encoded([x])[0] for x in ids]
    assert max(abs(a - b) for a, b in zip(together, alone, strict=True)) < 1e-5
    assert max(together) - min(together) > 1e-4  # not a constant function


def _scores_in(rm, ids, layout):
    """Scores of `ids` in one forward laid out as `layout` ("unmasked", "masked")."""
    with torch.inference_mode():
        return rm._rewards(ids, layout).tolist()


@pytest.mark.parametrize("case", DECODERS)
def test_decoders_score_unmasked_what_the_masked_forward_scores(models, case):
    """A causal decoder's right-padded rows need no mask: the probe at the first scoring finds
    each of these models causal, and the unmasked forward gives the forward-as-trained's scores."""
    rm = models[case]
    ids = rm.encode(*_mixed_batch())
    served = rm.score_encoded(ids)
    assert rm.layout == "unmasked" and rm.scores_without_mask
    masked = _scores_in(rm, ids, "masked")  # the tokenizer's padding side, with the mask
    assert served == pytest.approx(masked, abs=1e-5)


def test_encoders_keep_their_mask(models):
    rm = models["bert"]
    rm.score_encoded(rm.encode(*_mixed_batch(4)))
    assert rm.layout == "masked" and rm.scores_without_mask is False


def _leaky(rewards):
    """`rewards` plus a share of the forward's total tokens: what attending across rows or to
    padding does to a score (it moves with the batch-mates)."""
    return lambda ids, *rest: rewards(ids, *rest) + 0.01 * ids.numel()


def test_an_unmasked_forward_whose_rows_see_their_padding_is_not_used(tmp_path, monkeypatch):
    rm = RewardModel.load(build_tiny_reward_model(tmp_path / "m", TEXTS), device="cpu")
    monkeypatch.setattr(rm.net, "causal_rewards", _leaky(rm.net.causal_rewards))
    ids = rm.encode(*_mixed_batch(8))
    together = rm.score_encoded(ids)
    assert rm.layout == "masked"
    assert together == pytest.approx([rm.score_encoded([x])[0] for x in ids], abs=1e-5)


def test_an_unmasked_forward_that_fails_is_not_used(tmp_path, monkeypatch):
    rm = RewardModel.load(build_tiny_reward_model(tmp_path / "m", TEXTS), device="cpu")
    ids = rm.encode(*_mixed_batch(4))
    expected = _scores_in(rm, ids, "masked")
    monkeypatch.setattr(rm.net, "causal_rewards", lambda *_: 1 / 0)
    assert rm.score_encoded(ids) == pytest.approx(expected, abs=1e-6)
    assert rm.layout == "masked"


def _from_config(config_class, **fields) -> RewardModel:
    """A 2-layer reward model of `config_class` (hidden 64) with random weights, seed 0, on the
    tests' tiny tokenizer: architectures the `models` fixture does not build."""
    from transformers import AutoModelForSequenceClassification

    tok = _tiny_tokenizer(TEXTS, 300, "llama", False)
    torch.manual_seed(0)
    config = config_class(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, pad_token_id=tok.pad_token_id, num_labels=1,
                          **fields)
    return RewardModel(AutoModelForSequenceClassification.from_config(config), tok)


def test_grouped_query_attention_scores_unmasked_exactly():
    """A Llama with 4 query heads sharing 1 key/value head: each key/value head serves its group."""
    from transformers import LlamaConfig

    rm = _from_config(LlamaConfig, num_attention_heads=4, num_key_value_heads=1)
    ids = rm.encode(*_mixed_batch(12))
    assert rm.score_encoded(ids) == pytest.approx(_scores_in(rm, ids, "masked"), abs=1e-5)
    assert rm.layout == "unmasked"


def test_a_sliding_window_model_scores_unmasked_what_it_scores_alone():
    """A Mistral whose layers see only the last `sliding_window` tokens: right padding still comes
    after every real token, so the unmasked forward scores each row as alone."""
    from transformers import MistralConfig

    rm = _from_config(MistralConfig, num_attention_heads=2, num_key_value_heads=1, sliding_window=4)
    ids = rm.encode(*_mixed_batch(8))
    together = rm.score_encoded(ids)
    assert rm.layout == "unmasked"
    assert together == pytest.approx([rm.score_encoded([x])[0] for x in ids], abs=1e-5)


@pytest.mark.parametrize("flag_kept", [True, False])
def test_a_decoder_that_attends_both_ways_keeps_its_mask(flag_kept):
    """Gemma 3 with bidirectional attention has a score head like a causal decoder: its config
    keeps the mask; with the flag cleared after the model was built (its layers still attend both
    ways), the probe rows do."""
    from transformers import Gemma3TextConfig

    rm = _from_config(Gemma3TextConfig, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      use_bidirectional_attention=True)
    rm.net.hf.config.use_bidirectional_attention = flag_kept
    ids = rm.encode(*_mixed_batch(8))
    together = rm.score_encoded(ids)
    assert rm.net.is_decoder and rm.layout == "masked"
    if flag_kept:  # cleared, the config no longer describes the layers: the decision is the test
        assert together == pytest.approx([rm.score_encoded([x])[0] for x in ids], abs=1e-5)


def test_padding_side_does_not_change_scores(models):
    ids = models["llama-right"].encode(*_mixed_batch(8))
    right = models["llama-right"].score_encoded(ids)
    left = models["llama-left"].score_encoded(ids)  # same seed, same weights, other padding
    assert right == pytest.approx(left, abs=1e-5)


def test_pad_equals_eos_reads_the_final_eos_not_the_first(models):
    rm = models["llama-pad-eos"]
    assert rm.tokenizer.pad_token_id == rm.tokenizer.eos_token_id
    ids = rm.encode(["hello there"], ["the answer is clear"])[0]
    assert ids[-1] == rm.tokenizer.eos_token_id and ids.count(rm.tokenizer.eos_token_id) >= 2
    # Reference: Hugging Face's own head on an unpadded sequence with no pad id configured
    # reads the final position; a pad-id scorer would stop at the first eos instead.
    hf = rm.net.hf
    saved, hf.config.pad_token_id = hf.config.pad_token_id, None
    try:
        with torch.no_grad():
            reference = hf(torch.tensor([ids])).logits[0, 0].item()
    finally:
        hf.config.pad_token_id = saved
    assert rm.score_encoded([ids, ids[:5]])[0] == pytest.approx(reference, abs=1e-5)


def test_score_matches_huggingface_forward_without_padding(models):
    rm = models["llama-right"]
    ids = rm.encode(["q"], ["a clear answer"])[0]
    with torch.no_grad():
        reference = rm.net.hf(torch.tensor([ids])).logits[0, 0].item()
    assert rm.score_encoded([ids])[0] == pytest.approx(reference, abs=1e-5)


def test_score_keeps_input_order_and_matches_score_encoded(models):
    rm = models["llama-right"]
    prompts, responses = _mixed_batch(10, seed=3)
    scores = rm.score(prompts, responses, batch_size=3)
    direct = [rm.score_encoded([x])[0] for x in rm.encode(prompts, responses)]
    assert scores == pytest.approx(direct, abs=1e-5)


def test_checkpoint_round_trip_gives_identical_scores(models, tmp_path):
    rm = models["llama-left"]
    prompts, responses = _mixed_batch(6)
    before = rm.score(prompts, responses)
    folder = save_model(rm.net.hf, rm.tokenizer, tmp_path / "copy", {"model_id": "rm-x"}, {"a": 1})
    assert (folder / "model.safetensors").is_file()
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))
    again = RewardModel.load(folder, device="cpu")
    assert again.model_id == "rm-x"
    assert again.score(prompts, responses) == before


def test_chat_template_is_applied_to_messages(models):
    rm = models["llama-right"]
    ids = rm.encode([[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]],
                    ["hello"])[0]
    text = rm.tokenizer.decode(ids)
    assert text == "<|system|>\nbe brief</s><|user|>\nhi</s><|assistant|>\nhello</s>"


def test_encoder_uses_sentence_pairs_and_segment_ids(models):
    rm = models["bert"]
    ids = rm.encode(["what"], ["this"])[0]
    sep = rm.tokenizer.sep_token_id
    assert ids[0] == rm.tokenizer.cls_token_id and ids[-1] == sep and ids.count(sep) == 2
    assert rm.padding_side == "right"


def test_last_token_index_for_both_paddings():
    right = pad_batch([[4, 5, 6], [7]], pad_id=0, padding_side="right")["attention_mask"]
    left = pad_batch([[4, 5, 6], [7]], pad_id=0, padding_side="left")["attention_mask"]
    assert last_token_index(right).tolist() == [2, 0]
    assert last_token_index(left).tolist() == [2, 2]


def test_bad_inputs_raise_value_errors(models, tmp_path):
    with pytest.raises(ValueError, match="not a model folder"):
        RewardModel.load(tmp_path)
    with pytest.raises(ValueError, match="one each"):
        models["llama-right"].encode(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="padding_side"):
        pad_batch([[1]], 0, "middle")


def test_tiny_causal_lm_builds_and_reloads(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_causal_lm(tmp_path / "lm", TEXTS)
    model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    logits = model(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape[:2] == (1, 3) and logits.shape[-1] == model.config.vocab_size
