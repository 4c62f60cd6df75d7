"""LoRA reward models and policies (rm/train/lora.py) on tiny Llamas: a LoRA reward model learns the
planted signal as full fine-tuning does; its published folder holds merged weights that plain
transformers loads and that score as the adapter model does, and a merge that lost or never
trained the score head is caught; LoRA DPO takes its reference from the adapters disabled, starts
at ln 2 and lowers its loss."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rm.model.reward_model import (
    RewardNet,
    build_tiny_causal_lm,
    build_tiny_reward_model,
    load_backbone,
)
from rm.train import lora
from rm.train import reward_data as data
from rm.train.loop import TrainConfig
from rm.train.reward import RewardRunConfig, train_reward_model
from rm.train.run import RunInputs
from service.cli.main import main
from tests.rm.train.test_train import synthetic_pairs


def _rows(n: int, seed: int) -> list[dict]:
    return [{"prompt": p, "chosen": c, "rejected": r, "prompt_id": f"p{i}", "p_chosen": 1.0}
            for i, (p, c, r) in enumerate(synthetic_pairs(n, seed=seed))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same data, base model and steps trained in full and with LoRA r=8 (kept adapter)."""
    tmp = tmp_path_factory.mktemp("lora")
    rows = _rows(320, seed=3)
    base = build_tiny_reward_model(tmp / "base", [t for r in rows for t in (r["prompt"], r["chosen"],
                                                                             r["rejected"])])
    out = {}
    for name, settings in (("full", lora.LoraSettings()), ("lora", lora.LoraSettings(rank=8, keep_adapter=True))):
        config = RewardRunConfig(base_model=str(base), out=str(tmp / name), device="cpu", max_length=64,
                                 val_fraction=0.3, lora=settings,
                                 train=TrainConfig(steps=24, batch_size=8, lr=3e-3, eval_every=8,
                                                   patience=None))
        out[name] = train_reward_model(config, RunInputs(pairs=rows))
    return out, rows, base


def test_lora_reward_model_learns_the_signal_as_full_fine_tuning_does(runs):
    metrics, _, _ = runs
    full, low_rank = metrics["full"], metrics["lora"]
    assert full["val_accuracy"] >= 0.8 and full["n_val"] >= 40
    assert abs(low_rank["val_accuracy"] - full["val_accuracy"]) <= 0.02
    record = json.loads((Path(low_rank["path"]) / "train_config.json").read_text())
    assert record["lora_rank"] == 8 and record["keep_adapter"] is True and record["merged_lora"]
    assert RewardRunConfig.from_record(record).lora == lora.LoraSettings(rank=8, keep_adapter=True)
    assert low_rank["merge_check_max_abs_diff"] < 1e-5


def _adapter_net(base: Path, folder: Path) -> RewardNet:
    """The adapter model as peft loads it: the base model with the saved adapter (and head)."""
    from peft import PeftModel

    hf_model, tokenizer = load_backbone(str(base))
    model = PeftModel.from_pretrained(hf_model, str(folder / lora.ADAPTER_FOLDER))
    return RewardNet(model.get_base_model(), tokenizer.sep_token_id).eval()


def _probe(rows, folder) -> dict:
    _, tokenizer = load_backbone(str(folder))
    pairs = data.tokenize_pairs(tokenizer, rows[:6], 64)
    return data.collate_pairs(pairs, range(6), tokenizer.pad_token_id, tokenizer.padding_side)


def test_the_merged_folder_scores_as_the_adapter_model_does(runs):
    from transformers import AutoModelForSequenceClassification

    from rm.model.reward_model import RewardModel

    metrics, rows, base = runs
    folder = Path(metrics["lora"]["path"])
    saved = load_file(folder / "model.safetensors")
    assert not [k for k in saved if "lora_" in k or "base_layer" in k or "modules_to_save" in k]
    plain = AutoModelForSequenceClassification.from_pretrained(folder)  # the plain way, no peft
    batch = _probe(rows, folder)
    net = _adapter_net(base, folder)
    with torch.no_grad():
        adapter_scores = net(batch["input_ids"], batch["attention_mask"])
        merged = RewardNet(plain).eval()(batch["input_ids"], batch["attention_mask"])
    assert (adapter_scores - merged).abs().max() < 1e-5
    assert adapter_scores.std() > 1e-3   # scores that differ: the comparison can fail
    served = RewardModel.load(folder, device="cpu")   # what `bradley serve` loads
    texts = [(r["prompt"], r["chosen"]) for r in rows[:6]]
    direct = served.score([p for p, _ in texts], [c for _, c in texts])
    assert direct == pytest.approx(merged[:6].tolist(), abs=1e-5)


@pytest.mark.parametrize("fault", ["untrained head", "dropped head"])
def test_a_merge_that_lost_the_score_head_is_caught(runs, tmp_path, fault):
    metrics, rows, base = runs
    folder = Path(metrics["lora"]["path"])
    net = _adapter_net(base, folder)
    batch = _probe(rows, folder)
    assert lora.check_merged(net, folder, batch, torch.device("cpu")) < 1e-5   # the good folder passes
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in folder.iterdir():
        if item.is_file():
            (broken / item.name).write_bytes(item.read_bytes())
    weights = load_file(folder / "model.safetensors")
    if fault == "untrained head":
        weights["score.weight"] = load_file(base / "model.safetensors")["score.weight"]
    else:
        del weights["score.weight"]   # transformers initialises a fresh head
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(lora.LoraError, match="score head"):
        lora.check_merged(net, broken, batch, torch.device("cpu"))


def test_bad_lora_flags_exit_cleanly(tmp_path, capsys):
    db = str(tmp_path / "x.duckdb")
    assert main(["--db", db, "train", "rm", "--keep-adapter"]) == 1
    assert "--lora-rank" in capsys.readouterr().err
    assert main(["--db", db, "train", "po", "--loss", "dpo", "--lora-rank", "4", "--lora-dropout", "1"]) == 1
    assert "--lora-dropout" in capsys.readouterr().err


# --- policies ----------------------------------------------------------------------------------


@pytest.fixture
def tiny_policy(tmp_path):
    from rm.model.reward_model import load_causal_lm

    texts = [f"the answer to question {i} is clear and correct, not vague {i * 7}" for i in range(40)]
    return load_causal_lm(str(build_tiny_causal_lm(tmp_path / "lm", texts, vocab_size=300)))


def test_reference_with_adapters_disabled_is_the_frozen_base(tiny_policy):
    import copy

    from rm.train import policy_data as po_data
    from rm.train.logps import PolicyNet, reference_logps

    model, tokenizer = tiny_policy
    frozen = PolicyNet(copy.deepcopy(model)).eval()
    adapters = lora.add_adapters(model, lora.LoraSettings(rank=4))
    with torch.no_grad():   # trained adapters: B ≠ 0
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    net = PolicyNet(model)
    rows = [{"prompt": f"question {i}?", "chosen": "clear and correct", "rejected": "vague",
             "chosen_id": f"c{i}", "rejected_id": f"r{i}", "prompt_id": f"p{i}"} for i in range(4)]
    sequences = po_data.pair_data(rows, tokenizer, 64).sequences
    pad = tokenizer.pad_token_id
    reference, _ = reference_logps(frozen, sequences, pad)
    with adapters.disable_adapter():
        disabled, _ = reference_logps(net, sequences, pad)
    adapted, _ = reference_logps(net, sequences, pad)
    assert max(abs(disabled[k][0] - reference[k][0]) for k in sequences) < 1e-6
    assert max(abs(adapted[k][0] - reference[k][0]) for k in sequences) > 1e-2   # the adapters act


def test_the_streamed_merge_publishes_what_a_whole_merge_does(tiny_policy, tmp_path):
    """The folder written base-first and merged layer by layer in the file holds the tensors a
    merge of the whole model (peft's merge_and_unload, saved by save_pretrained) holds."""
    import copy

    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny_policy
    adapters = lora.add_adapters(model, lora.LoraSettings(rank=4))
    with torch.no_grad():   # trained adapters: B ≠ 0, so the merge moves every weight it targets
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    whole = copy.deepcopy(adapters).merge_and_unload()
    whole.save_pretrained(tmp_path / "whole", safe_serialization=True)
    lora.save_merged(adapters, tokenizer, tmp_path / "streamed", {}, {}, keep_adapter=False)
    streamed = load_file(tmp_path / "streamed" / "model.safetensors")
    expected = load_file(tmp_path / "whole" / "model.safetensors")
    base = load_file(Path(model.config.name_or_path) / "model.safetensors")
    assert streamed.keys() == expected.keys()
    assert max((streamed[k] - expected[k]).abs().max().item() for k in expected) < 1e-6
    moved = [k for k in expected if k.endswith("proj.weight")]
    assert moved and all((streamed[k] - base[k]).abs().max() > 1e-2 for k in moved)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "streamed")   # the plain way, no peft
    ids = torch.tensor([tokenizer("the answer to question 3 is clear")["input_ids"]])
    with torch.no_grad():
        assert (plain(ids).logits - whole(ids).logits).abs().max() < 1e-5


def test_lora_dpo_starts_at_ln_2_and_lowers_its_loss(store, shared_data, tmp_path):
    from rm.train import policy as policy_run
    from rm.train.objectives import PoConfig
    from tests.rm.train.test_train_po import HH, hh_pairs, put_pairs

    put_pairs(store, hh_pairs(shared_data / HH, 8))
    snapshot = store.create_snapshot()
    config = policy_run.PolicyRunConfig(
        base_model="tiny", out=str(tmp_path / "dpo-lora"), max_length=96, val_fraction=0.1,
        train=TrainConfig(steps=6, batch_size=8, lr=3e-3), objective=PoConfig(loss="dpo"),
        lora=lora.LoraSettings(rank=8, keep_adapter=True))
    metrics = policy_run.train_policy(config, RunInputs(pairs=store.pairs(snapshot), snapshot_id=snapshot),
                                      ref_cache=store)
    assert metrics["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert metrics["final_loss"] < metrics["first_loss"] - 0.05
    folder = Path(metrics["path"])
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder)   # merged weights, loaded the plain way
    assert (folder / lora.ADAPTER_FOLDER / "adapter_model.safetensors").is_file()
    assert json.loads((folder / "train_config.json").read_text())["lora_rank"] == 8
