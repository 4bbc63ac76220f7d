"""Real cards through NVML (the library nvidia-smi itself uses). The only module that imports pynvml.

``pynvml`` comes from the ``nvidia-ml-py`` package and is imported lazily, inside
``NvmlBackend()``, so importing this module never fails on a machine without it.

Failures are translated where they enter (nvitop style):

* NVML cannot start (no library, driver not loaded, no cards): ``NvmlUnavailable``, which
  ``rig.gpus.detect_backend`` turns into fake cards plus a notice.
* A card's handle, UUID or memory info cannot be read: ``GpuReadError`` (one line).
* One optional value cannot be read (utilisation, temperature, processes): that value is
  None / empty, and the rest of the reading stands.

Indexes are NVML's, which are in PCI bus order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA's
numbering matches. Memory is in bytes. NVML calls are thread-safe, so one backend may be
shared by threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rig.errors import RigError
from rig.gpus.base import GpuReadError, GpuReading

log = logging.getLogger(__name__)

T = TypeVar("T")


class NvmlUnavailable(RigError):
    """NVML cannot be used on this machine (no nvidia-ml-py, no driver, or no cards)."""


class NvmlBackend:
    """The cards of this machine, read through NVML. ``close()`` when done (idempotent)."""

    kind = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the package is a dependency, but be kind to odd installs
            raise NvmlUnavailable(f"the pynvml module is missing ({exc}); pip install nvidia-ml-py") from None
        self._nvml: Any = pynvml
        self._lock = threading.Lock()
        self._closed = True
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not start: {_describe(exc)}") from None
        except OSError as exc:  # a broken libnvidia-ml.so can fail below pynvml's own checks
            raise NvmlUnavailable(f"NVML did not start: {exc}") from None
        self._closed = False
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML started but cannot count cards: {_describe(exc)}") from None
        if count < 1:
            self.close()
            raise NvmlUnavailable("NVML started but sees no GPUs")
        log.debug("NVML started: %d cards", count)

    # -- GpuBackend -------------------------------------------------------------------------

    def count(self) -> int:
        """Number of cards (``nvidia-smi --query-gpu=count``)."""
        self._check_open()
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as exc:
            raise GpuReadError(f"NVML cannot count cards: {_describe(exc)}") from None

    def read(self, index: int) -> GpuReading:
        """Read card ``index``; raises GpuReadError when the card cannot be read at all."""
        self._check_open()
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: NVML cannot open the card: {_describe(exc)}") from None
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: NVML cannot read the card's UUID: {_describe(exc)}") from None
        total, used = self._memory(index, handle)
        model = self._optional(index, "name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        return GpuReading(
            index=index,
            uuid=uuid,
            model=model or "unknown GPU",
            total=total,
            used=used,
            utilization=self._optional(index, "utilization", lambda: self._utilization(handle)),
            temperature=self._optional(index, "temperature", lambda: self._temperature(handle)),
            processes=self._optional(index, "processes", lambda: self._processes(handle)) or {},
        )

    def read_all(self) -> list[GpuReading]:
        """Read every card, in index order (PCI bus order, as nvidia-smi lists them)."""
        return [self.read(i) for i in range(self.count())]

    def close(self) -> None:
        """Shut NVML down (``nvmlShutdown``). Safe to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:  # nothing useful to do about it while closing
            log.debug("nvmlShutdown failed: %s", _describe(exc))

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- one value each -----------------------------------------------------------------------

    def _memory(self, index: int, handle: Any) -> tuple[int, int | None]:
        """``memory.total`` and ``memory.used`` in bytes, as nvidia-smi reports them.

        Since driver R510 nvidia-smi's ``memory.used`` leaves out memory the driver reserves
        for itself; that is NVML's v2 memory info. Older drivers only have v1, whose ``used``
        includes the reserved part (a few hundred MiB more than nvidia-smi shows).
        """
        nvml = self._nvml
        info = None
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except nvml.NVMLError as exc:  # FunctionNotFound / ArgumentVersionMismatch on old drivers
                log.debug("GPU %d: v2 memory info unavailable (%s); using v1", index, _describe(exc))
        if info is None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                raise GpuReadError(f"GPU {index}: NVML cannot read memory info: {_describe(exc)}") from None
        total = int(info.total)
        if total <= 0:
            raise GpuReadError(f"GPU {index}: NVML reports {total} bytes of memory")
        used = getattr(info, "used", None)
        return total, (int(used) if used is not None else None)

    def _utilization(self, handle: Any) -> int:
        """``utilization.gpu`` in percent: time the card was busy over the last sample period."""
        return int(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    def _temperature(self, handle: Any) -> int:
        """``temperature.gpu`` in degrees Celsius (the core sensor)."""
        return int(self._nvml.nvmlDeviceGetTemperature(handle, self._nvml.NVML_TEMPERATURE_GPU))

    def _processes(self, handle: Any) -> dict[int, int]:
        """``nvidia-smi --query-compute-apps=pid,used_memory``: host pid -> bytes on this card.

        Processes whose memory NVML cannot tell (``usedGpuMemory`` None) are left out; a pid
        listed twice (several contexts) is summed.
        """
        found: dict[int, int] = {}
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:
                continue
            found[int(proc.pid)] = found.get(int(proc.pid), 0) + int(used)
        return found

    def _optional(self, index: int, what: str, read: Callable[[], T]) -> T | None:
        """Run one read; an NVML failure means "not available" (None), not an error."""
        try:
            return read()
        except self._nvml.NVMLError as exc:
            log.debug("GPU %d: %s not available: %s", index, what, _describe(exc))
            return None

    def _check_open(self) -> None:
        if self._closed:
            raise GpuReadError("the NVML backend is closed; create a new one")


def _describe(exc: BaseException) -> str:
    """``NVMLError_NotSupported: Not Supported`` -- class and message on one line."""
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ itself calls into NVML
        text = ""
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != name else name


def _text(value: bytes | str) -> str:
    """NVML strings arrive as bytes from older bindings and str from newer ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").strip()
    return str(value).strip()
