"""Hardware profiles: one accelerator and the node it sits in, as data (`systems/*.json`,
shipped in the package), every number with its public source or the assumption it is.

    {"name": "h100_sxm", "description": "...",
     "peak_flops_per_s": {"bfloat16": {"value": 9.89e14, "source": "..."}, ...},
     "memory_bandwidth_bytes_s": {"value": 3.35e12, "source": "..."}, ...}

Bandwidths are per GPU and per direction. The efficiency factors are the fractions of a
peak that real kernels reach; they are assumptions, and say so in their source.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

from armature.errors import ConfigError

__all__ = ["LOCAL_SYSTEM", "Sourced", "SystemSpec", "list_systems", "load_system"]

# the name of the system measured on this machine (`--timing-profile`), not a file
LOCAL_SYSTEM = "local"

_Positive = Annotated[float, msgspec.Meta(gt=0)]


class Sourced(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A number and where it comes from (a datasheet, a document, or "assumption: ...")."""

    value: _Positive
    source: Annotated[str, msgspec.Meta(min_length=1)]


class SystemSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str
    peak_flops_per_s: dict[str, Sourced]  # dense (no sparsity), by dtype
    memory_bandwidth_bytes_s: Sourced
    memory_capacity_bytes: Sourced
    intra_node_bandwidth_bytes_s: Sourced  # NVLink (or PCIe), per GPU, one direction
    inter_node_bandwidth_bytes_s: Sourced  # the network, per GPU, one direction
    gpus_per_node: Sourced
    gemm_efficiency: Sourced  # of peak FLOP/s, compute-bound GEMMs
    attention_efficiency: Sourced  # of peak FLOP/s, attention kernels
    memory_efficiency: Sourced  # of the memory bandwidth
    link_efficiency: Sourced  # of a link's bandwidth (all-reduce, KV transfer)
    link_latency_s: Sourced  # one hop of a collective
    step_overhead_s: Sourced  # an engine step's fixed cost (scheduling, launches)
    memory_utilization: Sourced  # of the capacity an engine may take
    reserved_bytes: Sourced  # taken whatever runs: the runtime, CUDA graphs, buffers

    def get_peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s in `dtype`; ConfigError when the accelerator has none in it."""
        peak = self.peak_flops_per_s.get(dtype)
        if peak is None:
            known = ", ".join(self.peak_flops_per_s)
            raise ConfigError(f"system {self.name} has no {dtype} math (it has: {known})")
        return peak.value

    def get_num_gpus_per_node(self) -> int:
        return int(self.gpus_per_node.value)


def _shipped() -> dict[str, resources.abc.Traversable]:
    folder = resources.files("armature.configurator") / "systems"
    return {f.name.removesuffix(".json"): f for f in folder.iterdir() if f.name.endswith(".json")}


def list_systems() -> list[str]:
    """The shipped systems' names, and the local one."""
    return [*sorted(_shipped()), LOCAL_SYSTEM]


def load_system(name: str) -> SystemSpec:
    """A shipped system by name, or a JSON file of the same form by path. ConfigError (one
    line) for an unknown name or a file that is not a system."""
    shipped = _shipped()
    if name in shipped:
        data, where = shipped[name].read_bytes(), name
    elif name.endswith(".json"):
        try:
            data, where = Path(name).read_bytes(), name
        except OSError as exc:
            raise ConfigError(f"--system {name}: {exc.strerror}") from None
    else:
        raise ConfigError(f"unknown system {name!r}; choose from {', '.join(list_systems())}")
    try:
        system = msgspec.json.decode(data, type=SystemSpec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"system {where} is not a valid hardware profile: {exc}") from None
    for field_name, fraction in _fractions(system):
        if fraction > 1.0:
            raise ConfigError(
                f"system {where} is not a valid hardware profile: {field_name} is a fraction "
                f"(at most 1), got {fraction:g}"
            )
    per_node = system.gpus_per_node.value
    if per_node != int(per_node):
        raise ConfigError(
            f"system {where} is not a valid hardware profile: gpus_per_node must be a whole "
            f"number, got {per_node:g}"
        )
    return system


def _fractions(system: SystemSpec) -> list[tuple[str, float]]:
    """The profile's numbers that are shares of a peak or a capacity."""
    names = [
        "gemm_efficiency",
        "attention_efficiency",
        "memory_efficiency",
        "link_efficiency",
        "memory_utilization",
    ]
    return [(name, getattr(system, name).value) for name in names]
