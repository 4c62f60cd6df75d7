"""Configs of small models built from scratch (tests, demos, CI, benchmarks): the architectures
bradley scores and trains, sized to a tokenizer, random weights (rm/model/reward_model.py builds and saves them).

    >>> from rm.model.tokenizer import build_bpe_tokenizer
    >>> tok = build_bpe_tokenizer(["hello world"] * 20, vocab_size=300)
    >>> config = tiny_config(tok, "qwen2")
    >>> (config.model_type, config.hidden_size, config.num_hidden_layers, config.vocab_size == len(tok))
    ('qwen2', 64, 2, True)
"""

from __future__ import annotations


def _llama(vocab, hidden, layers, specials):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32),
                       max_position_embeddings=2048, tie_word_embeddings=False, **specials)


def _qwen2(vocab, hidden, layers, specials):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32),
                       num_key_value_heads=max(1, hidden // 32), max_position_embeddings=2048,
                       tie_word_embeddings=False, **specials)


def _gpt2(vocab, hidden, layers, specials):
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=max(1, hidden // 32),
                      n_positions=2048, **specials)


def _bert(vocab, hidden, layers, specials):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 32), intermediate_size=4 * hidden,
                      max_position_embeddings=2048, pad_token_id=specials["pad_token_id"])


ARCHITECTURES = {"llama": _llama, "qwen2": _qwen2, "gpt2": _gpt2, "bert": _bert}


def tiny_config(tokenizer, arch: str = "llama", hidden: int = 64, layers: int = 2):
    """A small config of `arch` sized to the tokenizer (hidden 64, 2 layers: ~0.16M parameters)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    specials = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id}
    return ARCHITECTURES[arch](len(tokenizer), hidden, layers, specials)
