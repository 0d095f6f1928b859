"""The frontend judges each finished request against its SLO targets (--slo-ttft-ms,
--slo-itl-ms): `armature_slo_requests_total{result}` counts it met or missed, and
`armature_slo_target_seconds` says against what."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from frontend_fakes import IdleEngine
from tokenizers import Tokenizer

from armature.config import SloConfig
from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.generation import Usage, delta_batches
from armature.frontend.metrics import FrontendMetrics
from armature.protocols.engine import EngineOutput, FinishReason

HELLO_IDS = [19556, 905, 17, 1073]  # 'Hello' ' world' '!' ' How'


def target(metrics: FrontendMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value("armature_slo_target_seconds", {"target": name})


def judged(metrics: FrontendMetrics) -> tuple[float | None, float | None]:
    def value(result: str) -> float | None:
        return metrics.registry.get_sample_value("armature_slo_requests_total", {"result": result})

    return value("met"), value("missed")


def test_the_rule_on_ttft_and_mean_itl() -> None:
    metrics = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig(ttft_ms=500, itl_ms=30))
    metrics.judge(0.1, 0.02)  # met
    metrics.judge(0.5, 0.03)  # met: at the targets
    metrics.judge(0.6, 0.01)  # TTFT missed
    metrics.judge(0.1, 0.031)  # ITL missed
    metrics.judge(0.1, None)  # one token: by its TTFT
    metrics.judge(None, None)  # no token at all
    assert judged(metrics) == (3.0, 3.0)
    assert (target(metrics, "ttft"), target(metrics, "itl")) == (0.5, 0.03)


def test_one_target_alone_judges_by_it_and_none_judges_nothing() -> None:
    ttft_only = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig(ttft_ms=500))
    ttft_only.judge(0.1, 10.0)  # any ITL
    assert judged(ttft_only) == (1.0, None)
    assert (
        ttft_only.registry.get_sample_value("armature_slo_target_seconds", {"target": "itl"})
        is None
    )
    plain = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig())
    plain.judge(0.1, 0.01)
    assert judged(plain) == (None, None)
    assert (
        plain.registry.get_sample_value("armature_slo_target_seconds", {"target": "ttft"}) is None
    )


async def outputs(*batches: list[int]) -> AsyncGenerator[EngineOutput, None]:
    for i, tokens in enumerate(batches):
        yield EngineOutput(
            request_id="r",
            new_token_ids=tokens,
            finish_reason=FinishReason.LENGTH if i == len(batches) - 1 else None,
            num_prompt_tokens=3 if i == 0 else 0,
        )


@pytest.fixture
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


async def stream(tokenizer: Tokenizer, metrics: FrontendMetrics, *, read_all: bool) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer, [1, 2, 3], stop=[])
    deltas = delta_batches(
        outputs(HELLO_IDS[:1], HELLO_IDS[1:3], HELLO_IDS[3:]), 3, detokenizer, Usage(), metrics
    )
    async for batch in deltas:
        if not read_all or batch[-1].finish_reason is not None:
            break  # a client that stops reading (the last batch: as a caller may)
    await deltas.aclose()


async def test_a_finished_stream_is_judged_once_and_an_abandoned_one_never(
    tokenizer: Tokenizer,
) -> None:
    # a minute for each: any machine meets them; a nanosecond: none does
    generous = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig(ttft_ms=60_000))
    await stream(tokenizer, generous, read_all=True)
    assert judged(generous) == (1.0, None)
    strict = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig(ttft_ms=1e-6))
    await stream(tokenizer, strict, read_all=True)
    assert judged(strict) == (None, 1.0)
    abandoned = FrontendMetrics("m", IdleEngine().get_load, slo=SloConfig(ttft_ms=60_000))
    await stream(tokenizer, abandoned, read_all=False)  # gone after the first batch
    assert judged(abandoned) == (None, None)
