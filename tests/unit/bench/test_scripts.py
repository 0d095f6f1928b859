"""The benchmark scripts in the root bench/ package: each is run as `python -m bench.NAME` from
the repository root, none edits sys.path or imports a sibling by its bare name, each parses its
flags (through --help, without running), and every command the docs quote is in that form and
uses only flags its script has."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from armature.sim.replay import ReplayConfig
from bench.replay_balance import BASELINE, TRACES, Candidate, Outcome, _spread, choose
from bench.replay_routing import configs, parse_args
from bench.report import command_line

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"
SCRIPTS = sorted(
    p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)
DOCS = [REPO / "docs" / "benchmarks.md", REPO / "README.md"]
# `python -m bench.NAME ARGS` inside backticks, on one line or wrapped
QUOTED_COMMAND = re.compile(r"`[^`\s]*python -m bench\.([a-z0-9_]+)([^`]*)`")


def _help(name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_bench_holds_its_scripts_and_shared_modules() -> None:
    assert SCRIPTS == [
        "block_hashing",
        "chaos",
        "configurator_fidelity",
        "configurator_gpu",
        "configurator_native",
        "decode_groups",
        "disagg_serve",
        "frontend_replicas",
        "g4_journal",
        "http_overhead",
        "kv_tiers",
        "kv_transfer",
        "loaded_steps",
        "lora_overhead",
        "overload",
        "plane_cost",
        "plane_floor",
        "profile_decode",
        "profile_fidelity",
        "replay_balance",
        "replay_disagg",
        "replay_planner",
        "replay_planner_disagg",
        "replay_planner_trim",
        "replay_routing",
        "replay_scale",
        "replay_speed",
        "replay_tiers",
        "request_plane",
        "router_latency",
        "served_steps",
        "serving_cpu",
        "soak",
        "step_shapes",
        "stream_path",
        "structured_output",
        "throughput",
        "ttft_prefix",
        "vllm_frontend_cpu",
        "vllm_throughput",
        "worker_churn",
    ]
    shared = {p.stem for p in BENCH.glob("*.py")} - set(SCRIPTS)
    assert shared == {
        "__init__",
        "configurator_checks",
        "configurator_plan",
        "harness",
        "hf_baseline",
        "paths",
        "prediction_plot",
        "profile_drift",
        "report",
        "serving",
        "stack_cpu",
    }


def test_no_bench_module_edits_sys_path_or_imports_a_sibling_by_bare_name() -> None:
    siblings = {p.stem for p in BENCH.glob("*.py")}
    offences = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offences.append(f"{path.name}:{node.lineno} uses sys.path")
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offences += [
                f"{path.name}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[0] in siblings
            ]
    assert offences == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_parses_its_flags(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _help(name, monkeypatch, capsys)
    assert out.startswith(f"usage: {name} ")
    assert "-h, --help" in out


def test_docs_quote_bench_scripts_only_as_modules_with_their_own_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    quoted: list[tuple[str, list[str]]] = []
    for doc in DOCS:
        text = doc.read_text()
        assert re.findall(r"python\S* +(?:bench/)?\w+\.py", text) == [], doc
        for name, args in QUOTED_COMMAND.findall(text):
            quoted.append((name, re.findall(r"(?<!\S)--[\w-]+", args)))
    assert len(quoted) >= 16  # one per section and a few in the prose
    for name, flags in quoted:
        assert name in SCRIPTS, name
        out = _help(name, monkeypatch, capsys)
        assert [f for f in flags if f not in out] == [], name


def test_a_section_quotes_the_module_form_of_its_command() -> None:
    argv = ["/repo/bench/vllm_throughput.py", "--targets", "vllm serve", "--quick"]
    assert (
        command_line(argv, "bench.vllm_throughput")
        == "python -m bench.vllm_throughput --targets 'vllm serve' --quick"
    )
    assert command_line(["tool.py", "--x", "1"], None) == "python tool.py --x 1"


def test_replay_routing_runs_kv_once_per_decode_weight() -> None:
    """`--kv-decode-weight 1 0.25` adds a kv replay at 0.25 whose config is the one
    `armature replay --router kv --kv-decode-weight 0.25 --num-kv-blocks 262144` builds."""
    args = parse_args(["--num-kv-blocks", "262144", "--kv-decode-weight", "1", "0.25"])
    chosen = configs(args)
    assert [(c.router, c.num_kv_blocks, c.decode_weight) for c in chosen] == [
        ("round-robin", 262144, 0.5),  # the default (which these routers do not read)
        ("least-loaded", 262144, 0.5),
        ("kv", 262144, 1.0),
        ("kv", 262144, 0.25),
    ]
    assert chosen[-1] == ReplayConfig(
        num_workers=8, router="kv", block_size=16, num_kv_blocks=262144, decode_weight=0.25
    )
    default = [(c.router, c.num_kv_blocks, c.decode_weight) for c in configs(parse_args([]))]
    assert default == [
        (router, blocks, 0.5)
        for blocks in (32768, 262144)
        for router in ("round-robin", "least-loaded", "kv")
    ]


def test_replay_balance_chooses_on_the_first_halves_only() -> None:
    """Feasible: skew <= 1.10 and >= 97% of the baseline's hit ratio on both traces; the lowest
    worst skew wins; none feasible keeps the baseline."""
    baseline, calm, sticky, lossy = (
        BASELINE,
        Candidate(0.01, 1.0),
        Candidate(0.0, 0.5),
        Candidate(0.02, 2.0),
    )
    conv, syn = TRACES

    def outcomes(**by_name: tuple[float, float]) -> dict[tuple[str, Candidate], Outcome]:
        table = {}
        for name, (hit, skew) in by_name.items():
            candidate = {"base": baseline, "calm": calm, "sticky": sticky, "lossy": lossy}[
                name.split("_")[0]
            ]
            trace = conv if name.endswith("_conv") else syn
            table[(trace, candidate)] = Outcome(hit, skew, 1.0, 1.0)
        return table

    tuned = outcomes(
        base_conv=(0.30, 1.05), base_syn=(0.60, 1.08),
        calm_conv=(0.295, 1.03), calm_syn=(0.59, 1.04),
        sticky_conv=(0.31, 1.01), sticky_syn=(0.62, 1.12),  # skew past 1.10 on one trace
        lossy_conv=(0.28, 1.00), lossy_syn=(0.55, 1.00),  # 93% of the default's hit
    )  # fmt: skip
    candidates = [baseline, calm, sticky, lossy]
    assert choose(candidates, tuned, baseline) == calm
    del candidates[1]
    assert choose(candidates, tuned, baseline) == baseline
    tuned[(syn, baseline)] = Outcome(0.60, 1.2, 1.0, 1.0)  # the baseline itself infeasible
    assert choose([baseline, sticky, lossy], tuned, baseline) == baseline


def test_replay_balance_prefers_a_capped_skew_then_the_most_hits() -> None:
    """A share bound at or below 1.08 caps a busy worker's share, so among feasible candidates
    a capped one wins with the highest worst hit share, over an uncapped one with a lower
    skew; a bound at 1.09 is not a cap (too near 1.10)."""
    conv, syn = TRACES
    calm, tight, loose, near = (
        Candidate(0.01, 1.0),
        Candidate(0.01, 0.5, share_bound=1.03, share_window=512),
        Candidate(0.01, 0.5, share_bound=1.08, share_window=512),
        Candidate(0.01, 0.5, share_bound=1.09, share_window=512),
    )
    rows = {
        BASELINE: ((0.30, 1.05), (0.60, 1.08)),
        calm: ((0.30, 1.01), (0.60, 1.01)),  # the lowest skew, no cap
        tight: ((0.295, 1.02), (0.590, 1.02)),  # capped, 98.3% of the base's hits
        loose: ((0.300, 1.05), (0.596, 1.05)),  # capped, 99.3%
        near: ((0.310, 1.04), (0.600, 1.04)),  # the most hits, but not a cap
    }
    tuned = {
        (trace, candidate): Outcome(hit, skew, 1.0, 1.0)
        for candidate, pairs in rows.items()
        for trace, (hit, skew) in zip((conv, syn), pairs, strict=True)
    }
    assert choose([BASELINE, calm, tight, loose, near], tuned, BASELINE) == loose
    tuned[(syn, loose)] = Outcome(0.58, 1.03, 1.0, 1.0)  # 96.7%: infeasible
    assert choose([BASELINE, calm, tight, loose, near], tuned, BASELINE) == tight
    # no capped candidate: the lowest worst skew, as before
    assert choose([BASELINE, calm, near], tuned, BASELINE) == calm


def test_replay_balance_spreads_seeds_as_median_and_range() -> None:
    assert _spread([1.09], ".3f") == "1.090"
    assert _spread([1.13, 1.074, 1.09], ".3f") == "median 1.090 (1.074-1.130)"
    assert _spread([0.977, 0.971], ".1%") == "median 97.4% (97.1%-97.7%)"


def test_replay_balance_labels_a_bound_only_when_set() -> None:
    assert Candidate(0.01, 0.5).label == "temperature 0.01, decode weight 0.5"
    assert Candidate(0.0, 1.0, 1.5).label == "temperature 0, decode weight 1, load bound 1.5"
    assert (
        Candidate(0.0, 1.0, 0.0, 1.05, 512).label
        == "temperature 0, decode weight 1, share bound 1.05 over 512"
    )
