"""How a job attempt ended: a failure class, a one-line summary and the log lines behind it.

Pure Python (standard library only): the facts rig knows about an attempt (exit code, cancelled,
timed out, lost) plus the tail of its log go in, a :class:`Classification` comes out.

Precedence: cancelled > timed out > lost > log evidence (CUDA OOM > NCCL > other CUDA errors) >
exit-code facts (127/126, signals, any other non-zero code). Log evidence wins over the exit code
because a GPU out-of-memory often ends as exit 1, SIGABRT or even SIGKILL.

The patterns are the messages the frameworks really print (PyTorch, TensorFlow, JAX/XLA, CuPy,
cuBLAS/cuDNN, the CUDA driver and runtime, NCCL and PyTorch's ProcessGroupNCCL). Each pattern is
compiled once and run over the whole tail with ``finditer``; a 256 KiB tail takes a few ms.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import signal
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "CALL_BAD_EXIT",
    "CALL_BAD_RESULT_EXIT",
    "Classification",
    "FailureClass",
    "RetryRule",
    "classify",
    "classify_failure",
    "read_tail",
    "suggest_memory",
]

GIB = 1024**3
MAX_EVIDENCE = 5
MAX_LINE = 300


class FailureClass(str, Enum):
    NONZERO_EXIT = "nonzero_exit"  # exited with a non-zero code, nothing more specific found
    SIGNAL = "signal"  # killed by a signal (exit 128+n, or a negative returncode), not by rig
    CUDA_OOM = "cuda_oom"  # GPU out of memory
    CUDA_ERROR = "cuda_error"  # any other CUDA error
    NCCL_ERROR = "nccl_error"  # NCCL / distributed communication failure
    TIMEOUT = "timeout"  # time limit exceeded (rig stopped it)
    CANCELLED = "cancelled"  # a person cancelled it
    LOST = "lost"  # its worker or node died
    COMMAND_NOT_FOUND = "command_not_found"  # exit 127 / 126 from the shell wrapper
    OVER_DECLARATION = "over_declaration"  # rig stopped it: it used more memory than declared
    START_FAILED = "start_failed"  # rig could not start it: working folder gone or not enterable
    BAD_CALL = "bad_call"  # a @rig.task call whose payload or function cannot be loaded
    BAD_RESULT = "bad_result"  # a @rig.task call ran, but its return value cannot be pickled
    INVALID_RECORD = "invalid_record"  # the job's record is damaged: nothing of it is used
    RUN_AS_REFUSED = "run_as_refused"  # the job may not run as its submitter (identity refused)
    START_ERROR = "start_error"  # rig's own start of the job failed unexpectedly
    UNSCHEDULABLE = "unschedulable"  # it never started: no card of its pool could ever hold it
    INFRASTRUCTURE = "infrastructure"  # rig's own fault, not the job's (its log keeper died under it)


@dataclass(frozen=True)
class RetryRule:
    """Whether another attempt of the same job, unchanged, can end differently."""

    helps: bool
    #: For classes a retry cannot help: what the person should do (one clause, no full stop).
    advice: str = ""
    #: Does such an attempt spend one of the job's retries? Not when rig itself failed the job
    #: (at most FREE_RETRIES_MAX such attempts go uncounted, so a fault that repeats ends).
    counted: bool = True


#: The most attempts of one job that rig's own faults may take without counting them.
FREE_RETRIES_MAX = 3


#: THE table of which failures are retried (workers.outcomes.decide reads only this). A class
#: whose retry cannot help goes straight to the error queue with its advice, whatever retries
#: the job has left: running it again would fail the same way and hide the cause for minutes.
#: CUDA_OOM is retried only with a larger declaration (``--oom-retry-grow``), never as it was.
RETRY: dict[FailureClass, RetryRule] = {
    FailureClass.NONZERO_EXIT: RetryRule(True),
    FailureClass.SIGNAL: RetryRule(True),
    FailureClass.CUDA_ERROR: RetryRule(True),  # Xid errors, a card reset: often transient
    FailureClass.NCCL_ERROR: RetryRule(True),  # a peer or link that failed
    FailureClass.LOST: RetryRule(True),  # its worker or node died, not the job
    FailureClass.INFRASTRUCTURE: RetryRule(True, counted=False),  # rig's own fault: a free retry
    FailureClass.CUDA_OOM: RetryRule(False, "declare more memory: `rig retry {id} --gpu-memory SIZE`"),
    FailureClass.OVER_DECLARATION: RetryRule(False, "declare what it uses: `rig retry {id} --gpu-memory SIZE`"),
    FailureClass.TIMEOUT: RetryRule(False, "give it more time: `rig retry {id} --time-limit DURATION`"),
    FailureClass.CANCELLED: RetryRule(False, "a person cancelled it"),
    FailureClass.COMMAND_NOT_FOUND: RetryRule(
        False, "check the command's name, its PATH and that it is executable, then `rig retry {id}`"),
    FailureClass.START_FAILED: RetryRule(
        False, "check that its working folder exists on the node and its user may enter it, "
               "then `rig retry {id}`"),
    FailureClass.BAD_CALL: RetryRule(
        False, "fix what the job's log says, then submit the call again"),
    FailureClass.BAD_RESULT: RetryRule(
        False, "return plain data (or write it to a file and return the path), then submit again"),
    FailureClass.INVALID_RECORD: RetryRule(False, "submit the job again"),
    FailureClass.RUN_AS_REFUSED: RetryRule(False, "see docs/SECURITY.md on who jobs may run as"),
    FailureClass.START_ERROR: RetryRule(False, "see the node's worker log, then `rig retry {id}`"),
    FailureClass.UNSCHEDULABLE: RetryRule(
        False, "its reason says what no card offers: ask for less, or bring back (or add) a node that "
               "offers it, then `rig retry {id}`"),
}


def retry_rule(failure: FailureClass) -> RetryRule:
    """The retry rule of ``failure`` (RETRY)."""
    return RETRY[failure]


def counted(outcome: str | None) -> bool:
    """Does an attempt with this recorded outcome (a FailureClass value, "succeeded", ...)
    spend one of the job's retries? Unknown words count (never a free retry on doubt)."""
    try:
        return RETRY[FailureClass(outcome)].counted
    except (ValueError, KeyError):
        return True


#: The summary of an attempt rig's log keeper failed (workers.card_keeper): its output pipe
#: lost its reader, so the job's writes failed (SIGPIPE, EPIPE) through no fault of its own.
KEEPER_LOST_SUMMARY = "rig's log keeper died while the job wrote its output (rig's fault, not the job's)"


#: Exit codes of ``python -m rig.call`` (a @rig.task job) that are rig.call's own verdicts, not
#: the function's: the call could not be loaded (payload unreadable, function not importable,
#: the script submits jobs when imported), or it ran and its return value cannot be pickled.
#: rig.call turns a function's own ``sys.exit`` with one of these codes into exit 1.
CALL_BAD_EXIT = 2
CALL_BAD_RESULT_EXIT = 3
_CALL_EXITS: dict[int, tuple[FailureClass, str]] = {
    CALL_BAD_EXIT: (FailureClass.BAD_CALL, "the @rig.task call could not be loaded (exit 2)"),
    CALL_BAD_RESULT_EXIT: (FailureClass.BAD_RESULT,
                           "the @rig.task call ran, but its return value cannot be pickled or is too large to "
                           "store (exit 3)"),
}


@dataclass(frozen=True)
class Classification:
    failure: FailureClass
    summary: str  # one line a person reads
    evidence: tuple[str, ...]  # the deciding log lines, in log order (<= 5, stripped, <= 300 chars)
    framework: str | None = None  # "pytorch" / "tensorflow" / "jax" / "cupy" / None (OOMs only)


# --- patterns --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rule:
    failure: FailureClass
    regex: re.Pattern[str]
    framework: str | None = None  # the framework this message belongs to, when it is certain
    veto: re.Pattern[str] | None = None  # a line that also matches this is not evidence
    token: bool = False  # OOM summaries name the matched text (e.g. CUBLAS_STATUS_ALLOC_FAILED)
    summary: str | None = None  # fixed summary for this rule


def _rule(failure: FailureClass, pattern: str, framework: str | None = None, *,
          veto: str | None = None, token: bool = False, summary: str | None = None,
          flags: int = 0) -> _Rule:
    return _Rule(failure, re.compile(pattern, flags), framework,
                 re.compile(veto) if veto else None, token, summary)


_OOM = FailureClass.CUDA_OOM
_NCCL = FailureClass.NCCL_ERROR
_CUDA = FailureClass.CUDA_ERROR

# TensorFlow says "OOM when allocating ... on .../device:CPU:0 by allocator cpu" for host memory.
_TF_CPU = r"/device:CPU:\d+ by allocator|by allocator (?:cpu|mklcpu)\b"

# Within a class, earlier rules are preferred for the summary (the last line matching the
# earliest rule that matched anywhere); evidence is every matching line.
_RULES: tuple[_Rule, ...] = (
    # --- GPU out of memory ---
    # PyTorch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ..."
    _rule(_OOM, r"CUDA out of memory", "pytorch"),
    _rule(_OOM, r"torch\.(?:cuda\.)?OutOfMemoryError\b", "pytorch"),
    # PyTorch < 1.0: "RuntimeError: cuda runtime error (2) : out of memory at .../THCCachingAllocator.cpp"
    _rule(_OOM, r"cuda runtime error \(2\) : out of memory", "pytorch"),
    # TensorFlow: "ResourceExhaustedError: OOM when allocating tensor with shape[...] ... by allocator GPU_0_bfc"
    _rule(_OOM, r"OOM when allocating tensor", "tensorflow", veto=_TF_CPU),
    _rule(_OOM, r"ResourceExhaustedError\b.*\bOOM\b", "tensorflow", veto=_TF_CPU),
    # JAX / XLA: "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes."
    _rule(_OOM, r"RESOURCE_EXHAUSTED: (?:Out of memory|Failed to allocate)", "jax"),
    _rule(_OOM, r"Out of memory while trying to allocate \d+ bytes", "jax"),
    # CuPy: "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes ..."
    _rule(_OOM, r"cupy\.cuda\.memory\.OutOfMemoryError\b", "cupy"),
    _rule(_OOM, r"Out of memory allocating [\d,]+ bytes", "cupy"),
    # The BFC allocator of TensorFlow and XLA. "The caller indicates that this is not a failure"
    # marks a warning after which the program carries on.
    _rule(_OOM, r"Allocator \(GPU_\d+_bfc\) ran out of memory trying to allocate",
          veto=r"not a failure"),
    # Libraries, driver and runtime, whoever called them.
    _rule(_OOM, r"CUDA(?: driver| runtime)? error: out of memory"),
    _rule(_OOM, r"(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED\b", token=True),
    _rule(_OOM, r"CUFFT_ALLOC_FAILED\b", token=True),
    _rule(_OOM, r"CUDA_ERROR_OUT_OF_MEMORY\b", token=True),
    _rule(_OOM, r"cudaErrorMemoryAllocation\b", token=True),
    # NCCL: "NCCL WARN Cuda failure 'out of memory'" / "Last error: Cuda failure 2 'out of memory'"
    _rule(_OOM, r"Cuda failure (?:\d+ )?'out of memory'"),

    # --- NCCL and distributed communication ---
    # "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE,
    #  ...) ran for 600000 milliseconds before timing out."
    _rule(_NCCL, r"Watchdog caught collective operation timeout"),
    # "NCCL error in: .../ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with ...), NCCL
    #  version 2.19.3"; older "NCCL Error 2: unhandled system error"
    _rule(_NCCL, r"NCCL [Ee]rror\b"),
    _rule(_NCCL, r"nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument"
                 r"|InvalidUsage|RemoteError)\b"),
    _rule(_NCCL, r"ProcessGroupNCCL's watchdog got stuck", summary="NCCL watchdog got stuck"),
    _rule(_NCCL, r"Heartbeat monitor timed out", summary="NCCL heartbeat monitor timed out"),
    _rule(_NCCL, r"Some NCCL operations have failed or timed out",
          summary="NCCL operations failed or timed out"),
    _rule(_NCCL, r"Timeout at NCCL work", summary="NCCL collective operation timed out"),
    _rule(_NCCL, r"NCCL communicator was aborted", summary="NCCL communicator was aborted"),

    # --- other CUDA errors ---
    # PyTorch: "RuntimeError: CUDA error: an illegal memory access was encountered"
    _rule(_CUDA, r"CUDA error: (?!out of memory)(?P<msg>\S[^\n]*)"),
    # Driver API names: "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"
    _rule(_CUDA, r"(?P<msg>CUDA_ERROR_(?!OUT_OF_MEMORY\b)[A-Z_]+\b(?::\s*\S[^\n]*)?)"),
    # Runtime API names: "cudaErrorIllegalAddress: an illegal memory access was encountered"
    _rule(_CUDA, r"(?P<msg>cudaError(?!MemoryAllocation\b)[A-Z]\w*(?::\s*\S[^\n]*)?)"),
    _rule(_CUDA, r"(?P<msg>an illegal memory access was encountered)"),
    _rule(_CUDA, r"(?P<msg>device-side assert triggered)"),
    # The kernel's own assertion: ".../IndexKernel.cu:92: ...: Assertion `...` failed."
    _rule(_CUDA, r"\.cu:\d+: .*Assertion .* failed", summary="CUDA error: device-side assertion failed"),
    _rule(_CUDA, r"(?P<msg>No CUDA GPUs are available)"),
    _rule(_CUDA, r"(?P<msg>no CUDA-capable device is detected)"),
    _rule(_CUDA, r"(?P<msg>CUDA driver version is insufficient for CUDA runtime version)"),
    _rule(_CUDA, r"(?P<msg>Found no NVIDIA driver on your system)"),
    _rule(_CUDA, r"(?P<msg>The NVIDIA driver on your system is too old)"),
    _rule(_CUDA, r"(?P<msg>uncorrectable ECC error encountered)"),
    _rule(_CUDA, r"(?P<msg>(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_"
                 r"(?!SUCCESS\b|ALLOC_FAILED\b)[A-Z_]+\b)"),
)

# Source lines shown in tracebacks ("except torch.cuda.OutOfMemoryError:") are not evidence.
_CODE_LINE = re.compile(
    r"^\s*(?:except|elif|if|assert|while)\b|^\s*#|\bisinstance\(|\bexcept\s+\(?[\w.]+(?:Error|Exception)"
)

# Which framework printed an OOM, when the message itself does not say: the last marker wins.
# Every search here starts with a literal, which keeps a scan of 256 KiB at a fraction of a ms;
# word boundaries in front are checked on the hits instead (a leading \b disables that).
_FRAMEWORK_MARKERS: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("jax", tuple(map(re.compile, (r"jax(?:lib)?[./]", r"xla_extension", r"XlaRuntimeError",
                                   r"JaxRuntimeError", r"external/xla/")))),
    ("tensorflow", (re.compile(r"tensorflow\b"),)),
    ("cupy", (re.compile(r"cupy(?:_backends)?[./]"),)),
    ("pytorch", (re.compile(r"torch[./]"),)),
)
_FRAMEWORK_LABELS = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX", "cupy": "CuPy"}

# How much an OOM asked for, in the words of each framework.
_ALLOC_SIZE = re.compile(
    r"(?:Tried|trying) to allocate (?P<size>\d+(?:\.\d+)? ?[KMGTP]i?B)\b"  # PyTorch, BFC allocator
    r"|(?:trying to allocate|allocating) (?P<bytes>\d[\d,]*) bytes"  # XLA, CuPy
    r"|Failed to allocate request for (?P<xla>\d+(?:\.\d+)? ?[KMGTP]i?B)"  # XLA
    r"|OOM when allocating (?P<tensor>tensor with shape\s*\[[^\]]*\](?: and type \w+)?)",  # TF
    re.IGNORECASE,
)

# The kernel's OOM killer (its log lines, a cgroup's, a container runtime's): (finder, line
# check). Not the shell's "Killed" / "line 5: 12345 Killed": it reports any SIGKILL (`kill -9`,
# rig's own stop), which is no evidence of memory running out.
_KERNEL_OOM: tuple[tuple[re.Pattern[str], re.Pattern[str] | None], ...] = (
    (re.compile(r"Out of memory: Kill(?:ed)? process \d+"), None),
    (re.compile(r"invoked oom-killer"), None),
    (re.compile(r"oom-kill\b"), None),
    (re.compile(r"oom_reaper"), None),
    (re.compile(r"Memory cgroup out of memory"), None),
    (re.compile(r"OOMKilled\b"), None),
)

# Host (CPU) memory exhausted inside the program: (finder, line check).
_HOST_OOM: tuple[tuple[re.Pattern[str], re.Pattern[str] | None], ...] = (
    # Python: "MemoryError" / "MemoryError: ..." as the last line of a traceback
    (re.compile(r"MemoryError\b"),
     re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:builtins\.)?MemoryError\b(?!\.)")),
    # NumPy: "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array"
    (re.compile(r"_ArrayMemoryError\b"), None),
    # PyTorch on the CPU: "DefaultCPUAllocator: not enough memory: you tried to allocate ..."
    (re.compile(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"), None),
    (re.compile(r"std::bad_alloc"), None),
    (re.compile(r"OOM when allocating tensor"), re.compile(_TF_CPU)),
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

_NCCL_ERROR_IN = re.compile(
    r"NCCL [Ee]rror(?: in: [^,\n]*,| \d+:)?\s*(?P<msg>[^(,\n]*)(?:.*?NCCL version (?P<v>[\w.+-]+))?"
)
_NCCL_CODE = re.compile(r"\b(?P<msg>nccl[A-Z]\w*Error\b[^\n]*|nccl(?:InvalidArgument|InvalidUsage)"
                        r"\b[^\n]*)")
_WATCHDOG = re.compile(r"OpType=(?P<op>\w+)|ran for (?P<ms>\d+) milliseconds")


#: A line saying that a command could not start: rig's wrapper's (workers/process_tree.py:
#: ``rig: command not found: X``, ``rig: not an executable file: X``), or a shell's about a
#: command of a --cmd string (dash ``/bin/sh: 1: foo: not found``, ``... Permission denied``;
#: bash ``bash: foo: command not found``).
CANNOT_START_LINE = re.compile(
    r"^(?:rig: (?:command not found|not an executable file): .*"
    r"|\S+: (?:\d+: |line \d+: )?[^\n]*: (?:not found|command not found|Permission denied))$",
    re.MULTILINE)

#: The wrapper's line for a working folder the job's user may not reach (workers/process_tree.py):
#: the job never ran; its class is START_FAILED, as for a folder the worker could not enter.
WORKDIR_REFUSED_LINE = re.compile(r"^rig: cannot enter the working folder: .*$", re.MULTILINE)


# --- API -------------------------------------------------------------------------------------

def classify(*, exit_code: int | None, cancelled: bool = False, timed_out: bool = False,
             lost: bool = False, log_tail: str = "", python_call: bool = False) -> Classification | None:
    """How an attempt ended; ``None`` when it succeeded (exit code 0 and no flag set).

    Precedence: cancelled > timed_out > lost > log evidence (CUDA_OOM > NCCL_ERROR > CUDA_ERROR)
    > exit code facts (127/126 -> COMMAND_NOT_FOUND; 128+n for a valid signal n, or a negative
    code -> SIGNAL; anything else -> NONZERO_EXIT). A SIGKILL with the kernel OOM killer's words
    in the log is host memory, not the GPU's: SIGNAL, "killed by signal SIGKILL (host out of
    memory?)". An attempt with no exit code and nothing else known is NONZERO_EXIT.
    ``python_call``: the attempt ran ``python -m rig.call`` (a @rig.task job), whose own exit
    codes (CALL_BAD_EXIT, CALL_BAD_RESULT_EXIT) are BAD_CALL / BAD_RESULT.
    """
    if cancelled:
        return Classification(FailureClass.CANCELLED, "cancelled", ())
    if timed_out:
        return Classification(FailureClass.TIMEOUT, "time limit exceeded", ())
    if lost:
        return Classification(FailureClass.LOST, "worker or node lost", ())
    if exit_code == 0:
        return None
    text = _clean(log_tail)
    found = _classify_text(text)
    if found is not None:
        return found
    if python_call and exit_code in _CALL_EXITS:
        failure, summary = _CALL_EXITS[exit_code]
        return Classification(failure, summary, _evidence(_call_lines(text)))
    return _from_exit_code(exit_code, text)


def classify_failure(log_text: str) -> Classification | None:
    """Log-only classification: CUDA_OOM, NCCL_ERROR or CUDA_ERROR from the text, else None."""
    return _classify_text(_clean(log_text))


def read_tail(path: str | os.PathLike[str], max_bytes: int = 256 * 1024) -> str:
    """The last ``max_bytes`` of a file as UTF-8 (errors replaced); '' if it does not exist.

    A character cut in half at the start of the window is dropped rather than replaced.
    """
    if max_bytes <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(max_bytes)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    if start:
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:  # UTF-8 continuation bytes
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", errors="replace")


def suggest_memory(declared: int, peak: int | None, largest_usable: int,
                   margin: float = 1.25) -> int:
    """Bytes to declare on a retry after an OOM.

    ``max(peak * margin, declared * 1.5)`` rounded up to a whole GiB (at least 1 GiB), capped at
    ``largest_usable``.
    """
    if declared < 0 or (peak is not None and peak < 0):
        raise ValueError("memory sizes must not be negative")
    want = declared * 1.5
    if peak is not None:
        want = max(want, peak * margin)
    # The small tolerance keeps float noise (10 GiB * 1.1 = 11.000000000000002 GiB) from
    # adding a whole GiB.
    gib = max(1, math.ceil(want / GIB - 1e-9))
    return min(gib * GIB, largest_usable)


# --- internals -------------------------------------------------------------------------------

def _clean(text: str) -> str:
    if not text:
        return ""
    if "\r" in text:  # progress bars redraw with a bare CR: treat it as a line end
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


@dataclass
class _Hit:
    start: int  # offset of the line in the text (the key that orders hits)
    line: str
    rule: _Rule
    match: re.Match[str]


def _scan(text: str) -> dict[FailureClass, dict[int, _Hit]]:
    """Every line that some rule matches, by class, keyed by line offset (first rule wins)."""
    hits: dict[FailureClass, dict[int, _Hit]] = {}
    vetoed: set[int] = set()
    for rule in _RULES:
        by_line = hits.setdefault(rule.failure, {})
        for m in rule.regex.finditer(text):
            start = text.rfind("\n", 0, m.start()) + 1
            if start in by_line or start in vetoed:
                continue
            end = text.find("\n", m.end())
            line = text[start:] if end < 0 else text[start:end]
            if _CODE_LINE.search(line):
                vetoed.add(start)
                continue
            if rule.veto is not None and rule.veto.search(line):
                continue
            by_line[start] = _Hit(start, line, rule, m)
    return hits


def _classify_text(text: str) -> Classification | None:
    if not text:
        return None
    hits = _scan(text)
    if any(hits.values()):
        _drop_superseded(text, hits)
    for failure in (_OOM, _NCCL, _CUDA):
        found = hits.get(failure)
        if found:
            ordered = [found[k] for k in sorted(found)]
            evidence = _evidence(h.line for h in ordered)
            if failure is _OOM:
                framework = _oom_framework(text, ordered)
                return Classification(failure, _oom_summary(ordered, framework), evidence, framework)
            return Classification(failure, _summary(ordered), evidence)
    return None


# A Python exception line: the last line of a traceback, or one printed alone ("ValueError: bad").
# Unindented, after an optional launcher prefix ("[rank0]: ", "[default1]:"): a source line in a
# traceback is indented and never one.
_PREFIX = r"(?:\[[\w-]*\]: ?)?"
_EXCEPTION_LINE = re.compile(
    rf"^{_PREFIX}(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*(?:Error|Exception|Interrupt))(?::[ \t]|:?[ \t]*$)",
    re.MULTILINE)
# A launcher's own error about a child that failed: the child's error, above it, is the one
# that decides (torchrun's ChildFailedError, accelerate's and deepspeed's CalledProcessError).
_LAUNCHER_ERRORS = frozenset({"ChildFailedError", "CalledProcessError"})
_TRACEBACK_START = re.compile(rf"^{_PREFIX}Traceback \(most recent call last\):", re.MULTILINE)
_CHAINED = re.compile(rf"^{_PREFIX}(?:During handling of the above exception, another exception occurred:"
                      rf"|The above exception was the direct cause of the following exception:)\s*$")


# Python's report of an exception it ignored (sys.unraisablehook: a __del__ or callback that
# raised at shutdown, "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__>"):
# the traceback under it is not why the program ended.
_IGNORED = re.compile(rf"^{_PREFIX}Exception ignored\b", re.MULTILINE)
# The stream a line belongs to: a launcher's per-rank prefix ("[rank1]: ", "[default0]:"), or ''.
_STREAM = re.compile(r"\[[\w-]*\]:")


def _stream(text: str, offset: int) -> str:
    """The prefix naming the rank that printed the line at ``offset`` ('' without one)."""
    m = _STREAM.match(text, offset)
    return m.group(0) if m else ""


def _final_error_start(text: str, stream: str | None = None,
                       found: tuple[list[tuple[int, str, str]], list[tuple[int, str]]] | None = None,
                       ) -> tuple[int, int] | None:
    """Where the log's final error is (``stream``: only a rank's lines, by its prefix: _stream):
    (start, end) offsets of the last exception line that is neither a launcher's nor one Python
    ignored, with its traceback and the tracebacks chained to it ("During handling of the above
    exception ..."); None when there is no such line. ``found``: _error_lines(text), when
    already read. One pass of each pattern, then bisection: a chain of thousands of tracebacks
    takes milliseconds."""
    every_exception, every_header = found or _error_lines(text)
    exceptions = [(start, name) for start, name, s in every_exception if stream in (None, s)]
    starts = [start for start, _name in exceptions]
    headers = [start for start, s in every_header if stream in (None, s)]
    for last in range(len(exceptions) - 1, -1, -1):
        if exceptions[last][1] in _LAUNCHER_ERRORS:
            continue
        final = _with_its_tracebacks(text, starts, headers, last)
        if final is not None:
            return final
    return None


def _error_lines(text: str) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """The exception lines (offset, exception name, stream) and traceback headers (offset,
    stream) of ``text``, in order: one pass of each pattern."""
    return ([(m.start(), m["name"], _stream(text, m.start())) for m in _EXCEPTION_LINE.finditer(text)],
            [(m.start(), _stream(text, m.start())) for m in _TRACEBACK_START.finditer(text)])


def _with_its_tracebacks(text: str, starts: list[int], headers: list[int], last: int) -> tuple[int, int] | None:
    """The exception line ``starts[last]`` with its traceback and those chained to it, as
    (start, end) offsets; None when Python printed it as an exception it ignored (_IGNORED)."""
    exc_start = starts[last]
    end = text.find("\n", exc_start)
    end = len(text) if end < 0 else end
    start = exc_start
    while True:
        h = bisect.bisect_left(headers, exc_start) - 1
        # Its own traceback: no other exception line between the header and it.
        if h < 0 or bisect.bisect_right(starts, headers[h]) != bisect.bisect_left(starts, exc_start):
            return start, end
        start = headers[h]
        before = text[:start].rstrip("\n")
        line_start = before.rfind("\n") + 1
        if _IGNORED.match(before, line_start):
            return None
        if not _CHAINED.match(before[line_start:]):
            return start, end
        previous = bisect.bisect_left(starts, line_start) - 1
        if previous < 0:
            return start, end
        exc_start = start = starts[previous]


def _drop_superseded(text: str, hits: dict[FailureClass, dict[int, _Hit]]) -> None:
    """Drop the GPU evidence that a different, later error supersedes.

    The final error is the last exception line (not a launcher's, nor one Python ignored), with
    its traceback and the tracebacks chained to it. When that error is itself no GPU failure (a
    ValueError, say), a GPU message printed before it was handled or only mentioned ("grep for
    CUDA out of memory", a retry loop that caught an OOM and went on): it is not why the job
    ended, and is dropped. A GPU message inside the final error, after it, or before a final
    error that is a GPU failure too (NCCL's "Cuda failure 'out of memory'" before its
    DistBackendError) stays evidence. A rank's line a launcher prefixes ("[rank0]: ") is judged
    by that rank's own final error: rank 1's "Connection reset by peer" after rank 0 ran out of
    memory does not supersede rank 0's OOM; a line without a prefix, by the log's final error.
    """
    lines = _error_lines(text)
    for stream in {_stream(text, offset) for found in hits.values() for offset in found}:
        final = _final_error_start(text, stream or None, lines)
        if final is None:
            continue
        start, end = final
        if any(start <= offset <= end for found in hits.values() for offset in found):
            continue
        for found in hits.values():
            for offset in [o for o in found if o < start and _stream(text, o) == stream]:
                del found[offset]


def _evidence(lines) -> tuple[str, ...]:
    """The last MAX_EVIDENCE distinct lines, in log order (repeats from other ranks collapse)."""
    seen: dict[str, None] = {}
    for line in lines:
        cut = line.strip()[:MAX_LINE]
        seen.pop(cut, None)
        seen[cut] = None
    return tuple(list(seen)[-MAX_EVIDENCE:])


def _oom_framework(text: str, hits: list[_Hit]) -> str | None:
    for hit in reversed(hits):
        if hit.rule.framework:
            return hit.rule.framework
    best, where = None, -1
    for name, markers in _FRAMEWORK_MARKERS:
        for marker in markers:
            for m in marker.finditer(text):
                start = m.start()
                if start > where and not (start and (text[start - 1].isalnum()
                                                     or text[start - 1] == "_")):
                    best, where = name, start
    return best


def _oom_summary(hits: list[_Hit], framework: str | None) -> str:
    summary = "CUDA out of memory"
    if framework:
        summary += f" ({_FRAMEWORK_LABELS.get(framework, framework)})"
    for hit in reversed(hits):
        size = _ALLOC_SIZE.search(hit.line)
        if size:
            return _one_line(f"{summary}: tried to allocate {_size_text(size)}")
    for hit in reversed(hits):
        if hit.rule.token:
            return f"{summary}: {hit.match.group(0)}"
    return summary


def _size_text(m: re.Match[str]) -> str:
    if m["size"]:
        return m["size"]
    if m["xla"]:
        return m["xla"]
    if m["tensor"]:
        return m["tensor"]
    return _human_bytes(int(m["bytes"].replace(",", "")))


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _summary(hits: list[_Hit]) -> str:
    """The summary for NCCL and CUDA errors: the last line of the most specific rule seen."""
    order = {id(rule): i for i, rule in enumerate(_RULES)}
    best = min(hits, key=lambda h: (order[id(h.rule)], -h.start))
    rule, line = best.rule, best.line
    if rule.summary:
        return rule.summary
    if rule.failure is _NCCL:
        return _one_line(_nccl_summary(line))
    msg = best.match.groupdict().get("msg") or best.match.group(0)
    return _one_line(f"CUDA error: {msg.strip()}")


def _nccl_summary(line: str) -> str:
    if "Watchdog caught collective operation timeout" in line:
        op = ms = None
        for m in _WATCHDOG.finditer(line):
            op = op or m["op"]
            ms = ms or m["ms"]
        detail = ", ".join(x for x in (op, f"after {ms} ms" if ms else None) if x)
        return "NCCL collective operation timed out" + (f" ({detail})" if detail else "")
    code = _NCCL_CODE.search(line)
    if code:
        return f"NCCL error: {code['msg'].strip()}"
    m = _NCCL_ERROR_IN.search(line)
    if m and m["msg"].strip():
        version = f" (NCCL {m['v']})" if m["v"] else ""
        return f"NCCL error: {m['msg'].strip()}{version}"
    return "NCCL error"


def _one_line(text: str, limit: int = MAX_LINE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _signal_name(number: int) -> str | None:
    if not 1 <= number < signal.NSIG:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _from_exit_code(exit_code: int | None, text: str) -> Classification:
    if exit_code is None:
        return Classification(FailureClass.NONZERO_EXIT, "ended without an exit code", ())
    if exit_code in (126, 127):
        # Only when the command could not start: said by rig's wrapper (before running it) or
        # by the shell of a --cmd string. A program that ran and exited 126/127 is a plain
        # non-zero exit (and may be retried).
        # The last line only: an earlier, handled "not found" says nothing about this exit.
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
        if exit_code == 126 and (refused := _matching_lines(((WORKDIR_REFUSED_LINE, None),), last)):
            return Classification(FailureClass.START_FAILED, "working folder not reachable by its user (exit 126)",
                                  _evidence(refused))
        lines = _matching_lines(((CANNOT_START_LINE, None),), last)
        if lines:
            what = "command not found" if exit_code == 127 else "command not executable"
            return Classification(FailureClass.COMMAND_NOT_FOUND, f"{what} (exit {exit_code})",
                                  _evidence(lines))
    name = None
    if exit_code > 128:
        name = _signal_name(exit_code - 128)
    elif exit_code < 0:
        name = _signal_name(-exit_code)
    if name is not None:
        if name == "SIGKILL":
            lines = _matching_lines(_KERNEL_OOM, text)
            if lines:
                return Classification(FailureClass.SIGNAL,
                                      f"killed by signal SIGKILL (host out of memory?) "
                                      f"(exit {exit_code})", _evidence(lines))
        return Classification(FailureClass.SIGNAL, f"killed by signal {name} (exit {exit_code})", ())
    lines = _matching_lines(_HOST_OOM, text)
    if lines:
        return Classification(FailureClass.NONZERO_EXIT,
                              f"exit code {exit_code} (host out of memory?)", _evidence(lines))
    return Classification(FailureClass.NONZERO_EXIT, f"exit code {exit_code}", ())


def _call_lines(text: str) -> list[str]:
    """rig.call's own one-line verdicts ("rig.call: ...") in the log, in log order."""
    return [line for line in text.splitlines() if line.startswith("rig.call: ")]


def _matching_lines(rules, text: str) -> list[str]:
    """Lines where a finder matches (and the line check, if any, passes), in log order."""
    lines: dict[int, str] = {}
    for finder, check in rules:
        for m in finder.finditer(text):
            start = text.rfind("\n", 0, m.start()) + 1
            if start in lines:
                continue
            end = text.find("\n", m.end())
            line = text[start:] if end < 0 else text[start:end]
            if check is None or check.search(line):
                lines[start] = line
    return [lines[k] for k in sorted(lines)]
