"""The soak, reported: tests/integration/test_soak.py run for --duration-s (default 600 s,
the 10-minute soak) with its samples kept: RSS of the frontend and both mocker workers at the
end of warm-up and at the end, and the router index against its bound. The test's own
assertions (growth < 5%, index within bound, every request 200) decide pass or fail.

    python -m bench.soak [--duration-s 600] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.paths import REPO_ROOT, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--quick", action="store_true", help="90 s, written to bench/out/")
    args = parser.parse_args()
    duration_s = 90.0 if args.quick else args.duration_s
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "soak.json"
        env = {
            **os.environ,
            "ARMATURE_SOAK_S": str(duration_s),
            "ARMATURE_SOAK_REPORT": str(report),
        }
        test = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_soak.py"]
        test += ["-o", f"timeout={int(duration_s) + 300}"]
        result = subprocess.run([sys.executable, *test], cwd=REPO_ROOT, env=env)
        data = json.loads(report.read_text())
    samples = data["samples"]
    after = [s for s in samples if s["t_s"] >= data["warmup_s"]]
    base, end = after[0], samples[-1]
    rows = []
    for process in ("frontend", "w0", "w1"):
        growth = max(s[process] for s in after[-3:]) / base[process] - 1
        rows.append(
            [
                process,
                f"{base[process] / 1024:.1f}",
                f"{end[process] / 1024:.1f}",
                f"{max(s[process] for s in after) / 1024:.1f}",
                f"{growth * 100:+.2f}%",
                "pass" if growth < 0.05 else "MISS",
            ]
        )
    index_max = max(s["index"] for s in samples)
    bound = samples[-1]["bound"]
    body = (
        f"`tests/integration/test_soak.py` for {duration_s:.0f} s: a frontend (kv router) and 2 "
        "mocker workers (speedup 1, 512 KV blocks each, so prefixes are evicted and the index "
        "churns), 6 closed-loop clients sending prompts from 40 shared prefixes plus a unique "
        f"tail, 8-64 output tokens. Warm-up: the first {data['warmup_s']:.0f} s. "
        f"{data['requests']} requests, test {'passed' if result.returncode == 0 else 'FAILED'}."
        "\n\n"
        + markdown_table(
            ["process", "RSS after warm-up MiB", "RSS at end MiB", "max MiB", "growth", "< 5%"],
            rows,
        )
        + f"\n\nRouter index: at most {index_max:.0f} (worker, block) entries against a bound "
        f"of {bound:.0f} ({'within' if index_max <= bound else 'OVER'} the bound).\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("soak", "Soak: memory and index under steady load", body, "n/a"),
        get_machine_facts(),
    )
    print(body)
    print(f"wrote {out}")
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
