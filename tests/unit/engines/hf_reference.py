"""Greedy reference outputs from Hugging Face transformers, and the near-tie rule.

Batching legitimately changes float32 rounding, so a divergence from transformers is accepted
only where transformers itself sees a near-tie: the two candidate tokens are its top 2 and their
logits differ by less than NEAR_TIE_LOGIT_MARGIN. Anything else is a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

NEAR_TIE_LOGIT_MARGIN = 2e-3


class HfReference:
    def __init__(self, model_dir: Path, model: Any = None):
        """The model in `model_dir` in float32, or `model` (e.g. wrapped by PEFT) itself."""
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model = model
        self.model.eval()
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation with EOS suppressed (min_new_tokens = max_new_tokens)."""
        key = (tuple(prompt), max_new_tokens)
        if key not in self._cache:
            self._cache[key] = self.greedy_processed(prompt, max_new_tokens, [])[0]
        return self._cache[key]

    def greedy_processed(
        self, prompt: list[int], max_new_tokens: int, processors: list[Any]
    ) -> tuple[list[int], torch.Tensor]:
        """Greedy continuation through transformers `processors` (LogitsProcessor), EOS
        suppressed: (tokens, the processed scores of each step [max_new_tokens, vocab])."""
        from transformers import LogitsProcessorList

        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
                logits_processor=LogitsProcessorList(processors),
                output_scores=True,
                return_dict_in_generate=True,
            )
        return out.sequences[0, len(prompt) :].tolist(), torch.stack(out.scores)[:, 0]

    def assert_matches(self, prompt: list[int], ours: list[int], max_new_tokens: int) -> bool:
        """Assert `ours` equals the greedy reference, up to a proven near-tie. Returns True
        for an exact match, False for an accepted near-tie divergence."""
        ref = self.greedy(prompt, max_new_tokens)
        assert len(ours) == len(ref) == max_new_tokens
        if ours == ref:
            return True
        d = next(i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b)
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + ref[:d]])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        margin = float(top.values[0] - top.values[1])
        assert set(top.indices.tolist()) == {ours[d], ref[d]}, (
            f"diverged at token {d}: ours {ours[d]}, transformers {ref[d]}, which are not "
            f"transformers' top 2 {top.indices.tolist()}"
        )
        assert margin < NEAR_TIE_LOGIT_MARGIN, (
            f"diverged at token {d} with a top-2 logit margin of {margin:.2e}: not a near-tie"
        )
        return False
