"""The local machine's cores, shared by the workers' engines and the rest of the serving stack.

On `--system local` a worker is one core (an engine thread, one torch thread), measured alone
by `armature profile`. Served, it is not alone: the frontend, each worker's shell (the request
plane, streaming, KV events) and any load generator on the same host take CPU, some of it
whatever the load (timers, load reports, metrics: `stack_idle_cores`) and the rest per
request, and more workers than cores take turns. Each busy engine's steps take 1 / share as
long, where share is the part of a core it gets:

    stack_cores = stack_idle_cores + stack_cpu_s_per_request * rate_per_s
    own_cores   = (shell_cpu_s_per_request, and frontend_cpu_s_per_request for a lone
                   worker) * rate_per_s                        (part of stack_cores)
    rest_cores  = stack_cores - own_cores
    workers <  cores:  share = 1 - (own_cores + max(0, rest_cores - (cores - workers))) / workers
    workers >= cores:  share = (cores - stack_cores) / workers

What runs in an engine's own process takes turns with the engine under the process's
interpreter lock, whatever cores are free: the worker's shell, and for a lone worker the
frontend too (`armature serve` runs one worker in the frontend's process, as the saved serve
line does). The rest of the stack runs on the cores no engine holds, and only what does not
fit there comes off the engines, equally. More engines than cores share what the whole stack
leaves; the two rules meet at workers = cores. (Measured on 2 cores: a lone served engine's
steps ran 2-10% slower than its solo profile, growing with the rate, about as much as the
frontend's and its shell's CPU; docs/benchmarks.md, `configurator_native`.)

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
    workload's lengths), of which `shell_cpu_s_per_request` in the workers' own processes and
    `frontend_cpu_s_per_request` in the frontend's."""

    num_cores: float
    stack_cpu_s_per_request: float = 0.0
    stack_idle_cores: float = 0.0
    shell_cpu_s_per_request: float = 0.0
    frontend_cpu_s_per_request: float = 0.0

    def __post_init__(self) -> None:
        if self.num_cores <= 0:
            raise ValueError(f"num_cores must be > 0, got {self.num_cores}")
        parts = ("shell_cpu_s_per_request", "frontend_cpu_s_per_request")
        for name in ("stack_cpu_s_per_request", "stack_idle_cores", *parts):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        in_parts = self.shell_cpu_s_per_request + self.frontend_cpu_s_per_request
        if in_parts > self.stack_cpu_s_per_request:
            raise ValueError(
                f"the shells' and the frontend's CPU ({in_parts:g} s a request) are part of "
                f"stack_cpu_s_per_request ({self.stack_cpu_s_per_request:g}) and cannot "
                f"exceed it"
            )

    def get_stack_cores(self, rate_per_s: float) -> float:
        """The cores the stack takes while the deployment serves `rate_per_s` requests/s."""
        return self.stack_idle_cores + self.stack_cpu_s_per_request * max(0.0, rate_per_s)

    def get_own_cores(self, num_workers: int, rate_per_s: float) -> float:
        """The stack's cores that run in the engines' own processes, all engines together:
        the workers' shells, and the frontend for a lone worker (it runs in its process)."""
        per_request_s = self.shell_cpu_s_per_request
        if num_workers == 1:
            per_request_s += self.frontend_cpu_s_per_request
        return per_request_s * max(0.0, rate_per_s)

    def get_engine_share(self, num_workers: int, rate_per_s: float) -> float:
        """The share of a core each of `num_workers` busy engines gets while the deployment
        serves `rate_per_s` requests/s in all."""
        if num_workers <= 0:
            raise ValueError(f"num_workers must be > 0, got {num_workers}")
        stack_cores = self.get_stack_cores(rate_per_s)
        if num_workers >= self.num_cores:
            share = (self.num_cores - stack_cores) / num_workers
        else:
            own_cores = self.get_own_cores(num_workers, rate_per_s)
            spill_cores = max(0.0, stack_cores - own_cores - (self.num_cores - num_workers))
            share = 1.0 - (own_cores + spill_cores) / num_workers
        return max(MIN_ENGINE_SHARE, min(1.0, share))
