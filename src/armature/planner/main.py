"""`armature planner`, assembled: the performance model, discovery and the event plane, the
connector, the planner's metrics, then the tick loop until SIGINT/SIGTERM. Settings that
cannot work (no or a bad timing profile, an unreachable frontend, a profile measured on
another model than a frontend serves, a Kubernetes API server that cannot be reached or
refuses) are a ConfigError before the loop starts; the workers a local connector started by
then are stopped first.

The performance model is one worker as `armature profile` measured it: step times from the
profile's tables, and its KV pool (block size, blocks), step budget and batch size as the
profiled engine ran; the workers are expected to run with the same settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from pathlib import Path

import msgspec

from armature.config import (
    PlannerCommandConfig,
    PlannerConfig,
    PlannerServiceConfig,
    flag_name,
    iter_settings,
)
from armature.errors import ConfigError
from armature.planner.actuator import Actuator
from armature.planner.connectors.api import Connector
from armature.planner.connectors.local import LocalConnector, SubprocessLauncher
from armature.planner.connectors.virtual import VirtualConnector
from armature.planner.core import Planner
from armature.planner.frontend_feed import (
    FrontendFeed,
    FrontendScrape,
    FrontendUnreachableError,
    discovered_frontends,
    one_frontend,
)
from armature.planner.metrics import PlannerMetrics
from armature.planner.performance import PerformanceModel, RoleModels
from armature.planner.profile_match import ProfiledWorker
from armature.planner.scrape import FrontendSample, judges_by
from armature.planner.service import INTERVAL_WINDOW, LOAD_WINDOW, PlannerService
from armature.planner.timing_performance import TimingPerformanceModel
from armature.planner.worker_feed import WorkerStepFeed
from armature.protocols.timing_profile import ProfileError
from armature.protocols.worker import WorkerCard, WorkerRole, worker_prefix
from armature.runtime.discovery import Discovery
from armature.runtime.factory import make_event_plane, open_discovery
from armature.runtime.stop_signals import stop_on_signals
from armature.sim.profile_timing import load_profile

__all__ = [
    "MIN_LIVE_INTERVAL_S",
    "check_connector_settings",
    "check_live_intervals",
    "check_model",
    "describe_unseen_workers",
    "get_worker_argv",
    "open_frontend_feed",
    "read_performance_model",
    "read_role_models",
    "run_planner",
]

log = logging.getLogger("armature")

# the shortest interval a live planner runs at: each one scrapes the frontend's metrics
MIN_LIVE_INTERVAL_S = 0.1


def get_worker_argv(worker_args: tuple[str, ...]) -> list[str]:
    """Each --worker-args string split as a shell would; ConfigError on bad quoting."""
    argv: list[str] = []
    for text in worker_args:
        try:
            argv += shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"--worker-args {text!r}: {exc}") from None
    return argv


def read_performance_model(path: str | None) -> tuple[TimingPerformanceModel, ProfiledWorker]:
    """One worker as the timing profile at `path` describes it, and what it was measured on
    (served model, block size, KV blocks); a one-line ConfigError when there is none or it
    cannot be used."""
    if path is None:
        raise ConfigError(
            "--performance-model is required (a timing profile: `armature profile --output`)"
        )
    try:
        profile, timing = load_profile(Path(path))
    except ProfileError as exc:
        raise ConfigError(f"--performance-model: {exc}") from None
    model = TimingPerformanceModel(
        timing,
        block_size=profile.block_size_tokens,
        num_kv_blocks=profile.num_kv_blocks,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
    )
    profiled = ProfiledWorker(
        model_name=profile.source.model,
        block_size_tokens=profile.block_size_tokens,
        num_kv_blocks=profile.num_kv_blocks,
    )
    return model, profiled


def read_role_models(
    service: PlannerServiceConfig, planner: PlannerConfig
) -> tuple[PerformanceModel, ProfiledWorker, ProfiledWorker | None]:
    """The planner's model of the workers, what they were measured on, and the prefill
    workers' where they have a profile of their own (--prefill-performance-model, which
    only a disaggregated planner takes; measured on the same served model)."""
    model, profiled = read_performance_model(service.performance_model)
    path = service.prefill_performance_model
    if path is None:
        return model, profiled, None
    if planner.mode != "disagg":
        raise ConfigError(
            "--prefill-performance-model is for --planner-mode disagg (aggregated workers "
            "prefill and decode alike: one --performance-model)"
        )
    try:
        prefill, prefill_profiled = read_performance_model(path)
    except ConfigError as exc:
        raise ConfigError(f"--prefill-{str(exc).removeprefix('--')}") from None
    if prefill_profiled.model_name != profiled.model_name:
        raise ConfigError(
            f"--prefill-performance-model was measured on model {prefill_profiled.model_name!r}"
            f", --performance-model on {profiled.model_name!r}: profile the same model"
        )
    return RoleModels(prefill=prefill, decode=model), profiled, prefill_profiled


# each connector's own settings: given with another connector, they would do nothing
CONNECTOR_SETTINGS = {
    "local": ("worker_args", "prefill_worker_args", "worker_log_dir", "drain_timeout_s"),
    "virtual": ("ack_timeout_s",),
    "kubernetes": (
        "k8s_namespace",
        "k8s_prefill_deployment",
        "k8s_decode_deployment",
        "k8s_agg_deployment",
    ),
}


def check_connector_settings(service: PlannerServiceConfig) -> None:
    """ConfigError for a connector's setting given with another connector."""
    defaults = PlannerServiceConfig()
    for connector, names in CONNECTOR_SETTINGS.items():
        if connector == service.connector:
            continue
        for _, field, setting in iter_settings(PlannerServiceConfig):
            name = field.name
            if name in names and getattr(service, name) != getattr(defaults, name):
                raise ConfigError(
                    f"--{flag_name(name, setting)} is for --connector {connector} (this planner's "
                    f"is {service.connector})"
                )


def run_planner(config: PlannerCommandConfig) -> None:
    asyncio.run(_run(config))


async def _discovered(discovery: Discovery, namespace: str) -> dict[WorkerRole, int]:
    counts: dict[WorkerRole, int] = {}
    for value in (await discovery.list(worker_prefix(namespace))).values():
        with contextlib.suppress(msgspec.DecodeError):  # the feed logs unreadable cards
            role = msgspec.msgpack.decode(value, type=WorkerCard).role
            counts[role] = counts.get(role, 0) + 1
    return counts


async def _open_connector(
    config: PlannerCommandConfig,
    discovery: Discovery,
    discovered: dict[WorkerRole, int],
    worker_argv: list[str],
) -> Connector:
    """The connector --connector names; the kubernetes one reads its Deployments first (a
    ConfigError when it cannot)."""
    service, runtime = config.service, config.runtime
    if service.connector == "local":
        log_dir = Path(service.worker_log_dir) if service.worker_log_dir else None
        prefill_argv = get_worker_argv(service.prefill_worker_args) or None
        launcher = SubprocessLauncher(
            worker_argv, runtime, log_dir=log_dir, prefill_worker_args=prefill_argv
        )
        return LocalConnector(launcher, drain_timeout_s=service.drain_timeout_s)
    if service.connector == "kubernetes":
        try:  # an optional extra: imported only when chosen
            from armature.planner.connectors.kubernetes import open_kubernetes_connector
        except ImportError as exc:
            raise ConfigError(
                f"--connector kubernetes needs lightkube ({exc}): pip install "
                "'armature[kubernetes]'"
            ) from None
        deployments = service.get_k8s_deployments(config.planner.get_roles())
        return await open_kubernetes_connector(deployments, namespace=service.k8s_namespace)
    return VirtualConnector(
        discovery,
        runtime.namespace,
        num_workers=discovered,
        ack_timeout_s=service.ack_timeout_s,
        lease_ttl_s=runtime.lease_ttl_s,
    )


def describe_attainment_source(planner: PlannerConfig, sample: FrontendSample) -> str:
    """Where the planner's measured attainment comes from: the frontend's judged requests when
    it judges them against the planner's own targets, else what to start it with."""
    if judges_by(sample, planner.ttft_ms, planner.itl_ms):
        return "the frontend's judged requests"
    ttft_s, itl_s = sample.slo_ttft_target_s, sample.slo_itl_target_s
    judged = (
        "no targets"
        if ttft_s is None and itl_s is None
        else f"TTFT {_ms(ttft_s)} and ITL {_ms(itl_s)}"
    )
    return (
        f"not measured: the frontend judges requests against {judged} (start it with "
        f"--slo-ttft-ms {planner.ttft_ms:g} --slo-itl-ms {planner.itl_ms:g})"
    )


def describe_unseen_workers(sample: FrontendSample, discovered: dict[WorkerRole, int]) -> str:
    """A warning when the frontend routes to workers while the planner's discovery lists none
    (they run in the frontend's process, or meet on another namespace or discovery); "" if
    not. Some listed is taken as the same fleet: the two reads are not at one instant."""
    if sample.num_workers == 0 or sum(discovered.values()) > 0:
        return ""
    return (
        f"the frontend routes to {sample.num_workers} worker(s) that the planner does not "
        "discover (workers in the frontend's process, --in-process-workers, or another "
        "--namespace or discovery): it reads no step records from them and cannot scale them"
    )


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1000.0:g} ms"


async def _first_scrape(
    frontend: FrontendFeed, wait_s: float, stop: asyncio.Event
) -> FrontendScrape | None:
    """The frontend's first metrics, polled for up to `wait_s`; None once `stop` is set."""
    deadline_s = time.monotonic() + wait_s
    waiting = False
    while not stop.is_set():
        try:
            return await frontend.scrape()
        except FrontendUnreachableError as exc:
            if time.monotonic() >= deadline_s:
                raise ConfigError(f"no metrics from {frontend.describe}: {exc}") from None
            if not waiting:
                waiting = True
                log.info("waiting up to %.0f s for %s: %s", wait_s, frontend.describe, exc)
        with contextlib.suppress(TimeoutError):  # polling a server that is still starting
            await asyncio.wait_for(stop.wait(), 0.25)
    return None


def open_frontend_feed(
    service: PlannerServiceConfig, discovery: Discovery, namespace: str
) -> FrontendFeed:
    """The frontends the planner reads: --frontend-url alone, else every replica in
    discovery."""
    windows = (LOAD_WINDOW, INTERVAL_WINDOW)
    if service.frontend_url is not None:
        frontends, describe = one_frontend(service.frontend_url), service.frontend_url
    else:
        frontends = discovered_frontends(discovery, namespace)
        describe = f"the frontends of namespace {namespace!r} in discovery"
    return FrontendFeed(frontends, describe, windows, api_key=service.frontend_api_key)


def check_model(scrape: FrontendScrape, profiled: ProfiledWorker) -> None:
    """ConfigError when a frontend serves another model than the profile's."""
    for name, sample in scrape.samples.items():
        if sample.model_name not in (None, profiled.model_name):
            raise ConfigError(
                f"--performance-model was measured on model {profiled.model_name!r}; the "
                f"frontend at {scrape.urls[name]} serves {sample.model_name!r} (profile that "
                "model)"
            )


def _serve_metrics(metrics: PlannerMetrics, service: PlannerServiceConfig) -> str:
    """Start the planner's /metrics endpoint; its url ("off": --metrics-port below 0).
    ConfigError when the port cannot be had."""
    if service.metrics_port < 0:
        return "off"
    try:
        return metrics.serve(service.host, service.metrics_port)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {service.host}:{service.metrics_port}: {exc.strerror}"
        ) from None


def check_live_intervals(planner: PlannerConfig) -> None:
    """ConfigError for an interval too short for a live planner, which scrapes the frontend's
    metrics every interval (a replay on the virtual clock may use any)."""
    for flag, value_s in (
        ("--planner-interval-s", planner.interval_s),
        ("--load-interval-s", planner.load_interval_s),
    ):
        if value_s < MIN_LIVE_INTERVAL_S:
            raise ConfigError(
                f"{flag} {value_s:g}: the planner reads the frontend's metrics every interval; "
                f"use at least {MIN_LIVE_INTERVAL_S:g} s"
            )


async def _run(config: PlannerCommandConfig) -> None:
    service, runtime = config.service, config.runtime
    check_live_intervals(config.planner)
    check_connector_settings(service)
    model, profiled, prefill_profiled = read_role_models(service, config.planner)
    worker_argv = get_worker_argv(service.worker_args)
    if not service.dry_run and service.connector == "local" and not worker_argv:
        raise ConfigError('--connector local needs --worker-args, e.g. "--engine mocker"')
    discovery = await open_discovery(runtime)
    event_plane = await make_event_plane(runtime)
    tasks: list[asyncio.Task[None]] = []
    connector: Connector | None = None
    metrics = PlannerMetrics(config.planner.get_roles())
    frontend = open_frontend_feed(service, discovery, runtime.namespace)
    # from here SIGINT and SIGTERM stop the planner through its clean-up (a SIGTERM while
    # it waited for the frontend ended it on the spot, the workers it started undrained)
    stop = stop_on_signals()
    try:
        discovered = await _discovered(discovery, runtime.namespace)
        if not service.dry_run:
            connector = await _open_connector(config, discovery, discovered, worker_argv)
        initial = discovered if connector is None else connector.get_num_workers()
        planner = Planner(config.planner, model, num_workers=initial)
        metrics.set_workers(planner.get_num_workers(), discovered)
        actuator = None
        if connector is not None:
            actuator = Actuator(
                connector,
                retry_s=config.planner.load_interval_s,
                on_failure=metrics.connector_failures.inc,
            )
            actuator.set_targets(planner.get_num_workers(), {})
            tasks.append(asyncio.create_task(actuator.run()))
        # the frontend's model before the workers' step records are read: a profile of
        # another model is refused without a warning from each worker that it differs
        scrape = await _first_scrape(frontend, service.frontend_wait_s, stop)
        if scrape is None:
            log.info("planner stopping before it read the frontend")
            return
        check_model(scrape, profiled)
        sample = scrape.total
        workers = WorkerStepFeed(
            discovery,
            event_plane,
            runtime.namespace,
            (LOAD_WINDOW, INTERVAL_WINDOW),
            profiled,
            prefill_profiled,
        )
        tasks.append(asyncio.create_task(workers.run()))
        # read again: the connector may have started workers since (they are the planner's)
        unseen = describe_unseen_workers(sample, await _discovered(discovery, runtime.namespace))
        if unseen:
            log.warning("%s", unseen)
        metrics_url = _serve_metrics(metrics, service)
        log.info(
            "planner ready: %s mode, roles %s, targets %s, connector %s, frontend %s, metrics %s, "
            "attainment %s",
            config.planner.mode,
            ", ".join(f"{r.value}={n}" for r, n in planner.get_num_workers().items()),
            f"ttft {config.planner.ttft_ms:g} ms itl {config.planner.itl_ms:g} ms",
            "none (dry run)" if connector is None else service.connector,
            f"{frontend.describe} ({len(scrape.samples)} now)",
            metrics_url,
            describe_attainment_source(config.planner, sample),
        )
        loop_service = PlannerService(planner, config.planner, frontend, workers, metrics, actuator)
        await loop_service.run(stop)
        log.info("planner stopping")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if connector is not None:
            await connector.close()
        metrics.stop()
        await frontend.close()
        await event_plane.close()
        await discovery.close()
