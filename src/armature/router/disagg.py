"""Disaggregated serving in the frontend: prefill workers compute prompts, decode workers
continue from the KV blocks they pull.

    request --decide--> local:  decode pool (aggregated serving on a decode/agg worker)
                  \\--> remote: prefill pool (KV-aware) -> first token + KV handle
                                -> decode pool, with the handle -> the rest of the stream

Conditional disaggregation (`router.prefill_decision`, shared with the simulator): the prompt
is prefilled where it is decoded when its uncached part (given the decode pool's best cached
prefix) is shorter than `max_local_prefill_tokens`, when every prefill worker already has
`max_prefill_queue_tokens` queued, or when no prefill worker is alive (then serving is
aggregated) -- unless `enforce_disagg`, which refuses instead. A prefill worker that dies
before answering is replaced by another, or by local prefill.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping

import msgspec

from armature.config import DisaggConfig, RouterConfig
from armature.engines.api import Engine, EngineDeadError
from armature.kv.hashing import compute_seq_hashes
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    StepRecord,
    merge_outputs,
)
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.worker import WorkerRole
from armature.router.load import WorkerLoad
from armature.router.policies import NoWorkerError
from armature.router.prefill_decision import PrefillDecision, decide_prefill
from armature.router.pressure import BusyWorkers
from armature.router.service import EngineRouter, RouteGroup, RouterObserver

__all__ = ["DisaggRouter", "PrefillDecision"]

log = logging.getLogger(__name__)


class DisaggRouter(EngineRouter):
    """An EngineRouter over the decode (and aggregated) workers with a second router over the
    prefill workers; with no prefill worker it is exactly the aggregated router."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        config: RouterConfig,
        disagg: DisaggConfig | None = None,
        observer: RouterObserver | None = None,
        prefill_engines: Mapping[str, Engine] | None = None,
        busy: BusyWorkers | None = None,
    ):
        super().__init__(engines, config, observer, busy)
        self.disagg = disagg or DisaggConfig()
        self.prefill = EngineRouter(
            prefill_engines or {}, config, self.observer, load_changed=self.load_changed
        )
        self.num_prefills = {"remote": 0, "local": 0}
        self._releases: set[asyncio.Task[None]] = set()

    # ---- pools -------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self.prefill.start()

    async def stop(self) -> None:
        await self.prefill.stop()
        await super().stop()

    def add_engine(self, worker: str, engine: Engine, role: WorkerRole = WorkerRole.AGG) -> None:
        if role is WorkerRole.PREFILL:
            self.prefill.add_engine(worker, engine)
        else:
            super().add_engine(worker, engine)

    async def remove_engine(self, worker: str) -> None:
        await self.prefill.remove_engine(worker)
        await super().remove_engine(worker)

    def get_engine(self, worker: str) -> Engine | None:
        return self.engines.get(worker) or self.prefill.engines.get(worker)

    def get_worker_loads(self) -> dict[str, EngineLoad]:
        return {**self.prefill.get_worker_loads(), **super().get_worker_loads()}

    def take_step_records(self) -> dict[str, list[StepRecord]]:
        return {**self.prefill.take_step_records(), **super().take_step_records()}

    def get_own_loads(self) -> dict[str, WorkerLoad]:
        return {**self.prefill.get_own_loads(), **super().get_own_loads()}

    def set_peer_loads(self, peers: Mapping[str, WorkerLoad]) -> None:
        self.prefill.set_peer_loads(peers)
        super().set_peer_loads(peers)

    def get_index_blocks(self) -> tuple[int, int]:
        prefill, decode = self.prefill.get_index_blocks(), super().get_index_blocks()
        return prefill[0] + decode[0], prefill[1] + decode[1]

    # ---- requests ----------------------------------------------------------------------
    def check_route(self, target_worker: str | None) -> None:
        super().check_route(target_worker)
        if self.disagg.enforce_disagg and target_worker is None and not self.prefill.get_workers():
            raise NoWorkerError("no prefill worker is available and disaggregation is enforced")

    def decide_prefill(self, request: EngineRequest) -> PrefillDecision:
        """Whether `request` goes to the prefill pool first, and why (conditional
        disaggregation over the live prefill workers and this router's own load view)."""
        bs = self.config.block_size_tokens

        def get_num_cached_blocks() -> int:
            if request.computes_whole_prompt:  # a scored prompt hits no cache
                return 0
            seed = self.get_hash_seed(request)
            hashes = compute_seq_hashes(request.prompt_token_ids, bs, seed)
            return max(self.index.find_overlaps(hashes).values(), default=0)

        return decide_prefill(
            num_prompt_tokens=len(request.prompt_token_ids),
            get_num_cached_blocks=get_num_cached_blocks,
            block_size=bs,
            prefill_queue_tokens=[
                self.prefill.load.get(w).active_prefill_tokens for w in self.prefill.get_workers()
            ],
            config=self.disagg,
        )

    async def generate(
        self,
        request: EngineRequest,
        target_worker: str | None = None,
        group: RouteGroup | None = None,
    ) -> AsyncGenerator[EngineOutput, None]:
        """As EngineRouter.generate; a `group` member whose group already has a worker goes
        there (it holds the prompt), one that leads its group may prefill remotely."""
        follows = group is not None and group.worker is not None
        if target_worker is not None or follows or not self.decide_prefill(request).is_remote:
            if self.disagg.enforce_disagg and target_worker is None and not follows:
                raise NoWorkerError("no prefill worker is available and disaggregation is enforced")
            self._count("local")
            async for output in super().generate(request, target_worker, group):
                yield output
            return
        first = await self._remote_prefill(request)
        if first is None:  # no prefill worker could serve it
            if self.disagg.enforce_disagg:
                raise EngineDeadError("every prefill worker failed and disaggregation is enforced")
            self._count("local")
            async for output in super().generate(request, group=group):
                yield output
            return
        self._count("remote")
        if first.finish_reason is not FinishReason.TRANSFER:
            yield first  # finished with its first token (or failed): no decode leg
            return
        handle = first.kv_handle
        # once the decode leg is asked, the decode engine releases the handle itself, after
        # it has copied the blocks in (or the handle's deadline frees them): released here
        # too, a shared-memory or NIXL copy could read blocks the prefill worker had reused
        handed = False
        try:
            yield msgspec.structs.replace(first, finish_reason=None, kv_handle=None)
            sampling = request.sampling
            decode_request = msgspec.structs.replace(
                request,
                output_token_ids=request.output_token_ids + first.new_token_ids,
                sampling=msgspec.structs.replace(
                    sampling, max_tokens=sampling.max_tokens - len(first.new_token_ids)
                ),
                kv_handle=handle,
            )
            handed = True
            async for output in super().generate(decode_request, group=group):
                if output.num_prompt_tokens:  # the prefill leg reported the prompt already
                    output = msgspec.structs.replace(
                        output, num_prompt_tokens=0, num_cached_tokens=0
                    )
                yield output
        finally:
            if not handed and handle is not None and handle.seq_hashes:
                self._release(handle)  # the client left before the decode leg was asked

    def _release(self, handle: KvHandle) -> None:
        """Free a handle's pinned blocks on its prefill worker now (best effort; they are
        freed at the handle's deadline anyway)."""
        engine = self.prefill.engines.get(handle.worker_id)
        if engine is None:
            return

        async def release() -> None:
            try:
                await engine.release_kv(handle)
            except EngineDeadError as exc:
                log.info("could not release KV handle %s: %s", handle.handle_id, exc)

        task = asyncio.get_running_loop().create_task(release())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _count(self, where: str) -> None:
        self.num_prefills[where] += 1
        self.observer.prefill(where)

    async def _remote_prefill(self, request: EngineRequest) -> EngineOutput | None:
        """The prefill leg's single output, or None when every prefill worker failed."""
        prefill_request = msgspec.structs.replace(request, remote_prefill=True)
        outputs: list[EngineOutput] = []
        try:
            async for output in self.prefill.generate(prefill_request):
                outputs.append(output)
        except EngineDeadError as exc:
            if outputs:
                raise
            log.warning("request %s: no prefill worker served it (%s)", request.request_id, exc)
            return None
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else merge_outputs(outputs)
