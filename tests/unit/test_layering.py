"""Layering (DESIGN §2): a module imports only from its own layer or lower ones; the frontend
and the router never load torch or the KV transfer package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "armature"

# lowest first; a module may import from any module at its level or below. A module is
# placed by its most specific entry: "router.service" wins over "router".
LAYERS: list[set[str]] = [
    {"protocols", "workload", "config", "errors", "backends", "outputs"},
    {"kv", "model", "router", "planner", "grammar"},
    # the planner's performance model read off the mocker's step-time models
    {"transfer", "engines", "sim", "tiers", "planner.timing_performance", "configurator"},
    {"runtime"},
    {
        "frontend",
        "worker",
        "bench",
        "profiler",
        "router.service",
        "router.event_sync",
        "router.disagg",
        "router.embedding",
        "planner.connectors",
        "planner.actuator",
        "planner.frontend_feed",
        "planner.worker_feed",
        "planner.metrics",
        "planner.service",
        "planner.main",
    },
    {"cli"},
]


def _level(module: str) -> int:
    """The layer of a dotted module path under armature (e.g. "router.service")."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        for i, layer in enumerate(LAYERS):
            if name in layer:
                return i
    raise AssertionError(f"module {module!r} is in no layer: add it to LAYERS")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "armature" and len(parts) > 1:
                out.add(".".join(parts[1:]))
    return out


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def test_every_module_imports_only_its_layer_or_lower() -> None:
    violations = []
    for path in SRC.rglob("*.py"):
        module = _module_of(path)
        if not module:
            continue
        for imported in _imported_modules(path):
            if _level(imported) > _level(module):
                violations.append(f"{module} imports armature.{imported}")
    assert violations == []


def _import_cycle() -> list[str]:
    """One cycle of armature modules importing each other (lazy imports count), or []."""
    modules = {_module_of(p): p for p in SRC.rglob("*.py") if _module_of(p)}
    graph = {m: sorted(_imported_modules(p) & modules.keys() - {m}) for m, p in modules.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for imported in graph[module]:
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return []


def test_no_module_imports_itself_through_others() -> None:
    """Imports go one way, even between modules of one layer (e.g. sim.replay and
    sim.replay_disagg share sim.simulation instead of importing each other)."""
    assert _import_cycle() == []


def test_the_layer_rule_is_by_module() -> None:
    assert _level("router.policies") == 1
    assert _level("router.service") == 4
    assert _level("cli.serve") == 5


def test_kv_does_not_import_the_model_and_vice_versa() -> None:
    for path in (SRC / "kv").rglob("*.py"):
        assert not any(m.startswith("model") for m in _imported_modules(path)), path
    for path in (SRC / "model").rglob("*.py"):
        assert not any(m.startswith("kv") for m in _imported_modules(path)), path


def test_kv_stays_pure() -> None:
    """Block identity, hashing and the pool: no torch, sockets or threads."""
    for path in (SRC / "kv").rglob("*.py"):
        imported = {
            a.name.split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import)
            for a in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 0
        }
        assert not imported & {"torch", "socket", "threading", "asyncio"}, path


def test_frontend_and_router_load_neither_torch_nor_kv_transfer() -> None:
    code = (
        "import sys, armature.frontend.app, armature.frontend.fleet, armature.router, "
        "armature.router.service, armature.router.disagg\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') "
        "or m.startswith('armature.transfer') or m.startswith('armature.engines.native'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
