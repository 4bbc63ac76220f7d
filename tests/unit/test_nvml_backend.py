"""NvmlBackend against a stand-in ``pynvml`` module, detect_backend's fallback, and fake specs.

No GPU, no driver and no Redis: the stand-in module is injected into ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from rig.errors import ConfigError
from rig.gpus import DEFAULT_FAKE_SPEC, FakeGpuBackend, detect_backend, parse_fake_spec
from rig.gpus.base import GpuReadError, GpuReading
from rig.gpus.nvml import NvmlBackend, NvmlUnavailable
from rig.memory import GIB, MIB


class NVMLError(Exception):
    """Stands in for pynvml.NVMLError (the real one maps error codes to subclasses)."""


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self) -> str:
        return "GPU is lost"


class NVMLError_FunctionNotFound(NVMLError):
    def __str__(self) -> str:
        return "Function Not Found"


@dataclass
class Card:
    name: bytes | str
    uuid: str
    total: int
    used: int
    util: int = 37
    temp: int = 51
    procs: list[tuple[int, int | None]] = field(default_factory=list)


class FakePynvml(types.ModuleType):
    """The few pynvml functions rig uses; ``fail`` maps a function name to the error it raises."""

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x02000028

    def __init__(self, cards: list[Card]) -> None:
        super().__init__("pynvml")
        self.cards = cards
        self.fail: dict[str, Exception] = {}
        self.calls: list[str] = []
        self.NVMLError = NVMLError
        for cls in (NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, NVMLError_NotSupported,
                    NVMLError_GpuIsLost, NVMLError_FunctionNotFound):
            setattr(self, cls.__name__, cls)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Card:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.cards):
            raise NVMLError_GpuIsLost()
        return self.cards[index]

    def nvmlDeviceGetName(self, handle: Card) -> bytes | str:
        self._call("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetUUID(self, handle: Card) -> str:
        self._call("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Card, version: int | None = None) -> Any:
        self._call("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        free = handle.total - handle.used
        return types.SimpleNamespace(total=handle.total, used=handle.used, free=free)

    def nvmlDeviceGetUtilizationRates(self, handle: Card) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=handle.util, memory=3)

    def nvmlDeviceGetTemperature(self, handle: Card, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        return handle.temp

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Card) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in handle.procs]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    module = FakePynvml([
        Card(b"NVIDIA H100 80GB HBM3", "GPU-0000aaaa", 80 * GIB, 2 * GIB,
             procs=[(4242, 1536 * MIB), (4343, None)]),
        Card("NVIDIA A10", "GPU-1111bbbb", 24 * GIB, 0),
    ])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


# -- starting -------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded])
def test_init_failure_is_nvml_unavailable(nvml: FakePynvml, error: type[NVMLError]) -> None:
    nvml.fail["nvmlInit"] = error()
    with pytest.raises(NvmlUnavailable) as info:
        NvmlBackend()
    assert error.__name__ in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_pynvml_is_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        NvmlBackend()


def test_no_cards_is_nvml_unavailable_and_shuts_down(nvml: FakePynvml) -> None:
    nvml.cards.clear()
    with pytest.raises(NvmlUnavailable, match="no GPUs"):
        NvmlBackend()
    assert nvml.calls.count("nvmlShutdown") == 1


def test_importing_the_module_needs_no_pynvml() -> None:
    # In a fresh interpreter, so this module's classes stay the ones every other test uses.
    code = (
        "import sys; sys.modules['pynvml'] = None\n"
        "import rig.gpus.nvml, rig.gpus\n"
        "assert rig.gpus.nvml.NvmlBackend.kind == 'nvml'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# -- readings -------------------------------------------------------------------------------

def test_normal_reading(nvml: FakePynvml) -> None:
    backend = NvmlBackend()
    assert backend.kind == "nvml"
    assert backend.count() == 2
    reading = backend.read(0)
    assert reading == GpuReading(
        index=0, uuid="GPU-0000aaaa", model="NVIDIA H100 80GB HBM3",
        total=80 * GIB, used=2 * GIB, utilization=37, temperature=51,
        processes={4242: 1536 * MIB},  # the pid with usedGpuMemory None is left out
    )
    assert isinstance(reading.model, str)  # bytes from NVML are decoded


def test_read_all_in_index_order(nvml: FakePynvml) -> None:
    readings = NvmlBackend().read_all()
    assert [r.index for r in readings] == [0, 1]
    assert [r.model for r in readings] == ["NVIDIA H100 80GB HBM3", "NVIDIA A10"]
    assert readings[1].processes == {}
    assert readings[1].total == 24 * GIB


def test_memory_v2_preferred_with_v1_fallback(nvml: FakePynvml) -> None:
    backend = NvmlBackend()
    backend.read(0)
    assert "nvmlDeviceGetMemoryInfo_v2" in nvml.calls
    assert "nvmlDeviceGetMemoryInfo" not in nvml.calls
    nvml.fail["nvmlDeviceGetMemoryInfo_v2"] = NVMLError_FunctionNotFound()
    assert backend.read(0).used == 2 * GIB
    assert "nvmlDeviceGetMemoryInfo" in nvml.calls


def test_utilization_not_supported_is_none(nvml: FakePynvml) -> None:
    nvml.fail["nvmlDeviceGetUtilizationRates"] = NVMLError_NotSupported()
    reading = NvmlBackend().read(0)
    assert reading.utilization is None
    assert reading.temperature == 51
    assert reading.used == 2 * GIB


@pytest.mark.parametrize(
    ("call", "attr", "expected"),
    [
        ("nvmlDeviceGetTemperature", "temperature", None),
        ("nvmlDeviceGetComputeRunningProcesses", "processes", {}),
        ("nvmlDeviceGetName", "model", "unknown GPU"),
    ],
)
def test_other_optional_values_not_supported(nvml: FakePynvml, call: str, attr: str, expected: object) -> None:
    nvml.fail[call] = NVMLError_NotSupported()
    reading = NvmlBackend().read(0)
    assert getattr(reading, attr) == expected
    assert reading.total == 80 * GIB


def test_memory_info_failure_is_gpu_read_error(nvml: FakePynvml) -> None:
    nvml.fail["nvmlDeviceGetMemoryInfo_v2"] = NVMLError_GpuIsLost()
    nvml.fail["nvmlDeviceGetMemoryInfo"] = NVMLError_GpuIsLost()
    with pytest.raises(GpuReadError) as info:
        NvmlBackend().read(0)
    message = str(info.value)
    assert "GPU 0" in message and "memory" in message and "\n" not in message


def test_handle_failure_is_gpu_read_error(nvml: FakePynvml) -> None:
    with pytest.raises(GpuReadError, match="GPU 7"):
        NvmlBackend().read(7)


def test_uuid_failure_is_gpu_read_error(nvml: FakePynvml) -> None:
    nvml.fail["nvmlDeviceGetUUID"] = NVMLError_GpuIsLost()
    with pytest.raises(GpuReadError, match="UUID"):
        NvmlBackend().read(0)


# -- closing --------------------------------------------------------------------------------

def test_close_is_idempotent(nvml: FakePynvml) -> None:
    backend = NvmlBackend()
    backend.close()
    backend.close()
    assert nvml.calls.count("nvmlShutdown") == 1
    with pytest.raises(GpuReadError, match="closed"):
        backend.read(0)


def test_close_swallows_shutdown_error(nvml: FakePynvml) -> None:
    nvml.fail["nvmlShutdown"] = NVMLError_DriverNotLoaded()
    with NvmlBackend():
        pass  # __exit__ closes; an NVML error while closing is only logged


# -- detect_backend -------------------------------------------------------------------------

def test_detect_falls_back_to_fake_cards_with_notice(nvml: FakePynvml) -> None:
    nvml.fail["nvmlInit"] = NVMLError_LibraryNotFound()
    backend, notice = detect_backend(None)
    assert isinstance(backend, FakeGpuBackend)
    assert backend.kind == "fake"
    assert backend.count() == len(parse_fake_spec(DEFAULT_FAKE_SPEC))
    assert notice is not None and "fake" in notice and "NVML Shared Library Not Found" in notice


def test_detect_uses_nvml_when_available(nvml: FakePynvml) -> None:
    backend, notice = detect_backend(None)
    assert backend.kind == "nvml" and notice is None
    assert backend.count() == 2
    backend.close()


def test_detect_with_spec_returns_fake_without_touching_nvml(nvml: FakePynvml) -> None:
    backend, notice = detect_backend("2x24G")
    assert isinstance(backend, FakeGpuBackend)
    assert notice is None
    assert [r.total for r in backend.read_all()] == [24 * GIB, 24 * GIB]
    assert nvml.calls == []


# -- parse_fake_spec ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("8x80G", [80 * GIB] * 8),
        ("2x24G,1x48G", [24 * GIB, 24 * GIB, 48 * GIB]),
        ("4", [80 * GIB] * 4),
        ("1x512M", [512 * MIB]),
        (" 2 X 24GiB , 48G ", [24 * GIB, 24 * GIB, 48 * GIB]),
    ],
)
def test_parse_fake_spec(spec: str, sizes: list[int]) -> None:
    assert parse_fake_spec(spec) == sizes


@pytest.mark.parametrize("spec", ["", "x", "2x", "8x80Q", "0x80G", "65x80G", "8x80G,", "eight"])
def test_parse_fake_spec_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_fake_spec(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("spec", "said"), [
    ("1x1K", "'1K' is less than 1 MiB"), ("2x255M", "smaller than any GPU; give at least 256 MiB"),
    ("1x1M", "smaller than any GPU; give at least 256 MiB")])
def test_a_fake_card_smaller_than_any_gpu_is_refused(spec: str, said: str) -> None:
    """1x1K made a 1 KiB card that no job could ever fit."""
    with pytest.raises(ConfigError, match=said):
        parse_fake_spec(spec)


def test_fake_backend_reads() -> None:
    backend = FakeGpuBackend("2x24G", node="gpu-a")
    reading = backend.read(1)
    assert reading.uuid == "GPU-fake-gpu-a-0001" and reading.model.startswith("Fake GPU")
    with pytest.raises(GpuReadError):
        backend.read(2)


def test_fake_uuids_are_unique_across_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    uuids = [r.uuid for node in ("a", "b") for r in FakeGpuBackend("2x24G", node=node).read_all()]
    assert len(set(uuids)) == 4
    # Without a node given (the old constructor): the node rig's settings would name.
    monkeypatch.setenv("RIG_NODE_NAME", "gpu-b")
    assert FakeGpuBackend("1x24G").read(0).uuid == "GPU-fake-gpu-b-0000"
    backend, _ = detect_backend("1x24G", node="gpu-c")
    assert backend.read(0).uuid == "GPU-fake-gpu-c-0000"
    monkeypatch.delenv("RIG_NODE_NAME")
    monkeypatch.setattr("socket.gethostname", lambda: "host1.lab")
    assert FakeGpuBackend("1x24G").read(0).uuid == "GPU-fake-host1.lab-0000"
