"""The real engine on this CPU, aggregated vs disaggregated, with the default model in float32.

agg:    `armature serve --workers 2` (two worker processes behind the frontend)
disagg: `armature serve --prefill-workers 1 --decode-workers 1` (shm KV transfer; every prompt
        prefilled on the prefill worker: --max-local-prefill-tokens 0)
Load: `armature bench`, closed loop at concurrency 1 and 4, 512-token prompts (no shared
prefixes), 64 output tokens, ignore_eos. Reported: TTFT and ITL p50/p99, output tokens/s.

    python -m bench.disagg_serve [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section
from bench.serving import run_armature_bench, wait_healthy

LAYOUTS = {
    "agg": ["--workers", "2"],
    "disagg 1:1": [
        "--prefill-workers",
        "1",
        "--decode-workers",
        "1",
        "--max-local-prefill-tokens",
        "0",
    ],
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "armature.cli",
        "serve",
        "--dtype",
        "float32",
        "--num-kv-blocks",
        "2048",
        "--port",
        str(port),
        *args,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log, timeout_s=300, poll_s=0.5)
    return proc, url


def bench(url: str, concurrency: int, num_requests: int, out: Path) -> dict[str, object]:
    return run_armature_bench(
        url,
        concurrency=concurrency,
        num_requests=num_requests,
        input_len=512,
        output_len=64,
        out=out,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout, flags in LAYOUTS.items():
            proc, url = serve(flags, Path(tmp) / f"{layout}.log")
            try:
                for concurrency in (1, 4):
                    n = 4 if args.quick else 8 * concurrency
                    s = bench(url, concurrency, n, Path(tmp) / f"{layout}-{concurrency}")
                    ttft, itl = s["ttft_ms"], s["itl_ms"]
                    rows.append(
                        [
                            layout,
                            concurrency,
                            n,
                            f"{ttft['p50']:.0f}",
                            f"{ttft['p99']:.0f}",  # type: ignore[index]
                            f"{itl['p50']:.1f}",
                            f"{itl['p99']:.1f}",  # type: ignore[index]
                            f"{s['output_tokens_per_s']:.1f}",
                        ]
                    )
                    print(rows[-1], flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    body = (
        "The default model (SmolLM2-135M-Instruct) in float32 on this CPU; two worker processes "
        "in both layouts, sharing the machine's 2 cores with the frontend and the client. "
        "512-token prompts without shared prefixes, 64 output tokens.\n\n"
        + markdown_table(
            [
                "layout",
                "concurrency",
                "requests",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "ITL p99 ms",
                "output tok/s",
            ],
            rows,
        )
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section(
            "disagg_serve", "Disaggregated serving: the real engine on this CPU", body, "float32"
        ),
        get_machine_facts(),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
