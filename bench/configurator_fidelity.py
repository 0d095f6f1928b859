"""How far `armature configure`'s predictions are from the simulator at fleet scale, and its
fast estimate from its own simulation (issue "Configurator", Validation: "the configurator's
predictions match `armature replay` of the same configurations within 5%").

For each case (a model config, a system, a workload and targets) the configurator searches as
`armature configure` does. For each simulated finalist:

    estimate    the closed-form estimate at the finalist's operating point
    predicted   the configurator's prediction: min(groups, --max-sim-groups) groups (4 by
                default) replayed at the rate the search offered it (the estimated rate,
                or less where the step margin or the TTFT growth limit made it retry): a
                deployment of up to that many
                groups is its own fleet replay, so the comparison tells only for more
    fleet       `armature replay` of the whole deployment: every group, the whole rate, the
                same kv router, as many requests per group

and the errors of TTFT (median) and ITL (mean) between them. The measured-run validation
(the native engine on this machine, `--system local`) is bench/configurator_native.py.

    python -m bench.configurator_fidelity [--quick] [--max-sim-groups N]

Writes the `configurator_fidelity` section of docs/benchmarks.md (bench/out/ with --quick).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from armature.config.configure import ConfigureConfig
from armature.configurator.hardware import accelerator_hardware
from armature.configurator.model_spec import read_model_spec
from armature.configurator.search import Ranked, SearchSettings, search
from armature.configurator.simulate import make_requests, simulate
from armature.configurator.space import SearchSpace, Targets, Workload
from armature.configurator.systems import load_system
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

# Llama-3.1-8B's config.json (the public shape; no weights needed)
LLAMA_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
MAX_FLEET_REQUESTS = 8000  # the same requests per group as the prediction's, up to this


@dataclass(frozen=True)
class Case:
    name: str
    system: str
    total_gpus: int
    workload: Workload
    targets: Targets


CASES = (
    Case("chat", "h100_sxm", 4, Workload(1024.0, 256.0, 0.2), Targets(500.0, 50.0)),
    Case("long prompts", "h100_sxm", 4, Workload(4096.0, 128.0, 0.2), Targets(1000.0, 30.0)),
    # more groups than a prediction replays (SearchSettings.max_sim_groups)
    Case("chat, 8 GPUs", "h100_sxm", 8, Workload(1024.0, 256.0, 0.2), Targets(500.0, 50.0)),
)


def _error(value: float, reference: float) -> float:
    return (value - reference) / reference * 100.0 if reference else 0.0


def _fleet(hardware: object, r: Ranked, settings: SearchSettings) -> tuple[float, float]:
    """(TTFT median, ITL mean) of the whole deployment replayed."""
    assert r.plan is not None
    groups, simulated = r.num_groups, r.plan.num_groups  # the prediction replayed `simulated`
    plan = replace(
        r.plan,
        num_groups=groups,
        request_rate_per_s=r.plan.request_rate_per_s / simulated * groups,
        num_requests=min(MAX_FLEET_REQUESTS, r.plan.num_requests // simulated * groups),
        arrival_shape=1,
        config=replace(
            r.plan.config,
            num_workers=r.plan.config.num_workers // simulated * groups,
            num_prefill_workers=r.plan.config.num_prefill_workers // simulated * groups,
        ),
    )
    timings = hardware.timings  # type: ignore[attr-defined]
    c = r.deployment
    # the whole fleet: one Poisson stream over every group
    requests = make_requests(settings.workload, plan.request_rate_per_s, plan.num_requests, 0)
    prefill = timings[c.prefill_tp].timing if c.prefill_tp else None
    fleet = simulate(plan, requests, timings[c.decode_tp].timing, prefill)
    return fleet.ttft_ms, fleet.itl_ms


def run_case(
    case: Case, model_dir: Path, quick: bool, max_sim_groups: int = 1
) -> list[list[object]]:
    model = read_model_spec(model_dir, "bfloat16")
    space = SearchSpace()
    hardware = accelerator_hardware(model, load_system(case.system), space, case.total_gpus, "m")
    settings = SearchSettings(
        case.workload,
        case.targets,
        case.total_gpus,
        num_finalists=2 if quick else 3,
        sim_budget_s=15.0 if quick else 60.0,
        max_sim_groups=max_sim_groups,
        step_margin=ConfigureConfig().step_margin,  # as `armature configure` searches
        max_ttft_growth=ConfigureConfig().max_ttft_growth,
    )
    result = search(hardware, settings, on_progress=print)
    rows: list[list[object]] = []
    for r in (r for r in result.ranked if r.simulated):
        assert r.estimate is not None
        started_s = time.perf_counter()
        fleet_ttft, fleet_itl = _fleet(hardware, r, settings)
        p, e = r.prediction, r.estimate
        rows.append(
            [
                case.name,
                f"{r.deployment.describe()} x{r.num_groups}",
                f"{e.ttft_ms:.1f} / {e.itl_ms:.2f}",
                f"{p.ttft_ms:.1f} / {p.itl_ms:.2f}",
                f"{fleet_ttft:.1f} / {fleet_itl:.2f}",
                f"{_error(e.ttft_ms, p.ttft_ms):+.1f} / {_error(e.itl_ms, p.itl_ms):+.1f}",
                f"{_error(p.ttft_ms, fleet_ttft):+.1f} / {_error(p.itl_ms, fleet_itl):+.1f}",
                round(time.perf_counter() - started_s, 1),
            ]
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one case, two finalists")
    parser.add_argument(
        "--max-sim-groups",
        type=int,
        default=SearchSettings.max_sim_groups,
        help="groups each prediction replays together (at most the deployment's own)",
    )
    args = parser.parse_args()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(LLAMA_8B))
        for case in CASES[:1] if args.quick else CASES:
            rows += run_case(case, model_dir, args.quick, args.max_sim_groups)
    body = (
        "Llama-3.1-8B's shape in bfloat16 on the shipped hardware profiles; lengths within "
        "+-20% of the means; the default search space. The fleet: one Poisson stream over "
        "every group; the prediction: min(N, --max-sim-groups) of the N groups, their "
        f"arrivals that many groups' share of the stream (--max-sim-groups {args.max_sim_groups}). "
        "TTFT is the median, ITL the mean, in ms (estimate / predicted / fleet: TTFT / ITL). "
        "Errors in %: the estimate against the prediction, and the prediction "
        "against the whole fleet replayed (target: within 5%). A shared, loaded 2-core CPU "
        "machine; the wall time is the fleet replay's.\n\n"
        + markdown_table(
            [
                "case",
                "deployment",
                "estimate",
                "predicted",
                "fleet",
                "estimate err %",
                "predicted vs fleet err %",
                "fleet wall s",
            ],
            rows,
        )
        + "\n"
    )
    out = results_path(args.quick)
    section = Section("configurator_fidelity", "Configurator: predictions vs replay", body, "n/a")
    write_section(out, section, get_machine_facts())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
