"""The local machine's cores, shared by the workers' engines and the rest of the serving stack.

On `--system local` a worker is one core (an engine thread, one torch thread), measured alone
by `armature profile`. Served, it is not alone: the frontend, each worker's shell (the request
plane, streaming, KV events) and any load generator on the same host take CPU, some of it
whatever the load (timers, load reports, metrics: `stack_idle_cores`) and the rest per
request, and more workers than cores take turns. Each busy engine's steps take 1 / share as
long, where share is the part of a core it gets:

    stack_cores  = stack_idle_cores + stack_cpu_s_per_request * rate_per_s
    shell_cores  = shell_cpu_s_per_request * rate_per_s      (part of stack_cores)
    workers <= cores:  share = 1 - shell_cores / workers - (stack_cores - shell_cores) / cores
    workers >  cores:  share = (cores - stack_cores) / workers

A worker's shell runs in its engine's process and takes turns with the engine under the
process's interpreter lock, so each engine loses its own shell's CPU (the rate spread evenly
over the workers). The rest of the stack is not given a core of its own: the scheduler runs
it on every core, the engines' included, so each core loses an equal part of it even while
one is free. More engines than cores share what the whole stack leaves. The two rules meet
at workers = cores. (Chosen on measured 1-worker runs on 2 cores, where a lone served
engine's steps ran 2-10% slower than its solo profile; docs/benchmarks.md,
`configurator_native`.)

The engines are taken as busy (the operating points a search looks for are loaded ones);
below that, the formula is pessimistic by at most the idle engines' share. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_ENGINE_SHARE", "HostShare"]

# a stack that asks for the whole host still leaves the engines this much each (the
# scheduler does not starve them); the predictions at such a rate are far off their targets
MIN_ENGINE_SHARE = 0.05


@dataclass(frozen=True)
class HostShare:
    """`num_cores` cores; the serving stack besides the engines takes `stack_idle_cores`
    whatever the load and `stack_cpu_s_per_request` CPU seconds per request (for the
    workload's lengths), of which `shell_cpu_s_per_request` in the workers' own processes."""

    num_cores: float
    stack_cpu_s_per_request: float = 0.0
    stack_idle_cores: float = 0.0
    shell_cpu_s_per_request: float = 0.0

    def __post_init__(self) -> None:
        if self.num_cores <= 0:
            raise ValueError(f"num_cores must be > 0, got {self.num_cores}")
        for name in ("stack_cpu_s_per_request", "stack_idle_cores", "shell_cpu_s_per_request"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.shell_cpu_s_per_request > self.stack_cpu_s_per_request:
            raise ValueError(
                f"shell_cpu_s_per_request ({self.shell_cpu_s_per_request}) is part of "
                f"stack_cpu_s_per_request ({self.stack_cpu_s_per_request}) and cannot exceed it"
            )

    def get_stack_cores(self, rate_per_s: float) -> float:
        """The cores the stack takes while the deployment serves `rate_per_s` requests/s."""
        return self.stack_idle_cores + self.stack_cpu_s_per_request * max(0.0, rate_per_s)

    def get_engine_share(self, num_workers: int, rate_per_s: float) -> float:
        """The share of a core each of `num_workers` busy engines gets while the deployment
        serves `rate_per_s` requests/s in all."""
        if num_workers <= 0:
            raise ValueError(f"num_workers must be > 0, got {num_workers}")
        stack_cores = self.get_stack_cores(rate_per_s)
        if num_workers > self.num_cores:
            share = (self.num_cores - stack_cores) / num_workers
        else:
            shell_cores = self.shell_cpu_s_per_request * max(0.0, rate_per_s)
            rest_cores = stack_cores - shell_cores
            share = 1.0 - shell_cores / num_workers - rest_cores / self.num_cores
        return max(MIN_ENGINE_SHARE, min(1.0, share))
