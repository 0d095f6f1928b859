"""`--save-dir`: the chosen configuration as files a team can run.

profile.json          the (decode or aggregated) workers' timing profile: the mocker's
                      step times and the planner's performance model
prefill_profile.json  the prefill workers' (disaggregated)
commands.sh           `armature serve` (one command), and `armature frontend` +
                      `armature worker` lines (one process each), as mocker fleets on the
                      predicted step times (local: at the engines' share of the host)
commands_native.sh    the same with the native engine (--system local only)
values.yaml           Helm values for deploy/helm/armature
planner.sh, targets.json   the planner on the profile and the targets
workload.jsonl, replay.sh, prediction.json   the simulated workload, the `armature replay`
                      command that reproduces the prediction, and the prediction
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from armature.config import (
    DisaggConfig,
    EngineConfig,
    FrontendConfig,
    KvCacheConfig,
    PlannerCommandConfig,
    PlannerConfig,
    PlannerServiceConfig,
    RouterConfig,
    RuntimeConfig,
    ServeConfig,
    SloConfig,
    WorkerConfig,
    WorkerProcessConfig,
    to_argv,
)
from armature.configurator.hardware import Hardware
from armature.configurator.search import Ranked, SearchSettings, get_sim_timings, make_plan
from armature.configurator.simulate import SimPlan, make_requests
from armature.configurator.space import AGG
from armature.configurator.timing import with_limits
from armature.outputs import write_atomically
from armature.protocols.timing_profile import write_profile
from armature.protocols.worker import WorkerRole
from armature.sim.replay_config import gbs_from_bytes_s
from armature.workload.traces import TraceRequest

__all__ = ["SAVED_NAMES", "SaveRequest", "save_deployment"]

# every file a save may write, and replay.sh's report (the other files of the directory are
# not the save's: left alone)
SAVED_NAMES = frozenset(
    {
        "profile.json",
        "prefill_profile.json",
        "commands.sh",
        "commands_native.sh",
        "values.yaml",
        "planner.sh",
        "targets.json",
        "workload.jsonl",
        "replay.sh",
        "prediction.json",
        "replay.json",
    }
)


@dataclass(frozen=True)
class SaveRequest:
    save_dir: Path
    model_dir: Path  # what --model is on the command lines (a directory)
    served_model_name: str
    hardware: Hardware
    settings: SearchSettings
    chosen: Ranked


def _line(command: str, argv: list[str]) -> str:
    return shlex.join(["armature", command, *argv])


def _engine_share(req: SaveRequest) -> float:
    """Each engine's share of the host's cores at the rate the chosen deployment was
    predicted at (`Hardware.get_timing`; 1 off the local machine): the mocker's speedup
    ratio, so that the saved fleet and replay run the predicted step times."""
    r = req.chosen
    rate = r.prediction.request_rate_per_s
    if r.plan is not None:
        rate = r.plan.request_rate_per_s / r.plan.num_groups
    timing, _ = get_sim_timings(req.hardware, r, rate)
    return timing.speedup_ratio


def _engine(req: SaveRequest, profile: Path | None) -> EngineConfig:
    c = req.chosen.deployment
    return EngineConfig(
        model=str(req.model_dir),
        engine="mocker" if profile is not None else "torch",
        served_model_name=req.served_model_name,
        timing_profile=str(profile) if profile is not None else None,
        speedup_ratio=_engine_share(req) if profile is not None else 1.0,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
    )


def _kv(req: SaveRequest, tp: int) -> KvCacheConfig:
    c = req.chosen.deployment
    blocks = req.hardware.get_kv_blocks(tp, c.max_num_seqs, c.max_num_batched_tokens)
    return KvCacheConfig(num_kv_blocks=blocks)


def _roles(req: SaveRequest) -> list[tuple[WorkerRole, int, int]]:
    """(role, TP, workers) of the deployment."""
    c, groups = req.chosen.deployment, req.chosen.num_groups
    if c.mode == AGG:
        return [(WorkerRole.AGG, c.decode_tp, groups)]
    return [
        (WorkerRole.PREFILL, c.prefill_tp, groups * c.num_prefill_workers),
        (WorkerRole.DECODE, c.decode_tp, groups * c.num_decode_workers),
    ]


def _commands(req: SaveRequest, profiles: dict[WorkerRole, Path] | None) -> str:
    """The serve line (when every worker runs one profile) and the frontend/worker lines."""
    c = req.chosen.deployment
    roles = _roles(req)
    first_role = roles[-1][0]
    profile = profiles[first_role] if profiles else None
    engine, kv = _engine(req, profile), _kv(req, c.decode_tp)
    disagg = DisaggConfig(max_local_prefill_tokens=0)
    # the frontend judges requests by the targets: the planner reads its attainment
    slo = SloConfig(ttft_ms=req.settings.targets.ttft_ms, itl_ms=_planner_itl_ms(req))
    lines = [f"# {req.chosen.deployment.describe()} x{req.chosen.num_groups}"]
    if not any(req.model_dir.glob("*.safetensors")):
        lines.append(
            f"# note: {req.model_dir} holds no weights (the model's shape was read from its "
            "config alone): give --model the checkpoint's directory to run these"
        )
    lines.append("# one command: a frontend and its workers")
    same_profile = c.mode == AGG or c.prefill_tp == c.decode_tp
    if same_profile:
        serve = ServeConfig(
            engine=engine, kv=kv, router=RouterConfig(policy="kv"), disagg=disagg, slo=slo
        )
        if c.mode == AGG:
            serve = dataclasses.replace(serve, workers=roles[0][2])
        else:
            serve = dataclasses.replace(
                serve, prefill_workers=roles[0][2], decode_workers=roles[1][2]
            )
        lines.append(_line("serve", to_argv(serve)))
    else:
        lines.append("# (none: prefill and decode workers run different profiles)")
    runtime = _runtime(req)
    lines.append("# or one process each (on one host: file discovery in the directory below)")
    frontend = FrontendConfig(runtime=runtime, disagg=disagg, slo=slo)
    lines.append(_line("frontend", to_argv(frontend)))
    for role, tp, count in roles:
        role_profile = profiles[role] if profiles else None
        worker = WorkerConfig(
            engine=_engine(req, role_profile),
            kv=_kv(req, tp),
            runtime=runtime,
            process=WorkerProcessConfig(role=role),
        )
        lines.append(f"# {count} x {role.value} worker, {tp} GPU(s) each")
        lines.append(_line("worker", to_argv(worker)))
    return "\n".join(lines) + "\n"


def _write_profiles(req: SaveRequest) -> dict[WorkerRole, Path]:
    c = req.chosen.deployment
    out: dict[WorkerRole, Path] = {}
    for role, tp, _ in _roles(req):
        name = "prefill_profile.json" if role is WorkerRole.PREFILL else "profile.json"
        path = req.save_dir / name
        profile = with_limits(
            req.hardware.timings[tp].profile,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            num_kv_blocks=max(1, _kv(req, tp).num_kv_blocks or 1),
            served_model_name=req.served_model_name,
        )
        write_profile(profile, path)
        out[role] = path
    return out


def _planner_itl_ms(req: SaveRequest) -> float:
    """The planner's ITL target: --itl-ms, or what --e2e-ms leaves after --ttft-ms for the
    rest of the output, or the prediction's."""
    t, osl = req.settings.targets, req.settings.workload.osl_tokens
    if t.itl_ms is not None:
        return t.itl_ms
    if t.e2e_ms is not None and t.e2e_ms > t.ttft_ms and osl > 1:
        return (t.e2e_ms - t.ttft_ms) / (osl - 1)
    return req.chosen.prediction.itl_ms


def _values_yaml(req: SaveRequest, profiles: dict[WorkerRole, Path]) -> str:
    c, t = req.chosen.deployment, req.settings.targets
    profile = profiles.get(WorkerRole.AGG) or profiles[WorkerRole.DECODE]
    set_files = f"--set-file planner.performanceProfile={profile}"
    if WorkerRole.PREFILL in profiles and c.prefill_tp != c.decode_tp:
        prefill = profiles[WorkerRole.PREFILL]
        set_files += f" --set-file planner.prefillPerformanceProfile={prefill}"
    gpu = req.hardware.system is not None
    roles = {role: (tp, count) for role, tp, count in _roles(req)}
    lines = [
        f"# armature configure: {c.describe()} x{req.chosen.num_groups} on {req.hardware.name}",
        "# helm install armature deploy/helm/armature -f values.yaml",
        "# the planner then holds the targets from this size (it owns the replicas): add",
        f"#   --set planner.enabled=true {set_files}",
        "workers:",
        "  config:",
        "    engine:",
        f"      served-model-name: {json.dumps(req.served_model_name)}",
        f"      max-num-seqs: {c.max_num_seqs}",
        f"      max-num-batched-tokens: {c.max_num_batched_tokens}",
        "  roles:",
    ]
    for role in (WorkerRole.AGG, WorkerRole.PREFILL, WorkerRole.DECODE):
        lines.append(f"    {role.value}:")
        if role not in roles:
            lines.append("      enabled: false")
            continue
        tp, count = roles[role]
        lines += [
            "      enabled: true",
            f"      replicas: {count}",
            f"      gpus: {tp if gpu else 0}",
            f"      variant: {'cuda' if gpu else 'cpu'}",
        ]
    caveat = _planner_caveat(req)
    lines += [
        *([f"# planner note: {caveat}"] if caveat else []),
        "planner:",
        "  enabled: false",
        "  config:",
        "    planner:",
        f"      ttft-ms: {t.ttft_ms!r}",
        f"      itl-ms: {_planner_itl_ms(req)!r}",
        f"      gpus-per-worker: {c.decode_tp}",
    ]
    return "\n".join(lines) + "\n"


def _planner_caveat(req: SaveRequest) -> str:
    """What the planner cannot carry of the layout as chosen (it counts one GPU count a
    worker for both roles); "" when nothing."""
    c = req.chosen.deployment
    if c.mode == AGG or c.prefill_tp == c.decode_tp:
        return ""
    return (
        f"the prefill workers run at tp{c.prefill_tp} and the decode workers at "
        f"tp{c.decode_tp}; the planner counts {c.decode_tp} GPUs a worker of either role "
        "against --gpu-budget"
    )


def _planner_line(
    req: SaveRequest, profiles: dict[WorkerRole, Path], argv: dict[WorkerRole, list[str]]
) -> str:
    """The planner over the saved workers: each role's profile and flags where the prefill
    workers' differ (another TP: another profile and KV pool)."""
    t, c = req.settings.targets, req.chosen.deployment
    planner = PlannerConfig(
        ttft_ms=t.ttft_ms,
        itl_ms=_planner_itl_ms(req),
        mode="agg" if c.mode == AGG else "disagg",
        gpus_per_worker=c.decode_tp,
    )
    main_role = WorkerRole.AGG if WorkerRole.AGG in profiles else WorkerRole.DECODE
    service = PlannerServiceConfig(
        performance_model=str(profiles[main_role]), worker_args=(shlex.join(argv[main_role]),)
    )
    if WorkerRole.PREFILL in profiles and c.prefill_tp != c.decode_tp:
        service = dataclasses.replace(
            service,
            prefill_performance_model=str(profiles[WorkerRole.PREFILL]),
            prefill_worker_args=(shlex.join(argv[WorkerRole.PREFILL]),),
        )
    # the frontend line's discovery: the workers the planner starts register where it reads
    command = PlannerCommandConfig(planner=planner, service=service, runtime=_runtime(req))
    return _line("planner", to_argv(command))


def _runtime(req: SaveRequest) -> RuntimeConfig:
    """Where the saved processes meet on one host: file discovery in the save directory."""
    return RuntimeConfig(discovery_dir=str(req.save_dir / "discovery"))


def _replay_line(req: SaveRequest, plan: SimPlan, profiles: dict[WorkerRole, Path]) -> str:
    rc = plan.config
    argv = ["--trace", str(req.save_dir / "workload.jsonl"), "--workers", str(rc.num_workers)]
    argv += ["--router", rc.router, "--num-kv-blocks", str(rc.num_kv_blocks)]
    argv += ["--max-num-batched-tokens", str(rc.max_num_batched_tokens)]
    argv += ["--max-num-seqs", str(rc.max_num_seqs), "--seed", str(rc.seed)]
    decode_role = WorkerRole.AGG if WorkerRole.AGG in profiles else WorkerRole.DECODE
    argv += ["--timing-profile", str(profiles[decode_role])]
    if rc.num_prefill_workers:
        argv += ["--prefill-workers", str(rc.num_prefill_workers)]
        argv += ["--prefill-timing-profile", str(profiles[WorkerRole.PREFILL])]
        argv += ["--max-local-prefill-tokens", str(rc.max_local_prefill_tokens)]
        argv += ["--transfer-bandwidth-gbs", repr(gbs_from_bytes_s(rc.transfer_bandwidth_bytes_s))]
        argv += ["--kv-bytes-per-block", str(rc.kv_bytes_per_block)]
    share = _engine_share(req)
    if share != 1.0:  # the engines' share of the host's cores
        argv += ["--speedup", repr(share)]
    argv += ["--report", str(req.save_dir / "replay.json")]
    return _line("replay", argv)


def _write_trace(requests: list[TraceRequest], path: Path) -> None:
    rows = [
        json.dumps(
            {
                "timestamp": r.arrival_ms,
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
        )
        + "\n"
        for r in requests
    ]
    write_atomically(path, "".join(rows))


def save_deployment(req: SaveRequest) -> list[Path]:
    """Write the files of the module docstring into `req.save_dir`; returns their paths."""
    d = req.save_dir
    d.mkdir(parents=True, exist_ok=True)
    profiles = _write_profiles(req)
    written = list(profiles.values())
    write_atomically(d / "commands.sh", "#!/bin/sh\n" + _commands(req, profiles))
    written.append(d / "commands.sh")
    if req.hardware.system is None:  # this machine: the real engine too
        write_atomically(d / "commands_native.sh", "#!/bin/sh\n" + _commands(req, None))
        written.append(d / "commands_native.sh")
    write_atomically(d / "values.yaml", _values_yaml(req, profiles))
    # the workers the planner starts: each role's engine and KV pool the prediction was
    # made for
    argv = {
        role: to_argv(WorkerConfig(engine=_engine(req, profiles[role]), kv=_kv(req, tp)))
        for role, tp, _ in _roles(req)
    }
    caveat = _planner_caveat(req)
    note = f"# note: {caveat}\n" if caveat else ""
    write_atomically(
        d / "planner.sh",
        "#!/bin/sh\n" + note + _planner_line(req, profiles, argv) + "\n",
    )
    t, w = req.settings.targets, req.settings.workload
    targets = {"ttft_ms": t.ttft_ms, "itl_ms": t.itl_ms, "e2e_ms": t.e2e_ms}
    targets |= {"request_rate_per_s": req.settings.request_rate_per_s}
    targets |= {"isl_tokens": w.isl_tokens, "osl_tokens": w.osl_tokens}
    write_atomically(d / "targets.json", json.dumps(targets, indent=2) + "\n")
    written += [d / "values.yaml", d / "planner.sh", d / "targets.json"]
    plan = req.chosen.plan or make_plan(
        req.hardware, req.chosen, req.chosen.prediction.request_rate_per_s, req.settings
    )
    requests = make_requests(
        w, plan.request_rate_per_s, plan.num_requests, req.settings.seed, plan.arrival_shape
    )
    _write_trace(requests, d / "workload.jsonl")
    write_atomically(d / "replay.sh", "#!/bin/sh\n" + _replay_line(req, plan, profiles) + "\n")
    p = req.chosen.prediction
    prediction = {
        "configuration": req.chosen.deployment.describe(),
        "simulated": req.chosen.simulated,
    }
    prediction |= {"ttft_ms_p50": p.ttft_ms, "itl_ms_mean": p.itl_ms}
    prediction |= {"tokens_per_s_per_gpu": p.tokens_per_s_per_gpu}
    # the replay's offered rate is that of the groups it simulates, which may be fewer than
    # the deployment's (--max-sim-groups): both counts, and the rate the whole deployment
    # is offered
    prediction |= {"request_rate_per_s": plan.request_rate_per_s}
    # what the table shows: the rate one group served in the simulation (the requests that
    # finished, over the arrivals' span), not the rate offered
    prediction |= {"request_rate_per_s_per_group": p.request_rate_per_s}
    prediction |= {"simulated_groups": plan.num_groups, "groups": req.chosen.num_groups}
    rate, groups = plan.request_rate_per_s, req.chosen.num_groups
    if groups != plan.num_groups:  # all simulated: the replay's rate as it is, not x / n * n
        rate = rate / plan.num_groups * groups
    prediction |= {"deployment_request_rate_per_s": rate}
    estimate = req.chosen.estimate
    if estimate is not None:  # what the fast estimate said before the simulation
        prediction |= {"estimate_ttft_ms": estimate.ttft_ms, "estimate_itl_ms": estimate.itl_ms}
    write_atomically(d / "prediction.json", json.dumps(prediction, indent=2) + "\n")
    written += [d / "workload.jsonl", d / "replay.sh", d / "prediction.json"]
    for script in d.glob("*.sh"):
        script.chmod(0o755)
    # an earlier save's files that this one does not write (another layout's, a replay's
    # result) would read as this deployment's
    for name in SAVED_NAMES - {path.name for path in written}:
        (d / name).unlink(missing_ok=True)
    return written
