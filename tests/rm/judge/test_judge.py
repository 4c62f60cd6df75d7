"""The local judge on tiny causal LMs built from a config: where the label is read, what it returns,
prefix reuse, padding, label tokens, and `bradley label` end to end on a position-biased judge."""

import json
import math

import pytest
import torch

from annotation.ingest.batch import ingest_records
from annotation.rlaif.constitution import load_constitution
from rm.judge.local import JudgeError, LocalJudge, label_token_ids, load_judge_model
from rm.model.reward_model import build_tiny_causal_lm
from rm.model.tokenizer import build_bpe_tokenizer

CORPUS = ["Which response is better for the user? The answer is: first or second.",
          "Response one says the sky is blue. Response two says it is green.",
          "Conversation about fruit and colours, apples are red and bananas are yellow."] * 6
PAIRS = [("What colour is the sky?", "Blue.", "Green, always."),
         ("Name a red fruit.", "An apple.", "A banana is red."),
         ("What is 2 + 2?", "4", "5"),
         ("Say hello politely.", "Hello, nice to meet you.", "Go away.")]
HELPFUL = load_constitution("helpful")
BIAS = 2.0  # the head's logit for the first label; every other logit is 0
P_FIRST = math.exp(BIAS) / (math.exp(BIAS) + 1.0)  # 0.8807970779778823, by hand


def biased_gpt2(folder):
    """GPT-2 from a config whose final state is the constant unit vector e_0 (ln_f weight 0, bias
    e_0) and whose untied head maps e_0 to logit BIAS on the first label's token: P(first) = σ(2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_bpe_tokenizer(CORPUS, vocab_size=400)
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=1, n_positions=1024,
                        tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    first, _ = label_token_ids(tok, HELPFUL.render("q", "x", "y", "p"), HELPFUL.labels)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[first, 0] = BIAS
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    return str(biased_gpt2(tmp_path_factory.mktemp("biased")))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(build_tiny_causal_lm(tmp_path_factory.mktemp("llama"), CORPUS, vocab_size=400, seed=1))


def items(principles=(0,)):
    return [(q, a, b, HELPFUL.principles[p].text) for q, a, b in PAIRS for p in principles]


def test_biased_head_prefers_the_first_shown_in_both_orders(biased):
    judge = LocalJudge(biased, HELPFUL.split, reuse_prefix=False)
    ab = judge.prefer(items())
    ba = judge.prefer([(q, b, a, p) for q, a, b, p in items()])
    assert ab == pytest.approx([P_FIRST] * 4, abs=1e-6) and ba == pytest.approx([P_FIRST] * 4, abs=1e-6)


def test_label_is_read_at_the_prompts_last_token(tiny_llama):
    """Decode the judge prompt's last token, and recompute P(first) from that position by hand."""
    model, tok = load_judge_model(tiny_llama)
    text = HELPFUL.render(*PAIRS[0], HELPFUL.principles[0].text)
    ids = tok(text)["input_ids"]
    assert tok.decode(ids[-1:]) == "("
    a_id, b_id = label_token_ids(tok, text, HELPFUL.labels)
    assert (tok.decode([a_id]), tok.decode([b_id])) == ("A", "B")
    with torch.no_grad():
        last = model(torch.tensor([ids])).logits[0, -1]
    p_a, p_b = (math.exp(last[a_id]) / (math.exp(last[a_id]) + math.exp(last[b_id])),
                math.exp(last[b_id]) / (math.exp(last[a_id]) + math.exp(last[b_id])))
    got = LocalJudge(tiny_llama, HELPFUL.split).prefer([(*PAIRS[0], HELPFUL.principles[0].text)])[0]
    assert got == pytest.approx(p_a, abs=1e-5) and got + p_b == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("side", ["left", "right"])
def test_prefix_reuse_and_padding_side_give_the_same_probabilities(tiny_llama, side):
    both = items(principles=(0, 1))
    model, tok = load_judge_model(tiny_llama)
    tok.padding_side = side
    flat = LocalJudge("", HELPFUL.split, reuse_prefix=False, batch_size=3, model=model, tokenizer=tok)
    shared = LocalJudge("", HELPFUL.split, reuse_prefix=True, batch_size=3, model=model, tokenizer=tok)
    one_by_one = [LocalJudge("", HELPFUL.split, reuse_prefix=False, model=model,
                             tokenizer=tok).prefer([it])[0] for it in both]
    assert flat.prefer(both) == pytest.approx(one_by_one, abs=1e-5)
    assert shared.prefer(both) == pytest.approx(one_by_one, abs=1e-5)
    assert shared.forwards == 4  # heads of 3 + 1 presentations, then the tails of each batch


@pytest.mark.parametrize("principles", [(0,), (0, 1)])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_prefix_reuse_with_both_orders_gives_the_same_probabilities(tiny_llama, batch_size, principles):
    """Both orders x one or two principles in one call, as `bradley label` sends them: prefix reuse
    gives the same P(first) as whole sequences one by one (within 1e-5)."""
    both = items(principles) + [(q, b, a, p) for q, a, b, p in items(principles)]
    model, tok = load_judge_model(tiny_llama)
    shared = LocalJudge("", HELPFUL.split, reuse_prefix=True, batch_size=batch_size, model=model,
                        tokenizer=tok)
    one_by_one = [LocalJudge("", HELPFUL.split, reuse_prefix=False, model=model,
                             tokenizer=tok).prefer([it])[0] for it in both]
    assert shared.prefer(both) == pytest.approx(one_by_one, abs=1e-5)


def llama_style_tokenizer():
    """A SentencePiece-style BPE as Llama 2's tokenizer.json has it: spaces become ▁, a ▁ is
    prepended, no pre-tokenizer, byte fallback."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=list("ABCDEFGHIJKLMNOPQRSTUVWXYZ()[]:?.+"),
                                  show_progress=False)
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def test_label_tokens_llama_style():
    """SentencePiece marks a word start with ▁: the label alone would be '▁A', but after '(' it
    is the bare 'A' the model actually predicts there."""
    tok = llama_style_tokenizer()
    context = HELPFUL.render("q", "x", "y", "Which is better?")
    ids = label_token_ids(tok, context, ["A", "B"])
    assert tok.convert_ids_to_tokens(ids) == ["A", "B"]
    assert tok.convert_ids_to_tokens(tok("A", add_special_tokens=False)["input_ids"])[0].startswith("▁")


def test_label_tokens_gpt2_byte_level():
    """GPT-2's byte-level BPE: a label after '(' is the bare 'A'; after a space it would merge into
    'ĠA' (a real GPT-2 vocabulary has it; so does this one, trained on many ' A'): a clear error."""
    tok = build_bpe_tokenizer(CORPUS + ["pick A or B, say A, say B"] * 30, 300)
    ids = label_token_ids(tok, HELPFUL.render("q", "x", "y", "Which is better?"), ["A", "B"])
    assert tok.convert_ids_to_tokens(ids) == ["A", "B"]
    with pytest.raises(JudgeError, match="merges with the prompt's last token"):
        label_token_ids(tok, "The answer is: ", ["A", "B"])


def test_judge_path_that_is_not_a_causal_lm(tmp_path):
    from rm.model.reward_model import build_tiny_reward_model

    (tmp_path / "empty").mkdir()
    with pytest.raises(JudgeError, match="is not a causal LM judge"):
        load_judge_model(str(tmp_path / "empty"))
    bert = build_tiny_reward_model(tmp_path / "bert", CORPUS, vocab_size=300, arch="bert")
    with pytest.raises(JudgeError, match="is not a causal LM judge"):
        load_judge_model(str(bert))


def run_cli(capsys, *argv):
    from service.cli.main import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err


def test_label_cli_position_biased_judge(tmp_path, biased, capsys):
    """P(first) > 0.5 in both orders: position consistency 0, every stored voice a tie, the report
    lists the rater with its human–AI agreement; a rerun labels nothing."""
    db = str(tmp_path / "s.duckdb")
    from annotation.store import Store

    with Store(db) as store:
        ingest_records(store, [{"prompt": q, "chosen": a, "rejected": b, "rater": "human:h"}
                               for q, a, b in PAIRS], fmt="trl", source="humans")
    code, out, err = run_cli(capsys, "--db", db, "label", "--judge", f"local:{biased}",
                             "--constitution", "helpful", "--principles", "all",
                             "--raters-prefix", "human:")
    assert code == 0, err
    line = json.loads(out[-1])
    rater = line["rater"]
    assert rater.startswith("ai:biased") and ":helpful@" + HELPFUL.sha8 in rater
    assert (line["pairs_judged"], line["judgments_written"], line["position_consistency"],
            line["ties"], line["failures"]) == (4, 8, 0.0, 4, 0)
    with Store(db) as store:
        ai = store.pairs(raters=rater).to_pylist()
        assert [(p["ties"], p["n_votes"], p["p_chosen"]) for p in ai] == [(1, 1, 0.5)] * 4
        rows = store.judgments(raters=rater).to_pylist()
        assert {r["source"] for r in rows} == {"rlaif"}
        assert all(r["strength"] == pytest.approx(P_FIRST, abs=1e-5) for r in rows)
        assert "P(first)=0.8808" in rows[0]["rationale"] and "principle:" in rows[0]["rationale"]
        mixed = store.pairs().to_pylist()  # 1 human vote + 1 AI tie: the human's side wins 1–0
        assert all((p["votes_chosen"], p["ties"], p["n_votes"]) == (1, 1, 2) for p in mixed)
    report = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "--db", db, "report", "--json", str(report))
    assert code == 0, err
    agreement = json.loads(report.read_text())["agreement"]
    assert agreement["position_consistency"][rater]["consistency"] == 0.0
    assert agreement["position_consistency"][rater]["first_shown_win_rate"] == 1.0
    assert rater in agreement["human_ai"]
    code, out, err = run_cli(capsys, "--db", db, "label", "--judge", f"local:{biased}",
                             "--constitution", "helpful", "--principles", "all")
    assert code == 0 and json.loads(out[-1])["pairs_judged"] == 0, err


@pytest.mark.parametrize("case", ["missing-field", "empty-list", "not-causal"])
def test_label_cli_bad_input_one_line_exit_1_nothing_written(tmp_path, biased, capsys, case):
    db = str(tmp_path / "s.duckdb")
    from annotation.store import Store

    with Store(db) as store:
        ingest_records(store, [{"prompt": "q", "chosen": "a", "rejected": "b"}], fmt="trl", source="h")
    constitution, judge = "helpful", f"local:{biased}"
    if case == "missing-field":
        text = (HELPFUL.path and open(HELPFUL.path).read()).replace('name = "helpful"\n', "")
        constitution = str(tmp_path / "c.toml")
        open(constitution, "w").write(text)
    elif case == "empty-list":
        text = open(HELPFUL.path).read().split("[[principles]]")[0] + "principles = []\n"
        constitution = str(tmp_path / "c.toml")
        open(constitution, "w").write(text)
    else:
        (tmp_path / "nothing").mkdir()
        judge = f"local:{tmp_path / 'nothing'}"
    code, out, err = run_cli(capsys, "--db", db, "label", "--judge", judge, "--constitution", constitution)
    assert code == 1 and out == [] and len(err.strip().splitlines()) == 1, err
    with Store(db) as store:
        assert store.counts()["judgments"] == 1


def test_label_cli_generate_then_revise(tmp_path, tiny_llama, capsys):
    """The plumbing of the whole recipe on a random tiny policy: sample 2 responses per prompt and
    judge them in both orders; then critique-and-revise, stored as (revision ≻ original)."""
    from annotation.store import Store

    db, prompts = str(tmp_path / "s.duckdb"), tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a red fruit."}\nWhat colour is the sky?\n')
    code, out, err = run_cli(capsys, "--db", db, "label", "--judge", f"local:{tiny_llama}",
                             "--generate", tiny_llama, "--prompts", str(prompts), "--n", "2",
                             "--temperature", "0.8", "--max-new-tokens", "6")
    assert code == 0, err
    line = json.loads(out[-1])
    assert line["pairs_judged"] == 2 and line["judgments_written"] == 4
    code, out, err = run_cli(capsys, "--db", db, "label", "--judge", f"local:{tiny_llama}",
                             "--revise", "--max-new-tokens", "6", "--pairs", "all")
    assert code == 0, err
    revised = json.loads(out[-1])
    assert revised["rater"].endswith(":revise") and revised["pairs_judged"] == 4
    with Store(db) as store:
        rows = store.judgments(raters=revised["rater"]).to_pylist()
    assert len(rows) == revised["judgments_written"] == 4 - revised["failures"]
    assert all(r["winner"] == "a" and "critique:" in r["rationale"] for r in rows)
