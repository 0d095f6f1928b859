"""Small random LoRA adapters for a model, made and saved with PEFT (the layout the engine
reads), and PEFT's greedy output with one of them: the reference for LoRA equivalence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

B_SCALE = 0.2  # PEFT's random B is U(-0.5, 0.5)-ish: scaled so the model stays fluent


def make_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    seed: int,
    rank: int = 4,
    alpha: float = 8,
    targets: list[str] | str = ("q_proj", "v_proj", "down_proj"),  # type: ignore[assignment]
    rslora: bool = False,
) -> Path:
    """Save a random adapter (non-zero A and B, seeded) for the model in `model_dir` to
    `out_dir` with PEFT's `save_pretrained`; returns `out_dir`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets) if not isinstance(targets, str) else targets,
        use_rslora=rslora,
        init_lora_weights=False,
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(B_SCALE)
    peft_model.save_pretrained(str(out_dir))
    return out_dir


def peft_model(model_dir: Path, adapter_dir: Path | None) -> Any:
    """transformers' model in float32, with the adapter applied by PEFT (None: the base)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model


def peft_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of `prompt` by `model` (see `peft_model`), EOS suppressed."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
