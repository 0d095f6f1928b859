"""encode_on_calling_thread, in a fresh interpreter (it sets the environment of the whole
process): a batch is then encoded without the tokenizers library's thread pool, unless the
environment asked for the pool first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

PROBE = """
import json, os, sys
from tokenizers import Tokenizer
from armature.frontend.preprocess import encode_on_calling_thread
tokenizer = Tokenizer.from_file(sys.argv[1])
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
encode_on_calling_thread()
texts = [f"segment {i} of a prompt, long enough to be worth splitting up" for i in range(64)]
ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
single = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
print(json.dumps({"new_threads": threads() - before, "same_ids": ids == single,
    "setting": os.environ["TOKENIZERS_PARALLELISM"]}))
"""


def probe(model_dir: Path, setting: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    if setting is not None:
        env["TOKENIZERS_PARALLELISM"] = setting
    tokenizer = str(model_dir / "tokenizer.json")
    command = [sys.executable, "-c", PROBE, tokenizer]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_batch_is_encoded_without_starting_the_library_pool(default_model_dir: Path) -> None:
    got = probe(default_model_dir, None)
    assert got == {"new_threads": 0, "same_ids": True, "setting": "false"}


def test_an_environment_that_asks_for_the_pool_gets_it(default_model_dir: Path) -> None:
    got = probe(default_model_dir, "true")
    assert got["setting"] == "true"
    assert isinstance(got["new_threads"], int) and got["new_threads"] >= 1
    assert got["same_ids"] is True
