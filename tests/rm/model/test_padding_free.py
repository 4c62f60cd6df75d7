"""Padding-free forwards (rm/model/padding_free.py). Their kernel, PyTorch's variable-length
FlashAttention, runs on CUDA only; here it is replaced by a CPU reference of the same packing
(dense attention under a block-diagonal causal mask built from the same cu_seqlens), so everything
around it is checked in fp32: the packing, the restarted positions, grouped-query heads, a head
size FlashAttention must pad, the registration with transformers, the head at each row's last
token, the serving layout and the training forward with its gradients. Rows of mixed lengths, a
batch of one, and a row longer than the rest together."""

import logging

import pytest
import torch
import torch.nn.functional as F

from rm.model import padding_free
from rm.model.reward_model import RewardModel, RewardNet, build_tiny_reward_model
from rm.train.logps import PolicyNet

ROWS = {
    "mixed": [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], [24]],
    "one": [[7, 8, 9, 10, 11, 12]],
    "one long": [list(range(3, 40)), [5, 6], [7, 8, 9], [10]],
}


def reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1), scale=None,
                     enable_gqa=False):
    """What the kernel computes, densely: each token attends to the tokens of its own row up to it."""
    assert tuple(window_size) == (-1, 0), "padding-free attention must be causal"
    rows = torch.repeat_interleave(torch.arange(len(cu_seq_q) - 1), cu_seq_q.diff().long())
    n = q.shape[0]
    mask = (rows[:, None] == rows[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out.transpose(0, 1)


@pytest.fixture
def cpu_kernel(monkeypatch):
    """The CPU reference in place of the CUDA kernel, and the CPU allowed."""
    monkeypatch.setattr(padding_free, "_varlen", lambda: reference_varlen)
    monkeypatch.setattr(padding_free, "why_not", lambda model, device: None)


def _llama(tmp_path, kind="rm"):
    """A tiny Llama with grouped-query attention (4 query heads, 2 key/value heads) and head size
    12, which FlashAttention pads to 16."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    folder = build_tiny_reward_model(tmp_path / "base", ["a tiny text for the tokenizer"] * 8, vocab_size=300)
    config = AutoConfig.from_pretrained(folder)
    config.update({"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 96, "attn_implementation": "sdpa"})
    torch.manual_seed(0)
    auto = AutoModelForSequenceClassification if kind == "rm" else AutoModelForCausalLM
    model = auto.from_config(config).eval()
    model.save_pretrained(folder)
    return folder, model


def _padded(rows):
    from rm.model.padding import pad_batch

    return pad_batch(rows, pad_id=0)


@pytest.mark.parametrize("case", list(ROWS))
def test_packed_rewards_equal_the_padded_forward(tmp_path, cpu_kernel, case):
    folder, _ = _llama(tmp_path)
    padded = RewardModel.load(folder, device="cpu")
    batch = _padded(ROWS[case])
    with torch.no_grad():
        expected = padded.net(batch["input_ids"], batch["attention_mask"])
    packed = RewardModel.load(folder, device="cpu")
    assert packed.layout == "packed"
    assert packed.score_encoded(ROWS[case]) == pytest.approx(expected.tolist(), abs=1e-5)
    alone = [padded.score_encoded([row])[0] for row in ROWS[case]]   # each row's own forward
    assert expected.tolist() == pytest.approx(alone, abs=1e-5)
    assert torch.unique(expected).numel() == len(ROWS[case])   # rows that score differently


def test_training_forward_unpads_and_gives_the_same_gradients(tmp_path, cpu_kernel):
    folder, model = _llama(tmp_path)
    batch = _padded(ROWS["mixed"] + ROWS["one long"])
    results = []
    for packed in (False, True):
        net = RewardNet(type(model).from_pretrained(folder)).train()
        if packed:
            assert net.go_padding_free(torch.device("cpu"))
        rewards = net(batch["input_ids"], batch["attention_mask"])
        (rewards * torch.linspace(-1, 1, rewards.numel())).sum().backward()
        results.append((rewards.detach(), [p.grad.clone() for p in net.parameters()]))
    (plain, plain_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-6)
    for a, b in zip(packed_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_policy_log_probs_packed_equal_padded(tmp_path, cpu_kernel):
    from rm.train import policy_data as po_data

    folder, model = _llama(tmp_path, kind="lm")
    seqs = [po_data.Encoded(tuple(row), start=min(2, len(row) - 1))
            for row in ROWS["one long"][:3] + ROWS["mixed"][:3]]
    batch = po_data.collate(seqs, pad_id=0)
    plain = PolicyNet(model)
    packed = PolicyNet(type(model).from_pretrained(folder).eval())
    assert packed.go_padding_free(torch.device("cpu"))
    with torch.no_grad():
        expected = plain(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        got = packed(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
    assert got[1].tolist() == expected[1].tolist()


def test_a_cpu_keeps_the_padded_path_and_says_nothing(tmp_path, caplog):
    folder, _ = _llama(tmp_path)
    with caplog.at_level(logging.WARNING, logger=padding_free.__name__):
        model = RewardModel.load(folder, device="cpu")
        model.score_encoded(ROWS["mixed"])
    assert model.layout == "unmasked" and not model.net.padding_free
    assert padding_free.why_not(model.net.hf, torch.device("cpu")) == "a CPU runs the padded SDPA path"
    assert not caplog.records


def test_an_encoder_keeps_the_padded_path(tmp_path):
    folder = build_tiny_reward_model(tmp_path / "bert", ["a tiny text"] * 8, arch="bert", vocab_size=300)
    model = RewardModel.load(folder, device="cpu")
    assert "causal decoders" in padding_free.why_not(model.net.hf, torch.device("cuda"))
