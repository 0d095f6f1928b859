"""Benchmark scripts: each writes one marked section of docs/benchmarks.md.

Run one from the repository root as a module, e.g.

    python -m bench.replay_routing --help
    python -m bench.throughput --quick      # smoke run, writes bench/out/benchmarks.md

Scripts (each has a `main()`): chaos, disagg_serve, http_overhead, kv_transfer, overload,
profile_decode, replay_disagg, replay_routing, request_plane, router_latency, soak,
throughput, ttft_prefix, vllm_frontend_cpu, vllm_throughput, worker_churn. Shared modules:
`paths` (where results and traces live), `report` (sections and tables), `harness` (driving
an EngineCore), `hf_baseline` (transformers' side), `serving` (a server under `armature
bench`).
"""
