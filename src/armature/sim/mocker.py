"""The mocker: the native engine's real scheduler and block pool with a timing model in place
of the model (STYLE: the simulator runs the real code).

`MockerRunner` fills the `ModelRunner` seam: each step it advances a clock by the timing
model's step time and returns a seeded token per request (no logits, no sampling: sampling
parameters, penalties, logit bias and logprobs are accepted and not simulated, since the tokens
are synthetic anyway). Tokens depend only on (seed, request id, position), so a request gets
the same tokens whatever it is batched with. EOS is never produced: requests end at
max_tokens (or the context limit). LoRA adapters are served by name only (`read_lora`): an
adapter's salt, its name, seeds its requests' block hashes, so routing and replay see them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import xxhash

try:  # the same tokens as xxhash's, in one call per request and step (armature.kv._native)
    from armature.kv import _native
except ImportError:  # pragma: no cover - built without a C compiler
    _native = None  # type: ignore[assignment]

from armature.config import KvTierConfig
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore, TierBuilder
from armature.engines.native.decode_run import NativeDecode
from armature.engines.native.lora_set import ServedLora, served_lora_name
from armature.engines.native.scheduler import ScheduledChunk
from armature.kv.block_pool import BlockPool
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictionObserver
from armature.model.arch import ModelArch, read_arch
from armature.protocols.kv_transfer import KvLayout
from armature.sim.clock import Clock, VirtualClock, WallClock
from armature.sim.modeled_tiers import build_modeled_tiers
from armature.sim.timing import PolynomialTiming, StepWork, TimingModel
from armature.tiers.api import KvTiers
from armature.transfer.blocks import KvBlockStore, ModeledKvStore

__all__ = [
    "Clock",
    "MockerRunner",
    "VirtualClock",
    "WallClock",
    "build_mocker_core",
    "simulated_arch",
]


DEFAULT_TRANSFER_BANDWIDTH_BYTES_S = 25e9  # an RDMA-class link between prefill and decode
_MAX_NATIVE_PREFIX_BYTES = 1024  # request ids longer than this take the Python path


def modeled_layout(arch: ModelArch, block_size: int, dtype: str = "bfloat16") -> KvLayout:
    return KvLayout(
        num_layers=arch.num_layers,
        block_size=block_size,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        dtype=dtype,
    )


class MockerRunner:
    def __init__(
        self,
        arch: ModelArch,
        timing: TimingModel,
        clock: Clock,
        seed: int = 0,
        *,
        block_size: int = 16,
        transfer_bandwidth_bytes_s: float = DEFAULT_TRANSFER_BANDWIDTH_BYTES_S,
        speedup_ratio: float = 1.0,
        native_decode: bool = True,
    ):
        self.arch = arch
        self.kv_store: KvBlockStore = ModeledKvStore(
            modeled_layout(arch, block_size), transfer_bandwidth_bytes_s, speedup_ratio
        )
        self.timing = timing
        self.clock = clock
        # the token hash takes an unsigned 64-bit seed: a negative one (the CLI's seeds are
        # signed 64-bit) is its two's complement
        self.seed = seed % 2**64
        self.kv_utilization: Callable[[], float] = lambda: 0.0  # use_pool_utilization wires it
        self._utilization_pool: BlockPool | None = None
        self.last_step_ms = 0.0  # the last batch's simulated time
        self.num_batches = 0  # batches run (an engine step with nothing to run runs none)
        # the timing model's last decode step: (requests, KV utilization, context) -> ms
        self._decode_key: tuple[int, float, int] | None = None
        self._decode_ms = 0.0
        # decode runs step natively where they can (False: the Python loop, their reference)
        self.native_decode = native_decode

    def token_for(self, request_id: str, position: int) -> int:
        digest = xxhash.xxh3_64_intdigest(f"{request_id}/{position}".encode(), seed=self.seed)
        token = digest % self.arch.vocab_size
        while token in self.arch.eos_token_ids:
            token = (token + 1) % self.arch.vocab_size
        return token

    def read_lora(self, name: str, path: Path) -> ServedLora:
        """The mocker serves adapters by name only (their salt changes the block hashes, so
        routing and replay see them); `path` is not read."""
        return served_lora_name(name)

    def execute(self, chunks: list[ScheduledChunk]) -> list[int]:
        decodes = [c for c in chunks if c.is_decode]
        prefills = [c for c in chunks if not c.is_decode]
        work = StepWork(
            num_prefill_tokens=sum(c.num_tokens for c in prefills),
            num_decode_requests=len(decodes),
            kv_utilization=self.kv_utilization(),
            num_decode_kv_tokens=sum(c.start_pos + c.num_tokens for c in decodes),
            num_prefill_context_pairs=sum(c.start_pos * c.num_tokens for c in prefills),
        )
        self.advance(self.timing.step_ms(work))
        return [
            self.token_for(c.request.request_id, c.start_pos + c.num_tokens)
            for c in chunks
            if c.completes_sequence
        ]

    # the decode fast path's runner (`engines.native.decode_run.DecodeRunner`)
    @property
    def decode_uses_context(self) -> bool:
        return self.timing.decode_uses_context

    def get_decode_step_ms(self, num_requests: int, num_kv_tokens: int) -> float:
        """The timing model's decode step, remembered for the last inputs it reads (a decode
        run asks once per stretch of steps, mostly with what it asked the time before)."""
        utilization = self.kv_utilization()
        context = num_kv_tokens if self.timing.decode_uses_context else 0
        key = (num_requests, utilization, context)
        if key != self._decode_key:
            work = StepWork(0, num_requests, utilization, num_kv_tokens)
            self._decode_key, self._decode_ms = key, self.timing.step_ms(work)
        return self._decode_ms

    def advance(self, step_ms: float) -> None:
        self.last_step_ms = step_ms
        self.num_batches += 1
        self.clock.advance(step_ms / 1000.0)

    def advance_steps(self, step_ms: float, num_steps: int) -> Sequence[float]:
        self.last_step_ms = step_ms
        self.num_batches += num_steps
        return self.clock.advance_steps(step_ms / 1000.0, num_steps)

    def get_native_decode(self) -> NativeDecode | None:
        """What a decode run needs to run its stretches natively (`PoolCore.run_decodes`: the
        clock's seconds added there, the tokens made there as `get_tokens` makes them): the
        virtual clock, the token seed and the vocabulary; None on a wall clock, or
        where a token can be an EOS id (`token_for` skips those), or on a subclass."""
        if not self.native_decode or self.arch.eos_token_ids:
            return None
        if type(self) is not MockerRunner or type(self.clock) is not VirtualClock:
            return None  # a subclass may make tokens, steps or time otherwise
        poly = None
        timing = self.timing
        if type(timing) is PolynomialTiming and self._utilization_pool is not None:
            # its decode step in closed form, on the pool the utilization is read from
            a, b, c = timing.decode_coeffs
            poly = (a, b, c, timing.min_decode_ms, timing.speedup_ratio)
        return NativeDecode(
            self.clock, self.seed, self.arch.vocab_size, poly, self._utilization_pool
        )

    def use_pool_utilization(self, pool: BlockPool) -> None:
        """Read the KV utilization the timing model prices as `pool`'s blocks in use over
        its blocks (what an engine core's runner reads)."""
        self._utilization_pool = pool
        self.kv_utilization = lambda: pool.get_num_active_blocks() / pool.num_blocks

    def end_native_decode(self, now_s: float, last_step_ms: float, num_steps: int) -> None:
        """After `num_steps` steps run natively (the last `last_step_ms`), the clock at
        `now_s`: as `advance_steps` of each stretch would have left them."""
        assert isinstance(self.clock, VirtualClock)
        self.clock.now_s = now_s
        self.last_step_ms = last_step_ms
        self.num_batches += num_steps

    def get_tokens(self, request_id: str, start: int, stop: int) -> list[int]:
        """`token_for` at positions `start..stop-1`."""
        if self.arch.eos_token_ids:
            return [self.token_for(request_id, p) for p in range(start, stop)]
        prefix = f"{request_id}/".encode()
        if _native is not None and len(prefix) <= _MAX_NATIVE_PREFIX_BYTES:
            return _native.mock_tokens(prefix, start, stop, self.seed, self.arch.vocab_size)
        digest = xxhash.xxh3_64_intdigest
        seed, vocab_size = self.seed, self.arch.vocab_size
        return [
            digest(f"{request_id}/{p}".encode(), seed=seed) % vocab_size for p in range(start, stop)
        ]


def simulated_arch(
    vocab_size: int, max_model_len: int, eos_token_ids: tuple[int, ...] = ()
) -> ModelArch:
    """A model description for a mocker with no model directory: only the vocabulary, EOS ids
    and context length matter (the layer shapes are never used)."""
    return ModelArch(
        model_type="llama",
        num_layers=1,
        hidden_size=8,
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=8,
        vocab_size=vocab_size,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        qkv_bias=False,
        max_position_embeddings=max_model_len,
        eos_token_ids=eos_token_ids,
        sliding_window=None,
    )


def build_mocker_core(
    config: NativeEngineConfig,
    *,
    timing: TimingModel | None = None,
    clock: Clock | None = None,
    arch: ModelArch | None = None,
    eviction_observer: EvictionObserver | None = None,
    tiers: KvTierConfig | None = None,
) -> EngineCore:
    """An EngineCore whose runner is the mocker. `arch` defaults to the config's model
    directory (only its config.json is read: vocabulary, EOS ids, context length). KV capacity
    follows the native engine's rule: `num_kv_blocks`, else `kv_cache_bytes` of that model.
    `tiers` (when enabled) are modeled on the same clock (`armature.sim.modeled_tiers`), their
    blocks as large as the model's (bfloat16)."""
    arch = arch or read_arch(Path(config.model_dir))
    timing = timing or PolynomialTiming()
    clock = clock or WallClock()
    runner = MockerRunner(
        arch,
        timing,
        clock,
        seed=config.seed,
        block_size=config.block_size,
        speedup_ratio=timing.speedup_ratio,
    )
    builder: TierBuilder | None = None
    if tiers is not None and tiers.is_enabled:
        tier_config = tiers

        def builder(event_log: KvEventLog, kv_store: KvBlockStore) -> KvTiers:
            return build_modeled_tiers(
                tier_config,
                event_log,
                clock,
                bytes_per_block=kv_store.layout.bytes_per_block,
                speedup_ratio=timing.speedup_ratio,
            )

    core = EngineCore(
        config,
        runner,
        num_blocks=config.get_num_kv_blocks(arch),
        eviction_observer=eviction_observer,
        tiers=builder,
        time_s=clock.get_time_s,
        name="mocker",
    )
    runner.use_pool_utilization(core.pool)
    return core
