"""Sequence log-probs, joint tokenization, the reference cache and the objective at π_θ = π_ref."""

import math

import pytest
import torch

import rm.train.logps as seqlogps
from rm.model.reward_model import build_tiny_causal_lm
from rm.model.tokenizer import build_bpe_tokenizer
from rm.train import objectives
from rm.train import policy as policy_run
from rm.train import policy_data as po_data

VOCAB = 8
PAD = 0


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token distribution depends only on the current token: a fixed table.

    After token 5 the next token is 2 with probability 0.5; after 2, 3 with 0.25; after 3, 4 with
    0.8. So the 3-token answer [2, 3, 4] to any prompt ending in 5 has log-prob ln(0.5·0.25·0.8).
    """

    def __init__(self):
        super().__init__()
        probs = torch.full((VOCAB, VOCAB), 1.0)
        for prev, nxt, p in ((5, 2, 0.5), (2, 3, 0.25), (3, 4, 0.8)):
            probs[prev] = (1 - p) / (VOCAB - 1)
            probs[prev, nxt] = p
        self.table = torch.nn.Parameter(torch.log(probs / probs.sum(-1, keepdim=True)))
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **kwargs):
        self.calls += 1
        logits = self.table[input_ids]
        return type("Out", (), {"logits": logits[:, -logits_to_keep:] if logits_to_keep else logits})()


def test_three_token_answer_is_ln_point_one_and_prompt_padding_do_not_count():
    model = BigramLM()
    short = po_data.Encoded((1, 5, 2, 3, 4), start=2)
    long_prompt = po_data.Encoded((1, 7, 6, 6, 7, 5, 2, 3, 4), start=6)
    batch = po_data.collate([short, long_prompt], pad_id=PAD)  # short gets 4 pad tokens
    logps, n = seqlogps.forward_logps(model, batch)
    assert logps.tolist() == pytest.approx([math.log(0.1)] * 2, abs=1e-5)
    assert round(logps[0].item(), 3) == -2.303
    assert n.tolist() == [3, 3]
    assert batch["logits_to_keep"] == 9 - 2 + 1  # from the position before the earliest answer
    # the same values from full logits: skipping the prompt's logits changes nothing
    full = seqlogps.forward_logps(model, {**batch, "logits_to_keep": 0})
    assert full[0].tolist() == pytest.approx(logps.tolist(), abs=1e-6)
    # the same answer with a 1-token prompt: only the first token is prompt (it has no prediction)
    alone = po_data.collate([po_data.Encoded((5, 2, 3, 4), start=1)], pad_id=PAD)
    assert seqlogps.forward_logps(model, alone)[0].item() == pytest.approx(math.log(0.1), abs=1e-5)


def test_shift_by_one_reads_the_previous_position():
    # If the shift were missing, position t would score token t with its own logits: after 2 the
    # table favours 3, so the wrong alignment would score log P(2|2) etc. and differ.
    model = BigramLM()
    batch = po_data.collate([po_data.Encoded((5, 2, 3, 4), start=1)], pad_id=PAD)
    wrong = torch.log_softmax(model.table, -1)[torch.tensor([2, 3, 4]), torch.tensor([2, 3, 4])].sum()
    assert abs(seqlogps.forward_logps(model, batch)[0].item() - wrong.item()) > 1.0


TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello there, how are you today?"] * 8


@pytest.fixture(scope="module")
def tokenizer():
    return build_bpe_tokenizer(TEXTS, vocab_size=300)


@pytest.mark.parametrize("templated", [True, False])
def test_joint_tokenization_boundary(tokenizer, templated):
    saved = tokenizer.chat_template
    tokenizer.chat_template = saved if templated else None
    try:
        enc, cut = po_data.encode(tokenizer, "hello there", "the cat sat", max_length=512)
        head, full, specials = po_data.render(tokenizer, "hello there", "the cat sat")
    finally:
        tokenizer.chat_template = saved
    assert not cut
    # the ids are the joint tokenization of the whole text, not two halves glued together
    assert list(enc.ids) == tokenizer(full, add_special_tokens=specials)["input_ids"]
    assert tokenizer.decode(enc.ids[enc.start:]) == "the cat sat</s>"
    assert tokenizer.decode(enc.ids[:enc.start]) == head


def test_truncation_cuts_the_prompt_from_the_left(tokenizer):
    long_prompt = " ".join(["hello there"] * 40)
    enc, cut = po_data.encode(tokenizer, long_prompt, "the cat sat", max_length=24)
    assert cut and len(enc.ids) == 24
    assert tokenizer.decode(enc.ids[enc.start:]) == "the cat sat</s>"


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_causal_lm(tmp_path_factory.mktemp("lm"), TEXTS, vocab_size=300)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _pairs(n=6):
    return [{"prompt_id": f"p{i}", "prompt": f"question {i}: hello there", "messages": None, "chosen_id": f"c{i}",
             "rejected_id": f"r{i}", "chosen": "the cat sat on the mat" + "!" * i,
             "rejected": "a dog ran", "p_chosen": 1.0} for i in range(n)]


def test_reference_cache_is_hit_on_the_second_run(store, tiny_lm):
    model, tok = tiny_lm
    data = po_data.pair_data(_pairs(), tok, max_length=64)
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        kw = dict(cache=store, model_hash=seqlogps.weights_hash(model),
                  template=po_data.template_hash(tok, 64), max_tokens=4 * 64)
        first, computed = seqlogps.reference_logps(model, data.sequences, tok.pad_token_id, **kw)
        n_first = len(calls)
        second, computed_again = seqlogps.reference_logps(model, data.sequences, tok.pad_token_id, **kw)
    finally:
        hook.remove()
    assert computed == 12 and 1 < n_first < 12  # 12 sequences, several to a forward
    assert computed_again == 0 and len(calls) == n_first  # no forward pass on the second run
    assert second == first
    # another template (here: max_length) is another cache entry
    _, computed_other = seqlogps.reference_logps(model, data.sequences, tok.pad_token_id, cache=store,
                                               model_hash=kw["model_hash"], template="other")
    assert computed_other == 12


def test_weights_hash_changes_with_the_weights(tiny_lm):
    model, _ = tiny_lm
    before = seqlogps.weights_hash(model)
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    try:
        assert seqlogps.weights_hash(model) != before
    finally:
        with torch.no_grad():
            model.lm_head.weight[0, 0] -= 1.0


@pytest.mark.parametrize("loss,expected", [("dpo", math.log(2)), ("ipo", 1 / (4 * 0.1**2)),
                                           ("kto", 0.5)])
def test_objective_at_policy_equal_reference(tiny_lm, loss, expected):
    model, tok = tiny_lm
    if loss == "kto":
        data = po_data.kto_data([], _pairs(), tok, max_length=64)
    else:
        data = po_data.pair_data(_pairs(), tok, max_length=64)
    ref, _ = seqlogps.reference_logps(model, data.sequences, tok.pad_token_id, max_tokens=100)
    idx = po_data.batches(data, range(len(data.examples)), batch_size=4)[0]
    batch = po_data.collate_examples(data, ref, idx, tok.pad_token_id)
    value, metrics = objectives.po_objective(objectives.PoConfig(loss=loss, beta=0.1))(model, batch)
    assert value.item() == pytest.approx(expected, abs=1e-4)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["margin"] == pytest.approx(0.0, abs=1e-5)


def test_kto_batch_of_one_has_its_mismatched_pair(tiny_lm):
    model, tok = tiny_lm
    data = po_data.kto_data([], _pairs(2), tok, max_length=64)
    ref, _ = seqlogps.reference_logps(model, data.sequences, tok.pad_token_id)
    batch = po_data.collate_examples(data, ref, [0], tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 2  # the completion and its (other prompt, completion)
    value, _ = objectives.po_objective(objectives.PoConfig(loss="kto"))(model, batch)
    assert math.isfinite(value.item())


def test_kto_needs_two_prompts(tiny_lm):
    _, tok = tiny_lm
    rows = [dict(_pairs(1)[0])]
    with pytest.raises(ValueError, match="two different prompts"):
        po_data.kto_data([], rows, tok, max_length=64)


def test_ties_are_skipped_and_an_all_tie_snapshot_is_an_error(tiny_lm):
    _, tok = tiny_lm
    rows = _pairs(3)
    rows[0]["p_chosen"] = 0.5
    assert po_data.pair_data(rows, tok, 64).stats["ties_skipped"] == 1
    with pytest.raises(ValueError, match="no usable pairs"):
        po_data.pair_data(rows[:1], tok, 64)


def test_unknown_loss_is_a_clear_error():
    with pytest.raises(ValueError, match="dpo, ipo, kto, simpo, orpo"):
        objectives.po_objective(objectives.PoConfig(loss="bt"))


def test_step_log_warns_once_when_chosen_logp_falls_while_margin_grows():
    import io

    steps = iter(range(21))

    def objective(model, batch):
        i = next(steps)
        return torch.tensor(0.5), {"loss": 0.5, "logp_chosen": -1.0 - 0.1 * i, "margin": 0.1 * i}

    stream = io.StringIO()
    log = policy_run.StepLog(objective, stream=stream)
    for _ in range(20):
        log(None, {})
    with torch.no_grad():  # validation calls are not steps
        log(None, {})
    assert len(log.steps) == 20
    assert stream.getvalue().count("falling while the margin grows") == 1


def test_step_log_averages_the_micro_batches_of_one_optimizer_step():
    import io

    losses = iter([1.0, 3.0, 5.0, 7.0])

    def objective(model, batch):
        value = next(losses)
        return torch.tensor(value), {"loss": value, "logp_chosen": -1.0, "margin": 0.0}

    log = policy_run.StepLog(objective, accum=2, stream=io.StringIO())
    for _ in range(4):
        log(None, {})
    assert [s["loss"] for s in log.steps] == [2.0, 6.0]


def test_chunked_projection_gives_the_full_logits_values_and_gradients(tiny_lm, monkeypatch):
    """PolicyNet projects the response positions onto the vocabulary a chunk of rows at a time,
    recomputing each chunk in the backward pass: the log-probs of the whole [rows, length,
    vocabulary] logits, in fp32 to 1e-6, and the same gradients."""
    model, tok = tiny_lm
    data = po_data.pair_data(_pairs(), tok, max_length=64)
    batch = po_data.collate(list(data.sequences.values()), tok.pad_token_id)
    monkeypatch.setattr(seqlogps, "CHUNK_LOGITS", 7 * model.config.vocab_size)   # chunks of 7 tokens
    assert int(batch["response_mask"][:, 1:].sum()) > 5 * 7
    results = []
    for net in (model, seqlogps.PolicyNet(model)):
        model.zero_grad(set_to_none=True)
        logps, n = seqlogps.forward_logps(net, batch)
        (logps * torch.linspace(0.5, 1.5, logps.numel())).sum().backward()
        results.append((logps.detach(), n, [p.grad.clone() for p in model.parameters()]))
    (full, n_full, full_grads), (chunked, n_chunked, chunked_grads) = results
    assert (chunked - full).abs().max() < 1e-6 * full.abs().max()   # float32 sums of the same terms
    hidden, labels = torch.randn(40, model.config.hidden_size), torch.randint(0, 300, (40,))
    head = model.get_output_embeddings()
    per_token = torch.log_softmax(head(hidden), -1)[torch.arange(40), labels]
    assert (seqlogps.token_logps(hidden, head, labels) - per_token).abs().max() < 1e-6
    assert n_chunked.tolist() == n_full.tolist()
    for a, b in zip(chunked_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
