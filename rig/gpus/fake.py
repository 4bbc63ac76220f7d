"""Fake cards for machines without an NVIDIA driver (and for tests).

A spec lists groups of identical cards: ``8x80G``, ``2x24G,1x48G``, or ``4`` (4 x 80 GiB).
The model is named ``Fake GPU``; temperature reads 35 C. A card's UUID names its node,
``GPU-fake-<node>-0003``, so fake cards are unique across a cluster as real ones are.

Jobs can "use" memory on a fake card, so rig's closed-loop accounting can be exercised without
a GPU: a process writes the bytes it uses into ``<usage_dir>/<card index>/<pid>`` (rig gives
jobs the folder as $RIG_FAKE_GPU_DIR; ``python -m rig.fakeuse 12G 30`` does it for you). Files
of dead processes are ignored and removed. Utilisation reads 100 % while any process uses the
card, else 0.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rig.config import default_node_name
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

    def __init__(self, spec: str, usage_dir: str | os.PathLike[str] | None = None,
                 node: str | None = None) -> None:
        self.spec = spec
        self._sizes = parse_fake_spec(spec)
        self.usage_dir = Path(usage_dir) if usage_dir else None
        #: The node these cards belong to (it goes into their UUIDs); by default the node name
        #: rig's settings default to: RIG_NODE_NAME, else the host name.
        self.node = node or os.environ.get("RIG_NODE_NAME") or default_node_name()

    def count(self) -> int:
        return len(self._sizes)

    def read(self, index: int) -> GpuReading:
        if not 0 <= index < len(self._sizes):
            raise GpuReadError(f"fake card {index} does not exist ({self.spec})")
        size = self._sizes[index]
        processes = self._processes(index)
        return GpuReading(
            index=index,
            uuid=f"GPU-fake-{self.node}-{index:04d}",
            model=f"Fake GPU {size // GIB}GB",
            total=size,
            used=sum(processes.values()),
            utilization=100 if processes else 0,
            temperature=35,
            processes=processes,
        )

    def _processes(self, index: int) -> dict[int, int]:
        """pid -> bytes, from the usage files of live processes on this card."""
        if self.usage_dir is None:
            return {}
        folder = self.usage_dir / str(index)
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return {}
        found: dict[int, int] = {}
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if not os.path.exists(f"/proc/{pid}"):
                Path(entry.path).unlink(missing_ok=True)
                continue
            try:
                found[pid] = int(Path(entry.path).read_text().strip() or 0)
            except (OSError, ValueError):
                continue
        return found

    def read_all(self) -> list[GpuReading]:
        return [self.read(i) for i in range(len(self._sizes))]

    def close(self) -> None:
        pass
