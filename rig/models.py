"""rig's data: job states, priorities, job records and card views.

Memory is always in bytes; times are Unix epoch seconds (float).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from rig.errors import InvalidInput


class JobState(str, Enum):
    """Life of a job. PENDING -> ASSIGNED -> RUNNING -> one terminal state; a failed attempt
    with retries left goes back to PENDING (keeping its place).

    ASSIGNED: its VRAM is reserved on its card(s) and its start is on the way to the card's
    worker. A job leaves PENDING only through the atomic reservation. FAILED and TIMEOUT jobs
    also sit in the error queue until a person retries or clears them.
    """

    PENDING = "PENDING"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @classmethod
    def parse(cls, text: str) -> JobState:
        try:
            return cls(text.strip().upper())
        except ValueError:
            names = ", ".join(s.value.lower() for s in cls)
            raise InvalidInput(f"unknown state {text!r}; choose one of: {names}") from None


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}
)
ACTIVE_STATES = (JobState.ASSIGNED, JobState.RUNNING)


class Priority(str, Enum):
    """Strict priorities. Lower rank runs first."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def queue(self) -> str:
        """The Celery queue submissions of this priority travel on."""
        return f"rig.{self.value}"

    @classmethod
    def parse(cls, text: str | Priority) -> Priority:
        if isinstance(text, Priority):
            return text
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise InvalidInput(f"unknown priority {text!r}; choose high, medium or low") from None


_RANK = {Priority.HIGH: 0, Priority.MEDIUM: 1, Priority.LOW: 2}

#: Pending-queue score = rank * PRIORITY_BAND + job id, so ZRANGE gives strict priority, FIFO.
PRIORITY_BAND = 10**12


def pending_score(priority: Priority, job_id: int) -> int:
    return priority.rank * PRIORITY_BAND + job_id


@dataclass
class Job:
    """A job record as stored in Redis (one hash). Lists and dicts are stored as JSON."""

    id: int
    name: str
    user: str
    command: list[str]  # argv; a shell string is ["/bin/sh", "-c", text]
    gpu_memory: int  # bytes per card
    gpus: int
    priority: Priority
    state: JobState
    workdir: str
    created_at: float
    env: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    kind: str = "command"  # "command" or "python" (a @rig.task call)
    node: str | None = None
    cards: list[int] = field(default_factory=list)
    assigned_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None  # why it ended the way it did
    wait_reason: str | None = None  # why a PENDING job is not running yet
    attempt: int = 0
    assignments: int = 0
    log_path: str | None = None
    log_paths: list[str] = field(default_factory=list)
    pid: int | None = None
    proc_start: int | None = None
    worker: str | None = None
    cancel_requested: bool = False
    max_retries: int = 0
    submit_host: str | None = None
    time_limit: float | None = None  # seconds of running time before rig stops it
    oom_retry_grow: bool = False  # after a CUDA OOM, retry with more memory
    attempts: list[dict] = field(default_factory=list)  # one entry per ended attempt
    failure: str | None = None  # FailureClass value of the last failed attempt
    evidence: list[str] = field(default_factory=list)  # log lines that decided it
    suggested_gpu_memory: int | None = None  # bytes, after a CUDA OOM
    template: str | None = None  # the preset it was submitted with
    # Measured on the card(s) during the current attempt (bytes; util in percent).
    vram_peak: int = 0
    vram_sum: int = 0
    vram_samples: int = 0
    util_sum: int = 0
    util_samples: int = 0
    overuse: int = 0  # the most it used beyond its declaration (bytes), 0 if never

    @property
    def vram_mean(self) -> int | None:
        return self.vram_sum // self.vram_samples if self.vram_samples else None

    @property
    def util_mean(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None

    @property
    def display_command(self) -> str:
        if self.shell and len(self.command) == 3:
            return self.command[2]
        import shlex

        return shlex.join(self.command)

    @property
    def card_ids(self) -> list[str]:
        return [f"{self.node}/{i}" for i in self.cards] if self.node else []

    # -- (de)serialisation --------------------------------------------------------------
    _JSON_FIELDS = ("command", "env", "cards", "log_paths", "attempts", "evidence")
    _INT_FIELDS = ("id", "gpu_memory", "gpus", "attempt", "assignments", "pid", "proc_start",
                   "exit_code", "max_retries", "suggested_gpu_memory", "vram_peak", "vram_sum",
                   "vram_samples", "util_sum", "util_samples", "overuse")
    _FLOAT_FIELDS = ("created_at", "assigned_at", "started_at", "ended_at", "time_limit")
    _BOOL_FIELDS = ("shell", "cancel_requested", "oom_retry_grow")

    def to_redis(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            if key in self._JSON_FIELDS:
                out[key] = json.dumps(value)
            elif isinstance(value, Enum):
                out[key] = value.value
            elif isinstance(value, bool):
                out[key] = "1" if value else "0"
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_redis(cls, raw: dict[Any, Any]) -> Job:
        data = {_s(k): _s(v) for k, v in raw.items()}
        known = cls.__dataclass_fields__
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known or (value == "" and key not in ("name", "workdir", "user")):
                continue
            if key in cls._JSON_FIELDS:
                kwargs[key] = json.loads(value)
            elif key in cls._INT_FIELDS:
                kwargs[key] = int(float(value))
            elif key in cls._FLOAT_FIELDS:
                kwargs[key] = float(value)
            elif key in cls._BOOL_FIELDS:
                kwargs[key] = value == "1"
            elif key == "priority":
                kwargs[key] = Priority(value)
            elif key == "state":
                kwargs[key] = JobState(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class CardState:
    """One card as the ledger sees it. Memory in bytes.

    Invariants kept by the ledger's scripts: ``reserved <= usable`` and ``jobs <= max_jobs``.
    """

    node: str
    index: int
    total: int
    usable: int
    reserved: int = 0
    jobs: int = 0
    max_jobs: int = 1
    allowed: bool = True  # in gpu_whitelist
    healthy: bool = True
    model: str = "unknown"
    uuid: str = ""
    used: int | None = None  # actually used, from NVML
    utilization: int | None = None  # percent
    temperature: int | None = None  # Celsius
    updated_at: float | None = None
    fake: bool = False
    health_reason: str = ""
    foreign: int = 0  # bytes used by processes rig did not start

    @property
    def taken(self) -> int:
        return self.reserved + self.foreign

    @property
    def id(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def free(self) -> int:
        """Reservable bytes left (what rig reserved and what others use are both taken)."""
        return max(0, self.usable - self.reserved - self.foreign)

    @property
    def eligible(self) -> bool:
        return self.allowed and self.healthy

    @classmethod
    def from_redis(cls, raw: dict[Any, Any]) -> CardState:
        data = {_s(k): _s(v) for k, v in raw.items()}

        def opt_int(key: str) -> int | None:
            value = data.get(key)
            return int(float(value)) if value not in (None, "") else None

        return cls(
            node=data["node"],
            index=int(data["index"]),
            total=int(data["total"]),
            usable=int(data["usable"]),
            reserved=int(data.get("reserved", 0)),
            jobs=int(data.get("jobs", 0)),
            max_jobs=int(data.get("max_jobs", 1)),
            allowed=data.get("allowed", "1") == "1",
            healthy=data.get("healthy", "1") == "1",
            model=data.get("model", "unknown"),
            uuid=data.get("uuid", ""),
            used=opt_int("used"),
            utilization=opt_int("utilization"),
            temperature=opt_int("temperature"),
            updated_at=float(data["updated_at"]) if data.get("updated_at") else None,
            fake=data.get("fake", "0") == "1",
            health_reason=data.get("health_reason", ""),
            foreign=int(data.get("foreign") or 0),
        )
