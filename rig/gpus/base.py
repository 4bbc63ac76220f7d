"""The one interface rig uses to see GPUs. Only rig.gpus.nvml imports pynvml.

Memory in bytes, utilisation in percent, temperature in degrees Celsius. A value the card
cannot report is None, never an exception: a reading that fails as a whole raises GpuReadError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rig.errors import RigError


class GpuReadError(RigError):
    """A card could not be read at all (driver gone, card fell off the bus)."""


@dataclass
class GpuReading:
    """One card at one instant, as ``nvidia-smi --query-gpu=index,uuid,name,memory.total,
    memory.used,utilization.gpu,temperature.gpu`` would report it (bytes, %, Celsius)."""

    index: int
    uuid: str
    model: str
    total: int
    used: int | None = None
    utilization: int | None = None
    temperature: int | None = None
    #: pid -> bytes of GPU memory that process uses on this card (host pids).
    processes: dict[int, int] = field(default_factory=dict)


class GpuBackend(Protocol):
    """What rig needs from a GPU library."""

    #: "nvml" or "fake"
    kind: str

    def count(self) -> int:
        """Number of cards on this machine."""
        ...

    def read(self, index: int) -> GpuReading:
        """Read one card; raises GpuReadError when the card cannot be read at all."""
        ...

    def read_all(self) -> list[GpuReading]:
        """Read every card, in index order (PCI bus order)."""
        ...

    def close(self) -> None:
        ...
