"""The Helm values `armature configure --save-dir` writes render with the chart: the roles'
replicas and GPUs, the batch limits on every worker, the planner's targets and profile."""

from __future__ import annotations

import json
from pathlib import Path

from helm_chart import RELEASE, load_values, render

from armature.cli.main import main

TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
}


def test_saved_values_render_the_chosen_disaggregated_deployment(tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    save = tmp_path / "out"
    argv = ["configure", "--model", str(tmp_path / "tiny"), "--modes", "disagg", "--tp", "1"]
    argv += ["--max-num-seqs", "16", "--max-num-batched-tokens", "2048", "--finalists", "1"]
    argv += ["--isl", "256", "--osl", "32", "--total-gpus", "4", "--ttft-ms", "400"]
    argv += ["--itl-ms", "40", "--save-dir", str(save)]
    assert main(argv) == 0
    values = load_values(save / "values.yaml")
    manifests = render(values)
    roles = values["workers"]["roles"]
    assert (roles["prefill"]["replicas"], roles["decode"]["replicas"]) != (0, 0)
    for role in ("prefill", "decode"):
        deployment = manifests.get("Deployment", f"{RELEASE}-armature-{role}")
        assert deployment["spec"]["replicas"] == roles[role]["replicas"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        args = container["args"]
        assert args[args.index("--max-num-seqs") + 1] == "16"
        assert args[args.index("--max-num-batched-tokens") + 1] == "2048"
    assert f"{RELEASE}-armature-agg" not in manifests.names("Deployment")
    # the planner, switched on as the file's comment says, holds the saved targets
    values["planner"] |= {
        "enabled": True,
        "performanceProfile": (save / "profile.json").read_text(),
    }
    planner = render(values).get("Deployment", f"{RELEASE}-armature-planner")
    [container] = planner["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert float(args[args.index("--ttft-ms") + 1]) == 400.0
    assert float(args[args.index("--itl-ms") + 1]) == 40.0
