"""Only safe formats: nothing in the package unpickles (no pickle module, no torch.load) or
runs a model's remote code; wire and disk formats are msgpack, JSON and safetensors."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "armature"


def test_no_pickle_no_torch_load_no_remote_code() -> None:
    offenders = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in {"pickle", "cPickle", "dill", "marshal"} for n in names):
                    offenders.append(f"{path.name}: imports {names}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "load"
                and isinstance(node.value, ast.Name)
                and node.value.id in {"torch", "pickle"}
            ):
                offenders.append(f"{path.name}:{node.lineno}: {node.value.id}.load")
            if (
                isinstance(node, ast.keyword)
                and node.arg == "trust_remote_code"
                and not (isinstance(node.value, ast.Constant) and node.value.value is False)
            ):
                offenders.append(f"{path.name}:{node.value.lineno}: trust_remote_code")
    assert offenders == []
