"""Sampling text from a local causal LM: the RLAIF recipe's policy samples (`bradley label --generate`)
and Constitutional AI's critiques and revisions (`--revise`).

A prompt is rendered through the tokenizer's chat template when it has one (one user turn plus the
generation prompt), else used as plain text. Sampling is seeded; temperature 0 means greedy.
"""

from __future__ import annotations

import torch

from rm.model.padding import pad_batch


def render(tokenizer, prompt: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(prompt)["input_ids"]


@torch.inference_mode()
def sample(model, tokenizer, prompts: list[str], n: int = 1, temperature: float = 0.8,
           max_new_tokens: int = 64, seed: int = 0, device: str = "cpu") -> list[list[str]]:
    """`n` completions per prompt (left-padded batch, one generate call per prompt)."""
    torch.manual_seed(seed)
    out = []
    for prompt in prompts:
        ids = render(tokenizer, prompt)
        batch = pad_batch([ids] * n, tokenizer.pad_token_id, "left")
        options = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens,
                   "pad_token_id": tokenizer.pad_token_id}
        if temperature > 0:
            options["temperature"] = temperature
        generated = model.generate(input_ids=batch["input_ids"].to(device),
                                   attention_mask=batch["attention_mask"].to(device), **options)
        out.append([tokenizer.decode(row[len(batch["input_ids"][0]):], skip_special_tokens=True).strip()
                    for row in generated])
    return out
