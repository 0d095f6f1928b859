"""Layering (DESIGN §3): a module imports only from its own layer or lower ones."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "armature"

# lowest first; a package may import from any package at its level or below
LAYERS: list[set[str]] = [
    {"protocols", "workload"},
    {"kv", "model", "router"},
    {"engine", "engines", "sim"},
    {"runtime"},
    {"frontend", "worker", "bench"},
    {
        "cli",
        "cli_args",
        "cli_edge",
        "cli_bench",
        "cli_engine",
        "cli_replay",
        "cli_runtime",
        "cli_worker",
        "cli_frontend",
        "cli_serve_fleet",
        "cli_serve_vllm",
    },
]


def _level(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"package {package!r} is in no layer: add it to LAYERS")


def _imported_packages(path: Path) -> set[str]:
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
                out.add(parts[1])
    return out


def test_every_module_imports_only_its_layer_or_lower() -> None:
    violations = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts == ("__init__.py",):
            continue
        package = rel.parts[0].removesuffix(".py")
        for imported in _imported_packages(path):
            if _level(imported) > _level(package):
                violations.append(f"{rel} imports armature.{imported}")
    assert violations == []


def test_kv_does_not_import_the_model_and_vice_versa() -> None:
    for path in (SRC / "kv").rglob("*.py"):
        assert "model" not in _imported_packages(path), path
    for path in (SRC / "model").rglob("*.py"):
        assert "kv" not in _imported_packages(path), path
