"""The remote-vs-local prefill decision (router.prefill_decision): a table of cases with their
exact decisions, the boundaries included, and when the cached prefix is (not) looked up."""

from __future__ import annotations

import pytest

from armature.config import DisaggConfig
from armature.errors import ConfigError
from armature.router.prefill_decision import PrefillDecision, decide_prefill

D = PrefillDecision
BS = 16
COND = DisaggConfig(max_local_prefill_tokens=100, max_prefill_queue_tokens=500)
ENFORCE = DisaggConfig(
    max_local_prefill_tokens=100, max_prefill_queue_tokens=500, enforce_disagg=True
)

# (name, prompt tokens, decode pool's cached blocks, in-flight tokens per live prefill worker,
#  config, decision)
CASES = [
    ("no prefill worker", 1000, 0, [], COND, D.LOCAL_NO_PREFILL_WORKER),
    ("no prefill worker, enforced", 1000, 0, [], ENFORCE, D.LOCAL_NO_PREFILL_WORKER),
    ("enforced, short prompt", 10, 0, [0], ENFORCE, D.REMOTE_ENFORCED),
    ("enforced, every worker saturated", 1000, 0, [500, 900], ENFORCE, D.REMOTE_ENFORCED),
    ("long uncached prompt, idle pool", 1000, 0, [0, 0], COND, D.REMOTE),
    ("uncached one below the threshold", 99, 0, [0], COND, D.LOCAL_SHORT_PREFILL),
    ("uncached == threshold", 100, 0, [0], COND, D.REMOTE),
    ("cached prefix leaves 99 uncached", 32 * BS + 99, 32, [0], COND, D.LOCAL_SHORT_PREFILL),
    ("cached prefix leaves exactly 100", 32 * BS + 100, 32, [0], COND, D.REMOTE),
    ("fully cached prompt", 4 * BS, 4, [0], COND, D.LOCAL_SHORT_PREFILL),
    (
        "threshold 0: even a cached prompt",
        4 * BS,
        4,
        [0],
        DisaggConfig(max_local_prefill_tokens=0, max_prefill_queue_tokens=500),
        D.REMOTE,
    ),
    ("one worker below the queue limit", 1000, 0, [500, 499], COND, D.REMOTE),
    ("every worker at the queue limit", 1000, 0, [500, 500], COND, D.LOCAL_PREFILL_SATURATED),
    ("every worker past the queue limit", 1000, 0, [501, 9000], COND, D.LOCAL_PREFILL_SATURATED),
    ("one worker, at the limit", 1000, 0, [500], COND, D.LOCAL_PREFILL_SATURATED),
    ("short prompt on a saturated pool", 50, 0, [500], COND, D.LOCAL_SHORT_PREFILL),
]


@pytest.mark.parametrize(
    ("tokens", "cached", "queues", "config", "decision"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decisions(
    tokens: int, cached: int, queues: list[int], config: DisaggConfig, decision: PrefillDecision
) -> None:
    got = decide_prefill(
        num_prompt_tokens=tokens,
        get_num_cached_blocks=lambda: cached,
        block_size=BS,
        prefill_queue_tokens=queues,
        config=config,
    )
    assert got is decision
    assert got.is_remote == decision.name.startswith("REMOTE")


def test_the_cached_prefix_is_looked_up_only_when_it_matters() -> None:
    lookups: list[int] = []

    def get_num_cached_blocks() -> int:
        lookups.append(1)
        return 0

    def decide(queues: list[int], config: DisaggConfig) -> PrefillDecision:
        return decide_prefill(
            num_prompt_tokens=1000,
            get_num_cached_blocks=get_num_cached_blocks,
            block_size=BS,
            prefill_queue_tokens=queues,
            config=config,
        )

    assert decide([], COND) is D.LOCAL_NO_PREFILL_WORKER
    assert decide([0], ENFORCE) is D.REMOTE_ENFORCED
    assert lookups == []
    assert decide([500], COND) is D.LOCAL_PREFILL_SATURATED
    assert lookups == [1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_local_prefill_tokens": -1}, "max_local_prefill_tokens"),
        ({"max_prefill_queue_tokens": 0}, "max_prefill_queue_tokens"),
    ],
)
def test_config_refuses_settings_that_cannot_work(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DisaggConfig(**kwargs)  # type: ignore[arg-type]
