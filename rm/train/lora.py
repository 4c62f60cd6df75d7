"""LoRA through peft (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a
frozen weight W gains a trainable low-rank update, W' = W + (α/r)·B·A with A ∈ R^{r×k} and
B ∈ R^{d×r}, B = 0 at the start, so a run begins exactly at its base model.

- Reward models: adapters on the backbone's linear layers and the score head trained in full
  (peft's `modules_to_save`: a trainable copy of the head). The published folder holds merged
  weights (W + (α/r)·B·A, the trained head under its own name) that plain
  `AutoModelForSequenceClassification.from_pretrained` loads; `keep_adapter` also writes the
  adapter (with its head) to `adapter/` inside the folder. Losing the head in the merge (a fresh
  or the untrained head in the merged file) is the commonest LoRA reward-model bug; the run
  checks the published folder against the adapter model (`merged_score_gap`).
- Policies: adapters on the policy's linear layers; the reference log-probs are the same model's
  with its adapters disabled (`peft_model.disable_adapter()`): no second copy of the weights.

Merging reads the state dict, not the modules, so one function serves a plain, a DDP and an FSDP2
model (whose shards are gathered first). A save writes the base weights and then overwrites each
LoRA layer's weight with its merged one in the file, so it never holds a merged copy of the model.

    >>> LoraSettings(rank=16).scale, LoraSettings(rank=16, alpha=16).scale
    (2.0, 1.0)
    >>> LoraSettings(rank=8, targets="q_proj,v_proj").target_modules()
    ['q_proj', 'v_proj']
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rm.model import device as devices

ALL_LINEAR = "all-linear"
ADAPTER_FOLDER = "adapter"
RECORD_PREFIX = "lora_"


class LoraError(ValueError):
    """LoRA cannot be set up as asked; the message names the flag to change."""


@dataclass
class LoraSettings:
    """`--lora-rank R` (0: full fine-tuning), `--lora-alpha A` (None: 2·R), `--lora-dropout P`,
    `--lora-targets NAMES|all-linear` (comma-separated module names, or every linear layer but the
    output head) and `--keep-adapter` (also save the adapter beside the merged weights)."""

    rank: int = 0
    alpha: float | None = None
    dropout: float = 0.0
    targets: str = ALL_LINEAR
    keep_adapter: bool = False

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """α/r, the factor on B·A."""
        return (self.alpha if self.alpha is not None else 2.0 * self.rank) / self.rank

    def target_modules(self) -> str | list[str]:
        if self.targets.strip() == ALL_LINEAR:
            return ALL_LINEAR
        return [name.strip() for name in self.targets.split(",") if name.strip()]

    def check(self) -> None:
        if self.rank < 0:
            raise LoraError(f"--lora-rank must be >= 0 (0: full fine-tuning), got {self.rank}")
        if not self.enabled:
            if self.keep_adapter:
                raise LoraError("--keep-adapter needs --lora-rank R: without LoRA there is no adapter")
            return
        if self.alpha is not None and self.alpha <= 0:
            raise LoraError(f"--lora-alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise LoraError(f"--lora-dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules():
            raise LoraError("--lora-targets names no module; give NAME[,NAME...] or all-linear")

    def as_record(self) -> dict:
        """Flat keys for train_config.json (lora_rank, lora_alpha, ...; keep_adapter as is)."""
        return {("keep_adapter" if f.name == "keep_adapter" else RECORD_PREFIX + f.name):
                getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_record(cls, record: dict) -> LoraSettings:
        """Inverse of `as_record`; missing keys keep their defaults.

        >>> LoraSettings.from_record(LoraSettings(rank=4, dropout=0.1).as_record())
        LoraSettings(rank=4, alpha=None, dropout=0.1, targets='all-linear', keep_adapter=False)
        """
        names = {f.name: f.name if f.name == "keep_adapter" else RECORD_PREFIX + f.name
                 for f in dataclasses.fields(cls)}
        return cls(**{name: record[key] for name, key in names.items() if key in record})


def add_adapters(hf_model, settings: LoraSettings, head: str | None = None, seed: int = 0):
    """Wrap `hf_model` in peft's LoRA, in place (its modules gain the adapters; the returned
    PeftModel holds the same modules). `head`: the output module trained in full (a reward
    model's score head), or None (a policy keeps its vocabulary projection frozen). The random A
    matrices are drawn from `seed`, so every rank of a torchrun job starts from the same ones
    (FSDP2, unlike DDP, does not broadcast rank 0's initial weights).

    Only linear layers take adapters: an embedding or convolution named in --lora-targets is
    refused, since the merge reads linear adapters only."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    settings.check()
    config = LoraConfig(r=settings.rank, lora_alpha=settings.rank * settings.scale,
                        lora_dropout=settings.dropout, target_modules=settings.target_modules(),
                        modules_to_save=[head] if head else None, bias="none")
    torch.manual_seed(seed)
    try:
        peft_model = get_peft_model(hf_model, config)
    except ValueError as exc:
        raise LoraError(f"--lora-targets {settings.targets!r}: {exc}") from None
    layers = [(n, m) for n, m in hf_model.named_modules() if isinstance(m, LoraLayer)]
    other = [n for n, m in layers if not isinstance(m, LoraLinear)]
    if other:
        raise LoraError(f"--lora-targets reaches non-linear modules {other[:3]}; name linear "
                        "layers only (or all-linear)")
    if head and getattr(hf_model, head, None) is None:
        raise LoraError(f"the model has no {head!r} head to train in full")
    return peft_model


def head_name(hf_model) -> str:
    """The sequence classifier's output module: `score` (decoders) or `classifier` (encoders)."""
    for name in ("score", "classifier"):
        if isinstance(getattr(hf_model, name, None), torch.nn.Module):
            return name
    raise LoraError(f"{type(hf_model).__name__} has no score or classifier head; LoRA reward "
                    "models need a sequence classifier")


def plain_state_dict(state: dict) -> dict:
    """A peft model's state dict under the plain model's names, unmerged: each LoRA layer's
    base weight as `<layer>.weight`, the trained copy of each `modules_to_save` head under the
    head's own name, the adapters and the heads' frozen originals left out (nothing copied)."""
    return {key.replace(".base_layer.", ".").replace(".modules_to_save.default.", "."): value
            for key, value in state.items() if ".lora_" not in key and ".original_module." not in key}


def merged_weight(state: dict, prefix: str, layer) -> torch.Tensor:
    """W + scale·B·A for the LoRA layer `prefix` of `state` (a peft model's state dict), in W's
    dtype, computed in fp32 with one temporary beside the result."""
    base = state[f"{prefix}.base_layer.weight"]
    a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]
    delta = (b.float() @ a.float()).mul_(layer.scaling["default"])
    merged = (delta.T if layer.fan_in_fan_out else delta).add_(base.float())
    return merged.to(base.dtype).detach()


def write_merged_weights(folder, state: dict, layers: dict) -> None:
    """Overwrite, in the safetensors files of `folder` (written from `plain_state_dict(state)`),
    each LoRA layer's base weight with its merged weight, one layer at a time: a merged weight has
    the base weight's name, dtype and shape, so it takes the base weight's bytes in place and the
    file stays the one `save_pretrained` laid out. At most one merged tensor lives at a time."""
    pending = {f"{prefix}.weight": prefix for prefix in layers}
    for path in sorted(Path(folder).glob("*.safetensors")):
        entries, data_start = _safetensors_entries(path)
        with open(path, "r+b") as f:
            for name in pending.keys() & entries.keys():
                prefix = pending.pop(name)
                merged = merged_weight(state, prefix, layers[prefix]).cpu().contiguous()
                start, end = entries[name]["data_offsets"]
                if merged.nbytes != end - start:
                    raise LoraError(f"{path}: {name} holds {end - start} bytes, its merged weight "
                                    f"{merged.nbytes}; report the model's architecture")
                f.seek(data_start + start)
                f.write(merged.reshape(-1).view(torch.uint8).numpy())
    if pending:
        raise LoraError(f"{folder}: the saved model has no {sorted(pending)[:3]} to merge into "
                        "(a layer tied to another is saved once); leave tied layers out of "
                        "--lora-targets")


def _safetensors_entries(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (tensor name → dtype, shape, data_offsets relative to the data)
    and where its data begins: an 8-byte little-endian header length, then the JSON header."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def trainable_state(module: torch.nn.Module) -> dict:
    """CPU copies of the trainable parameters (the adapters and the head: small), by name."""
    return {n: p.detach().to("cpu", copy=True) for n, p in module.named_parameters() if p.requires_grad}


def load_trainable_state(module: torch.nn.Module, state: dict) -> None:
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name in state:
                param.copy_(state[name].to(param.device))


def save_merged(peft_model, tokenizer, out_dir, record: dict, metrics: dict, keep_adapter: bool) -> None:
    """The model folder with merged weights (rm/model/reward_model.py: save_model), and peft's
    adapter folder in `adapter/` when `keep_adapter`. The folder is written with the base weights
    and then merged in place, layer by layer (`write_merged_weights`), so a save holds no merged
    copy of the model. Every rank calls it when the model is sharded (the gathers are
    collectives); rank 0 writes."""
    from peft.tuners.lora import LoraLayer

    from rm.model.reward_model import save_model

    hf_model = peft_model.get_base_model()
    state = devices.full_state_dict(hf_model)
    adapter = devices.full_state_dict(peft_model) if keep_adapter else None
    if devices.rank() != 0:
        return
    state = state if state is not None else hf_model.state_dict()
    save_model(hf_model, tokenizer, out_dir, {**record, "merged_lora": True}, metrics,
               state_dict=plain_state_dict(state))
    layers = {n: m for n, m in hf_model.named_modules() if isinstance(m, LoraLayer)}
    write_merged_weights(out_dir, state, layers)
    if keep_adapter:
        kwargs = {"state_dict": adapter} if adapter is not None else {}
        peft_model.save_pretrained(str(Path(out_dir) / ADAPTER_FOLDER), **kwargs)


def check_merged(net, folder, batch: dict, device) -> float:
    """Largest |r_adapter − r_merged| on `batch` (padded input_ids and attention_mask): `net` (a
    RewardNet with its adapters, on `device`, fp32) against the folder loaded the plain way
    (AutoModelForSequenceClassification, CPU, fp32). A head lost or left untrained in the merge
    moves the scores by about their own spread, a correct merge by float rounding: a gap above
    1e-4 + 1e-3 × (the largest |score|) raises LoraError."""
    from rm.model.reward_model import RewardNet, load_backbone

    hf_model, tokenizer = load_backbone(str(folder))
    plain = RewardNet(hf_model, tokenizer.sep_token_id).eval()
    was_training = net.training
    net.go_padded()  # as the plain model runs: fp32, padded, no bf16 attention kernel
    net.eval()
    with torch.no_grad():
        ours = net(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().cpu()
        theirs = plain(batch["input_ids"], batch["attention_mask"]).float()
    net.train(was_training)
    gap = float((ours - theirs).abs().max())
    if gap > 1e-4 + 1e-3 * float(ours.abs().max()):
        raise LoraError(f"{folder}: the merged weights score up to {gap:.3g} away from the adapter "
                        "model: the score head was lost or left untrained in the merge. Keep the "
                        "adapter with --keep-adapter and report the model's architecture")
    return gap
