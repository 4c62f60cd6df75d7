"""Reward models: any Hugging Face sequence classifier with one output, scored at the last real token.

r(x, y) is a scalar read from the final hidden state of the last non-padding token of the rendered
(prompt, response) sequence (Ouyang et al. 2022, §3.5) for decoders, and from the model's own
pooler ([CLS], right padding) for encoders. The last real token is found from the attention mask,
never from the pad id, so left padding, right padding and pad == eos all score the same
(transformers#35352, trl#2778). Decoders get explicit position ids, so left padding does not shift
absolute position embeddings (GPT-2).

A saved model is a folder: `model.safetensors` + `config.json`, the tokenizer, `train_config.json`
(model id, base model, snapshot, hyper-parameters, max_length) and `metrics.json`. Loading goes
through `from_pretrained(..., use_safetensors=True)`: pickle is never read.

    >>> import tempfile
    >>> folder = build_tiny_reward_model(tempfile.mkdtemp(), ["a small example text"] * 8, vocab_size=300)
    >>> rm = RewardModel.load(folder, device="cpu")
    >>> len(rm.score(["hi", "hi"], ["there", "again"]))
    2
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from rm.model import device as devices
from rm.model import padding_free
from rm.model.padding import last_token_index, pad_batch
from rm.model.prompt_cache import PromptCache
from rm.model.tiny_configs import tiny_config
from rm.model.tokenizer import build_bpe_tokenizer, encode_many
from rm.model.weights import share_weights

TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.json"


class RewardNet(torch.nn.Module):
    """A Hugging Face sequence classifier as `forward(input_ids, attention_mask) -> rewards [B]`.

    One module, so DistributedDataParallel sees the whole reward computation in its forward.
    """

    def __init__(self, hf_model, sep_token_id: int | None = None):
        super().__init__()
        self.hf = hf_model
        self.is_decoder = isinstance(getattr(hf_model, "score", None), torch.nn.Linear)
        types = getattr(hf_model.config, "type_vocab_size", 0) or 0
        self.sep_token_id = sep_token_id if types > 1 else None
        self.padding_free = False  # set by `go_padding_free`
        self._padded_attention = hf_model.config._attn_implementation

    def go_padding_free(self, device: torch.device) -> bool:
        """Forwards of padded batches unpad them and run packed (rm/model/padding_free.py) when the
        model and `device` allow; says so and keeps the padded path when not."""
        self.padding_free = self.is_decoder and padding_free.enable(self.hf, device)
        return self.padding_free

    def go_padded(self) -> None:
        """Back to the padded forward with the attention the model was loaded with."""
        if self.padding_free:
            self.hf.set_attn_implementation(self._padded_attention)
            self.padding_free = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.padding_free:
            return self.packed_rewards(padding_free.unpad(input_ids, attention_mask)[0])
        if self.is_decoder:
            return self._decoder_rewards(input_ids, attention_mask)
        return self._encoder_rewards(input_ids, attention_mask)

    def packed_rewards(self, rows: padding_free.PackedRows) -> torch.Tensor:
        """Rewards of packed rows: one padding-free forward, the head at each row's last token."""
        hidden = padding_free.decoder_hidden(self.hf.base_model, rows)
        return self._head(hidden[0, rows.last])

    def _decoder_rewards(self, input_ids, attention_mask):
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.hf.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=positions, use_cache=False)
        return self._head_at(out[0], last_token_index(attention_mask))

    def causal_rewards(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Rewards of right-padded rows of a causal decoder, with no attention mask: a token attends
        only to earlier positions, so the padding after a row's last token never reaches it, and
        attention takes its causal kernel instead of building and applying a [rows, 1, T, T] mask
        (`RewardModel` checks on probe rows that the model is causal before using this)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        hidden = self.hf.base_model(input_ids=input_ids, position_ids=positions, use_cache=False)[0]
        return self._head_at(hidden, lengths - 1)

    def _head_at(self, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The score head on each padded row's hidden state at position `last[row]`."""
        return self._head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    def _head(self, states: torch.Tensor) -> torch.Tensor:
        """The decoder's score head on one final hidden state per row."""
        head = self.hf.score
        return head(states.to(head.weight.dtype)).squeeze(-1).float()

    def _encoder_rewards(self, input_ids, attention_mask):
        kwargs = {}
        if self.sep_token_id is not None:  # segment B starts after the first [SEP]
            sep = (input_ids == self.sep_token_id).long()
            kwargs["token_type_ids"] = ((sep.cumsum(-1) - sep) > 0).long() * attention_mask
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.logits.squeeze(-1).float()

    @contextlib.contextmanager
    def head_inputs(self):
        """Within it, forwards append to the yielded list the final hidden state each reward is read
        from [B, hidden], as the score head receives it (an encoder's [CLS] position where its head
        takes the whole sequence): a hook on the head, so no second pass and no other path."""
        head = self.hf.score if self.is_decoder else getattr(self.hf, "classifier", None)
        if head is None:
            raise ValueError(f"{type(self.hf).__name__} has no `score` or `classifier` head whose "
                             "input is the hidden state; its latent statistics cannot be read")
        captured: list[torch.Tensor] = []

        def keep(_module, args):
            states = args[0]
            captured.append(states[:, 0] if states.dim() == 3 else states)

        handle = head.register_forward_pre_hook(keep)
        try:
            yield captured
        finally:
            handle.remove()


class RewardModel:
    """A loaded reward model: encode (prompt, response) exactly as trained, score in batches."""

    def __init__(self, hf_model, tokenizer, path: str = "", model_id: str = "",
                 device: str | torch.device = "cpu", max_length: int | None = None):
        self.device = devices.resolve(device) if isinstance(device, str) else device
        self.tokenizer = tokenizer
        _ensure_pad(hf_model, tokenizer)
        self.net = RewardNet(hf_model, tokenizer.sep_token_id).to(self.device).eval()
        self.path, self.model_id = str(path), model_id
        self.prompts = PromptCache()  # prompt parts and ids: n responses per prompt in GRPO
        self.max_length = fit_max_length(max_length, hf_model)
        # encoders read [CLS] at position 0 and use absolute positions: they must pad on the right
        self.padding_side = tokenizer.padding_side if self.net.is_decoder else "right"
        self._layout: str | None = None  # how scoring lays out rows: _choose_layout()

    @classmethod
    def load(cls, path, device="auto") -> RewardModel:
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{path} is not a model folder (no config.json); pass a folder written "
                             "by `bradley train rm` or `bradley models prepare`")
        hf_model, tokenizer = load_backbone(str(folder))
        config = read_json(folder / TRAIN_CONFIG)
        return cls(hf_model, tokenizer, str(folder), config.get("model_id", folder.name),
                   device, config.get("max_length"))

    def encode(self, prompts: list, responses: list[str]) -> list[list[int]]:
        """Token ids of exactly what is scored (chat template when the tokenizer has one)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; pass one each")
        return encode_many(self.tokenizer, prompts, responses, self.max_length, self.prompts)

    @property
    def layout(self) -> str:
        """How forwards lay out their rows, decided at the first scoring (`_choose_layout`):
        "packed" (padding-free, on CUDA: rm/model/padding_free.py), "unmasked" (right-padded, no
        mask: causal decoders, whose attention can then take its causal kernel) or "masked"
        (padded with the mask, as trained)."""
        if self._layout is None:
            self._layout = self._choose_layout()
        return self._layout

    @property
    def scores_without_mask(self) -> bool | None:
        """Whether forwards leave the attention mask out; None before the first scoring."""
        return None if self._layout is None else self._layout != "masked"

    def score_encoded(self, ids: list[list[int]], on_states=None):
        """One forward over the batch; each score is independent of the rest of the batch. With
        `on_states`: (scores, on_states(the final hidden states [B, hidden] the scores were read
        from)), called on the device within the same forward (RewardNet.head_inputs)."""
        if not ids:
            return [] if on_states is None else ([], [])
        if any(len(seq) == 0 for seq in ids):
            raise ValueError("cannot score an empty token sequence; encode a prompt and response first")
        layout = self.layout
        with torch.inference_mode(), devices.autocast(self.device):
            if on_states is None:
                return self._rewards(ids, layout).float().cpu().tolist()
            with self.net.head_inputs() as states:
                rewards = self._rewards(ids, layout)
            return rewards.float().cpu().tolist(), on_states(torch.cat(states))

    def _rewards(self, ids: list[list[int]], layout: str) -> torch.Tensor:
        """One forward in `layout` (see `layout`)."""
        if layout == "packed":
            return self.net.packed_rewards(padding_free.pack_rows(ids, self.device))
        causal = layout == "unmasked"
        batch = pad_batch(ids, self.tokenizer.pad_token_id, "right" if causal else self.padding_side)
        input_ids = batch["input_ids"].to(self.device)
        if causal:  # the rows' lengths are known: no mask to copy to the device and sum there
            lengths = torch.tensor([len(row) for row in ids], device=self.device)
            return self.net.causal_rewards(input_ids, lengths)
        return self.net(input_ids, batch["attention_mask"].to(self.device))

    def _choose_layout(self) -> str:
        """Packed when the model and device allow it and its probe passes, else unmasked when its
        probe passes, else masked. Encoders and configs that attend both ways keep the mask."""
        config = self.net.hf.config
        if not self.net.is_decoder or getattr(config, "use_bidirectional_attention", False):
            return "masked"
        rows = self._probe_rows()
        alone = self._alone(rows)
        if alone is None:
            return "masked"
        if self.net.go_padding_free(self.device):
            if self._probe(rows, alone, "packed"):
                return "packed"
            self.net.go_padded()
        return "unmasked" if self._probe(rows, alone, "unmasked") else "masked"

    def _probe_rows(self) -> list[list[int]]:
        pad, vocab = self.tokenizer.pad_token_id, self.net.hf.get_input_embeddings().num_embeddings
        tokens = [t for t in range(1, min(vocab, 64)) if t != pad]
        return [tokens[:5], tokens[:12][::-1]]

    def _alone(self, rows: list[list[int]]) -> torch.Tensor | None:
        """Each probe row's score alone (unpadded, masked, as trained); None when it cannot score."""
        try:
            with torch.inference_mode(), devices.autocast(self.device):
                return torch.cat([self._rewards([row], "masked") for row in rows]).float()
        except Exception:  # noqa: BLE001 - a model that cannot score so is left to fail later
            return None

    def _probe(self, rows: list[list[int]], alone: torch.Tensor, layout: str) -> bool:
        """Whether the probe rows scored together in `layout` score as each does alone, as a
        causal decoder's do. One small forward; any failure says no. Tolerance: 1e-3 + 1% of a
        score + 5% of how far the two rows' scores lie apart. Attending to the 7 pads after the
        shorter row, or from the wrong positions, moves a score by about as much as another input
        does; bf16 rounding on a GPU moves it far less."""
        try:
            with torch.inference_mode(), devices.autocast(self.device):
                together = self._rewards(rows, layout).float()
        except Exception:  # noqa: BLE001 - a model that cannot score so keeps the next layout
            return False
        allowed = 1e-3 + 1e-2 * alone.abs() + 0.05 * (alone[0] - alone[1]).abs()
        return bool(((together - alone).abs() <= allowed).all())

    def score(self, prompts: list, responses: list[str], batch_size: int = 32) -> list[float]:
        """Scores in input order; batches are formed from length-sorted sequences to cut padding."""
        ids = self.encode(prompts, responses)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        scores = [0.0] * len(ids)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            for i, value in zip(chunk, self.score_encoded([ids[i] for i in chunk]), strict=False):
                scores[i] = value
        return scores

    def save(self, out_dir, train_config: dict, metrics: dict) -> Path:
        return save_model(devices.unwrap(self.net).hf, self.tokenizer, out_dir, train_config, metrics)


def _ensure_pad(hf_model, tokenizer) -> None:
    """Decoders often ship without a pad token: pad with eos (safe, the mask decides what is real)."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    hf_model.config.pad_token_id = tokenizer.pad_token_id


def load_backbone(name_or_path: str):
    """(AutoModelForSequenceClassification with num_labels=1, tokenizer); safetensors only."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # a fresh head on a base model is expected, not a warning
    logging.disable_progress_bar()  # per-shard bars drown the training progress bar
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        hf_model = AutoModelForSequenceClassification.from_pretrained(
            name_or_path, num_labels=1, use_safetensors=True)
    except OSError as exc:
        raise ValueError(f"cannot load base model {name_or_path!r}: {exc}. Use a local folder, "
                         "`--base-model tiny`, or `bradley models prepare minilm`") from None
    finally:
        logging.set_verbosity(verbosity)
    _ensure_pad(hf_model, tokenizer)
    return hf_model, tokenizer


def load_causal_lm(name_or_path: str):
    """(AutoModelForCausalLM, tokenizer) from a folder or hub id; safetensors only, pad = eos if unset."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load base model {name_or_path!r} as a causal LM: {exc}. Use a local "
                         "folder, `--base-model tiny`, or `bradley models prepare smollm2`") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def save_model(hf_model, tokenizer, out_dir, train_config: dict, metrics: dict,
               state_dict: dict | None = None) -> Path:
    """The model folder. `state_dict`: the weights to write instead of the model's own (merged
    LoRA weights, rm/train/lora.py), already gathered."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    out = Path(out_dir)
    # FSDP: every rank gathers the whole weights (a collective), rank 0 alone writes them
    state = state_dict if state_dict is not None else devices.full_state_dict(hf_model)
    if state is not None and devices.rank() != 0:
        return out
    out.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(out, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / TRAIN_CONFIG).write_text(json.dumps(train_config, indent=2, default=str))
    (out / METRICS).write_text(json.dumps(metrics, indent=2, default=str))
    share_weights(out)
    return out


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


# --- tiny models from a config (tests, demos, CI, benchmarks) ---------------------------------


def _tiny_tokenizer(texts, vocab_size, arch, pad_equals_eos, chat_template=True):
    tokenizer = build_bpe_tokenizer(texts, vocab_size, chat_template=chat_template and arch != "bert",
                                    pad_equals_eos=pad_equals_eos)
    if arch == "bert":  # sentence-pair encoding needs [CLS]/[SEP]; bos/eos play those parts
        from tokenizers import processors

        tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
            special_tokens=[("<s>", tokenizer.bos_token_id), ("</s>", tokenizer.eos_token_id)])
        tokenizer.cls_token, tokenizer.sep_token = "<s>", "</s>"
    return tokenizer


def build_tiny_reward_model(out_dir, texts: list[str], hidden: int = 64, layers: int = 2,
                            vocab_size: int = 512, padding_side: str = "right", seed: int = 0,
                            arch: str = "llama", pad_equals_eos: bool = False,
                            chat_template: bool = True) -> Path:
    """A small AutoModelForSequenceClassification(num_labels=1) from a config, random weights, with a
    byte-level BPE trained on `texts`, saved with save_pretrained (safetensors) into `out_dir`."""
    from transformers import AutoModelForSequenceClassification

    tokenizer = _tiny_tokenizer(texts, vocab_size, arch, pad_equals_eos, chat_template)
    tokenizer.padding_side = padding_side
    config = tiny_config(tokenizer, arch, hidden, layers)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    return save_model(model, tokenizer, out_dir, {"model_id": Path(out_dir).name, "base_model":
                                                  f"tiny-{arch}", "seed": seed}, {})


def build_tiny_causal_lm(out_dir, texts: list[str], hidden: int = 64, layers: int = 2,
                         vocab_size: int = 512, padding_side: str = "right", seed: int = 0,
                         arch: str = "llama", pad_equals_eos: bool = False) -> Path:
    """The same tiny recipe as a causal LM (LlamaForCausalLM by default), for policy training."""
    from transformers import AutoModelForCausalLM

    if arch == "bert":
        raise ValueError("a causal LM needs a decoder architecture: llama, qwen2 or gpt2")
    tokenizer = _tiny_tokenizer(texts, vocab_size, arch, pad_equals_eos)
    tokenizer.padding_side = padding_side
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(tokenizer, arch, hidden, layers))
    return save_model(model, tokenizer, out_dir, {"model_id": Path(out_dir).name, "base_model":
                                                  f"tiny-{arch}", "seed": seed}, {})


def fit_max_length(max_length: int | None, hf_model) -> int | None:
    """--max-length capped at the model's position table (longer inputs would index past it)."""
    config = hf_model.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is None:
        return max_length
    return min(max_length, limit) if max_length else limit


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
