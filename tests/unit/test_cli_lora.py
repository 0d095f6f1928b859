"""`--lora NAME=DIR` mistakes end the command with one line and exit code 2, before serving:
the flag's form, a name given twice, engines that serve no adapters, and adapter directories
that cannot be served over the model (read when the engine is built)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from armature.cli.main import main
from lora_adapters import make_adapter
from servers import free_port


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora", "sql"], "argument --lora: expected NAME=DIR"),
        (["--lora", "a=/x", "--lora", "a=/y"], "--lora: the adapter name 'a' is given twice"),
        (["--lora", "a b=/x"], "--lora: adapter name 'a b' must start with a letter or digit"),
        (["--lora", "a=/x", "--task", "embed"], "--task embed takes no --lora"),
        (["--lora", "smol=/x", "--served-model-name", "smol"], "'smol' is the base model's name"),
    ],
)
def test_flag_mistakes(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["serve", *argv], capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("armature: error: ") and message in err[0], err


def test_bad_adapter_directories(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = make_adapter(tiny_llama_dir, tmp_path / "good", seed=3)
    wrong_rank = make_adapter(tiny_llama_dir, tmp_path / "rank", seed=3)
    config_file = wrong_rank / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "r": 2}))
    nan = Path(shutil.copytree(good, tmp_path / "nan"))
    tensors = load_file(nan / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[key][0, 0] = math.nan
    save_file(tensors, nan / "adapter_model.safetensors")
    capsys.readouterr()  # transformers' progress bars while making the adapters
    serve = ["serve", "--model", str(tiny_llama_dir), "--dtype", "float32", "--device", "cpu"]
    cases = {
        str(tmp_path / "missing"): "is not a directory",
        str(tmp_path): "needs adapter_config.json and adapter_model.safetensors",
        str(wrong_rank): "has shape [4, 128], expected [2, 128]",
        str(nan): f"{key} has non-finite values",
    }
    for path, message in cases.items():
        port = str(free_port())
        code, err = _run(
            [*serve, "--port", port, "--lora", f"good={good}", "--lora", f"x={path}"], capsys
        )
        assert code == 2
        assert len(err) == 1 and err[0].startswith("armature: error: --lora x: "), err
        assert message in err[0]
