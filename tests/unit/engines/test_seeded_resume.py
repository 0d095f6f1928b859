"""A seeded request resumed elsewhere draws what it would have drawn on one worker: the
draw of each output position depends on the seed and the position alone. A migrated
request, and every decode leg after a remote prefill, started its generator over at the
seed, so its later tokens repeated the draws of its first ones."""

from __future__ import annotations

from pathlib import Path

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, SamplingParams

PROMPT = [5, 17, 42, 7, 99, 3, 250, 11]
NUM_TOKENS = 12


def generate(model_dir: Path, carried: list[int], seed: int) -> list[int]:
    """The tokens after `carried` on a fresh engine (a worker that never saw the request)."""
    core = EngineCore(NativeEngineConfig(model_dir=model_dir, dtype="float32"))
    params = SamplingParams(
        max_tokens=NUM_TOKENS - len(carried), temperature=1.0, seed=seed, ignore_eos=True
    )
    core.add_request(
        EngineRequest(
            request_id="r", prompt_token_ids=PROMPT, output_token_ids=carried, sampling=params
        )
    )
    out: list[int] = []
    while core.has_work():
        out.extend(t for o in core.step() for t in o.new_token_ids)
    return out


def test_a_seeded_request_resumed_on_another_worker_draws_the_same_tokens(
    tiny_llama_dir: Path,
) -> None:
    whole = generate(tiny_llama_dir, [], seed=7)
    assert len(whole) == NUM_TOKENS
    assert len(set(whole)) > 3  # a sampled sequence, not the argmax over and over
    for resume_at in (1, 5, 11):
        assert generate(tiny_llama_dir, whole[:resume_at], seed=7) == whole[resume_at:]
    assert generate(tiny_llama_dir, [], seed=8) != whole
