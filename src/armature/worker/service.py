"""A worker: one engine served over the request plane and registered in discovery.

Endpoints (payloads are msgpack):
    generate  EngineRequest -> stream of EngineOutput; closing the stream aborts the request
    dump      (empty) -> a KvDump in parts (split_dump)
    release   KvHandle -> one empty item, once the handle's pinned blocks are released
    embed     EmbedRequest -> one EmbedResult (only on a worker started with --task embed,
              whose card says so; its engine refuses `generate`)
    load_lora    LoadLora -> one LoraState (the adapters served after loading it)
    unload_lora  UnloadLora -> one LoraState (after unloading it)
An invalid request fails its stream with code `invalid_request` (the frontend answers 4xx).
On the event plane it publishes a WorkerUpdate (KV events, load, step records, LoRA adapters)
when the engine has news (at most once every `update_interval_s`), and at least every
`heartbeat_s` so that late subscribers learn the load.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator

import msgspec

from armature.engines.api import EmbeddingEngine, Engine, InvalidRequestError
from armature.errors import ConfigError
from armature.protocols.embedding import EmbedRequest, WorkerTask
from armature.protocols.engine import EngineRequest
from armature.protocols.failures import FailureCode
from armature.protocols.kv_events import split_dump
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.lora import LoadLora, LoraState, UnloadLora
from armature.protocols.worker import WorkerCard, WorkerRole, WorkerUpdate, worker_key
from armature.runtime.discovery import DEFAULT_LEASE_TTL_S, Discovery, Registration
from armature.runtime.events import EventPlane, Publisher
from armature.runtime.request_plane import HandlerError, ServerFactory
from armature.worker.metrics import WorkerMetrics

__all__ = ["WorkerService"]

log = logging.getLogger(__name__)


class WorkerService:
    def __init__(
        self,
        engine: Engine,
        discovery: Discovery,
        *,
        namespace: str,
        model_name: str,
        model_path: str,
        block_size: int,
        max_model_len: int,
        vocab_size: int,
        make_server: ServerFactory,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        update_interval_s: float = 0.01,
        instance_id: int | None = None,
        event_plane: EventPlane,
        heartbeat_s: float = 1.0,
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        role: WorkerRole = WorkerRole.AGG,
        embedder: EmbeddingEngine | None = None,
        engine_name: str = "",
        structured_output: bool = False,
    ):
        """`embedder`: `engine` as an embedding engine, for a worker of task embed.
        `structured_output`: whether `engine` enforces guides (its card says so)."""
        self.engine = engine
        self.embedder = embedder
        self.engine_name = engine_name
        self.structured_output = structured_output
        self.discovery = discovery
        self.namespace = namespace
        self.model_name = model_name
        self.model_path = model_path
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.lease_ttl_s = lease_ttl_s
        self.update_interval_s = update_interval_s
        self.instance_id = instance_id if instance_id is not None else secrets.randbits(63)
        self.event_plane = event_plane
        self.heartbeat_s = heartbeat_s
        self.role = role
        self._in_flight = 0
        self._draining = False
        # set when the engine died (its thread, its process): the worker must leave, or
        # frontends keep routing to a worker whose every request fails
        self.engine_died = asyncio.Event()
        handlers = {
            "generate": self._generate,
            "dump": self._dump,
            "release": self._release,
            "load_lora": self._load_lora,
            "unload_lora": self._unload_lora,
        }
        self._lora_version = 0  # grows with each adapter loaded or unloaded here
        if embedder is not None:
            handlers["embed"] = self._embed
        self.server = make_server(handlers)
        self._registration: Registration | None = None
        self._publisher: Publisher | None = None
        self._pump: asyncio.Task[None] | None = None
        self.card: WorkerCard | None = None
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        self.metrics = WorkerMetrics(
            f"worker-{self.instance_id:x}",
            engine.get_load,
            engine.stats,
        )

    async def start(self) -> WorkerCard:
        self.engine.start()
        await self.server.start()
        self._publisher = await self.event_plane.publisher(f"{self.namespace}.{self.instance_id:x}")
        metrics_url = ""
        if self.metrics_port is not None:
            try:
                metrics_url = self.metrics.serve(self.metrics_host, self.metrics_port)
            except OSError as exc:  # not the request port's: say which
                raise ConfigError(
                    f"--metrics-port: cannot listen on {self.metrics_host}:{self.metrics_port}: "
                    f"{exc.strerror}"
                ) from None
        self._pump = asyncio.get_running_loop().create_task(self._pump_events())
        self.card = WorkerCard(
            instance_id=self.instance_id,
            namespace=self.namespace,
            model_name=self.model_name,
            model_path=self.model_path,
            block_size=self.block_size,
            num_kv_blocks=self.engine.get_load().num_total_blocks,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            request_url=self.server.url,
            events_url=self._publisher.url,
            metrics_url=metrics_url,
            role=self.role,
            task=WorkerTask.GENERATE if self.embedder is None else WorkerTask.EMBED,
            engine=self.engine_name,
            embedding=None if self.embedder is None else self.embedder.embedding_shape,
            structured_output=self.structured_output,
            lora_adapters=self.engine.get_lora_adapters(),
        )
        self._registration = await self.discovery.register(
            worker_key(self.namespace, self.instance_id),
            msgspec.msgpack.encode(self.card),
            self.lease_ttl_s,
        )
        log.info("worker %s serving on %s", self.card.worker_id, self.card.request_url)
        return self.card

    async def stop(self, grace_s: float = 0.0) -> None:
        """Deregister first (no new traffic; late arrivals are refused and rerouted by the
        frontend), let in-flight requests finish for up to `grace_s`, then stop serving and
        the engine (which ends whatever is left)."""
        self._draining = True
        if self._registration is not None:
            await self._registration.close()
            self._registration = None
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + grace_s
        if self._in_flight:
            log.info("draining %d in-flight requests (up to %.0f s)", self._in_flight, grace_s)
        while self._in_flight and loop.time() < deadline_s:
            await asyncio.sleep(0.05)
        if self._in_flight:
            log.warning("stopping with %d requests still in flight", self._in_flight)
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await self.server.stop()
        self.metrics.stop()
        if self._publisher is not None:
            await self._publisher.close()
        await self.engine.stop()

    async def _generate(self, payload: bytes) -> AsyncIterator[bytes]:
        received_s = time.monotonic()
        try:
            request = msgspec.msgpack.decode(payload, type=EngineRequest)
        except msgspec.DecodeError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, f"malformed request: {exc}") from None
        try:
            self.engine.validate(request)
        except InvalidRequestError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, str(exc)) from None
        if self._draining:
            raise HandlerError(FailureCode.UNAVAILABLE, "the worker is shutting down")
        stream = self.engine.generate(request)
        num_output, reason = 0, "cancelled"
        # a request that comes with tokens already (a decode leg, a migrated one) has had
        # its first token elsewhere
        timed = not request.output_token_ids
        self._in_flight += 1
        try:
            async for output in stream:
                if timed and output.new_token_ids and not num_output:
                    self.metrics.ttft_s.observe(time.monotonic() - received_s)
                num_output += len(output.new_token_ids)
                if output.finish_reason is not None:
                    reason = output.finish_reason.value
                yield msgspec.msgpack.encode(output)
        finally:
            self._in_flight -= 1
            await stream.aclose()
            self.metrics.requests.labels(reason).inc()
            self.metrics.prompt_tokens.inc(len(request.prompt_token_ids))
            self.metrics.output_tokens.inc(num_output)
            log.info(
                "request %s: %d prompt tokens, %d output, %s",
                request.request_id,
                len(request.prompt_token_ids),
                num_output,
                reason,
            )

    async def _embed(self, payload: bytes) -> AsyncIterator[bytes]:
        assert self.embedder is not None
        try:
            request = msgspec.msgpack.decode(payload, type=EmbedRequest)
        except msgspec.DecodeError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, f"malformed request: {exc}") from None
        try:
            self.embedder.validate_embed(request)
        except InvalidRequestError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, str(exc)) from None
        if self._draining:
            raise HandlerError(FailureCode.UNAVAILABLE, "the worker is shutting down")
        num_tokens = sum(len(prompt) for prompt in request.prompts)
        reason = "cancelled"
        self._in_flight += 1
        try:
            result = await self.embedder.embed(request)
            reason = "embedded"
            yield msgspec.msgpack.encode(result)
        finally:
            self._in_flight -= 1
            self.metrics.requests.labels(reason).inc()
            self.metrics.prompt_tokens.inc(num_tokens)
            log.info(
                "request %s: %d prompts, %d tokens, %s",
                request.request_id,
                len(request.prompts),
                num_tokens,
                reason,
            )

    async def _dump(self, payload: bytes) -> AsyncIterator[bytes]:
        for part in split_dump(await self.engine.dump_kv_blocks()):  # each its own message
            yield msgspec.msgpack.encode(part)

    async def _release(self, payload: bytes) -> AsyncIterator[bytes]:
        try:
            handle = msgspec.msgpack.decode(payload, type=KvHandle)
        except msgspec.DecodeError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, f"malformed KV handle: {exc}") from None
        await self.engine.release_kv(handle)
        yield b""

    def _lora_state(self) -> LoraState:
        return LoraState(self._lora_version, self.engine.get_lora_adapters())

    async def _load_lora(self, payload: bytes) -> AsyncIterator[bytes]:
        try:
            command = msgspec.msgpack.decode(payload, type=LoadLora)
            await self.engine.load_lora(command.name, command.path)
        except msgspec.DecodeError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, f"malformed request: {exc}") from None
        except InvalidRequestError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, str(exc)) from None
        self._lora_version += 1
        yield msgspec.msgpack.encode(self._lora_state())

    async def _unload_lora(self, payload: bytes) -> AsyncIterator[bytes]:
        try:
            command = msgspec.msgpack.decode(payload, type=UnloadLora)
            await self.engine.unload_lora(command.name)
        except msgspec.DecodeError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, f"malformed request: {exc}") from None
        except InvalidRequestError as exc:
            raise HandlerError(FailureCode.INVALID_REQUEST, str(exc)) from None
        self._lora_version += 1
        yield msgspec.msgpack.encode(self._lora_state())

    async def _pump_events(self) -> None:
        """Whenever the engine has news (`Engine.wait_for_update`), at most once an interval:
        drain its KV events and step records and publish them with the load. An update the
        event plane refuses is lost (a router heals its index from a dump; the records are
        gone). An idle engine's worker wakes only for the heartbeat."""
        assert self._publisher is not None
        last_load = None
        last_sent_s = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if not self.engine.is_alive:
                log.error("the engine died; this worker stops taking requests")
                self.engine_died.set()
                return  # no heartbeat either: frontends drop it at their liveness timeout
            events = self.engine.take_kv_events()
            records = self.engine.take_step_records()
            load = self.engine.get_load()
            now_s = loop.time()
            changed = events or records or load != last_load
            if changed or now_s - last_sent_s >= self.heartbeat_s:
                update = WorkerUpdate(
                    kv_events=events, load=load, step_records=records, lora=self._lora_state()
                )
                try:
                    await self._publisher.publish(msgspec.msgpack.encode(update))
                except Exception as exc:  # the event plane is down: the next dump heals it
                    log.warning("could not publish worker events: %s", exc)
                last_load, last_sent_s = load, now_s
            polled_s = loop.time()
            await self.engine.wait_for_update(last_sent_s + self.heartbeat_s - polled_s)
            # a run of short steps is published together, once an interval
            await asyncio.sleep(max(0.0, polled_s + self.update_interval_s - loop.time()))
