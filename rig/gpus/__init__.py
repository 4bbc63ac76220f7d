"""GPU access behind one interface: NVML on real machines, fake cards elsewhere."""

from __future__ import annotations

import logging

from rig.gpus.base import GpuBackend, GpuReadError, GpuReading
from rig.gpus.fake import FakeGpuBackend, parse_fake_spec

log = logging.getLogger(__name__)

#: Used when there is no NVIDIA driver and no fake_gpus setting.
DEFAULT_FAKE_SPEC = "8x80G"

__all__ = [
    "GpuBackend", "GpuReadError", "GpuReading", "FakeGpuBackend", "parse_fake_spec",
    "detect_backend", "DEFAULT_FAKE_SPEC",
]


def detect_backend(fake_spec: str | None, usage_dir=None,  # noqa: ANN001
                   node: str | None = None) -> tuple[GpuBackend, str | None]:
    """Pick the backend: fake cards when ``fake_spec`` is set, else NVML, else default fakes.

    Returns the backend and, when rig fell back to fake cards, a one-line notice saying why.
    ``usage_dir`` is where jobs on fake cards record the memory they "use" (rig.gpus.fake);
    ``node`` names the node in fake cards' UUIDs (default: RIG_NODE_NAME, else the host name).
    """
    if fake_spec:
        return FakeGpuBackend(fake_spec, usage_dir, node), None
    from rig.gpus.nvml import NvmlBackend, NvmlUnavailable

    try:
        return NvmlBackend(), None
    except NvmlUnavailable as exc:
        notice = (
            f"no NVIDIA driver found ({exc}); using fake cards {DEFAULT_FAKE_SPEC} "
            "(set RIG_FAKE_GPUS, e.g. 2x24G, to choose others)"
        )
        return FakeGpuBackend(DEFAULT_FAKE_SPEC, usage_dir, node), notice
