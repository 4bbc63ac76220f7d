"""Fake cards for machines without an NVIDIA driver (and for tests).

A spec lists groups of identical cards: ``8x80G``, ``2x24G,1x48G``, or ``4`` (4 x 80 GiB).
The readings are constant and honest about being fake: the model is named ``Fake GPU``.
"""

from __future__ import annotations

import re

from rig.errors import ConfigError, InvalidInput
from rig.gpus.base import GpuReadError, GpuReading
from rig.memory import GIB, parse_memory

_GROUP = re.compile(r"^\s*(?:(?P<count>\d+)\s*[xX*]\s*)?(?P<size>[0-9.]+\s*[a-zA-Z]*)?\s*$")
DEFAULT_CARD = 80 * GIB


def parse_fake_spec(spec: str) -> list[int]:
    """``"2x24G,1x48G"`` -> card sizes in bytes, in index order."""
    sizes: list[int] = []
    for group in str(spec).split(","):
        match = _GROUP.match(group)
        if not group.strip() or not match or not (match["count"] or match["size"]):
            raise ConfigError(f"fake_gpus: cannot read {spec!r}; write it like 8x80G or 2x24G,1x48G")
        if match["count"] and not match["size"]:
            raise ConfigError(f"fake_gpus: {group.strip()!r} has no card size; write it like 8x80G")
        if match["size"] and not match["count"] and group.strip().isdigit():
            count, size = int(group), DEFAULT_CARD  # "4" means four default cards
        else:
            count = int(match["count"] or 1)
            try:
                size = parse_memory(match["size"], what="fake_gpus")
            except InvalidInput:
                raise ConfigError(
                    f"fake_gpus: cannot read {group.strip()!r}; write it like 8x80G or 2x24G,1x48G"
                ) from None
        if count < 1 or count > 64:
            raise ConfigError(f"fake_gpus: {count} cards in {group.strip()!r}; use 1 to 64")
        sizes.extend([size] * count)
    return sizes


class FakeGpuBackend:
    """Cards that exist only in rig's imagination; everything reads as idle and cool."""

    kind = "fake"

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._sizes = parse_fake_spec(spec)

    def count(self) -> int:
        return len(self._sizes)

    def read(self, index: int) -> GpuReading:
        if not 0 <= index < len(self._sizes):
            raise GpuReadError(f"fake card {index} does not exist ({self.spec})")
        size = self._sizes[index]
        return GpuReading(
            index=index,
            uuid=f"GPU-fake-{index:04d}",
            model=f"Fake GPU {size // GIB}GB",
            total=size,
            used=0,
            utilization=0,
            temperature=35,
        )

    def read_all(self) -> list[GpuReading]:
        return [self.read(i) for i in range(len(self._sizes))]

    def close(self) -> None:
        pass
