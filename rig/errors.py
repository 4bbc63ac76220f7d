"""One error tree for rig. Every error a person can see is one line that says what to do.

Each class carries the process exit code the CLI uses for it, so scripts can tell the
classes of failure apart.
"""

from __future__ import annotations


class RigError(Exception):
    """Base of every error rig raises on purpose."""

    exit_code = 1


class InvalidInput(RigError):
    """The request itself is malformed (bad memory size, unknown priority, empty command)."""

    exit_code = 2


class Unschedulable(RigError):
    """The request is well formed but can never run on the cards rig knows about."""

    exit_code = 3


class JobNotFound(RigError):
    """No job with that id exists."""

    exit_code = 4

    def __init__(self, job_id: object) -> None:
        super().__init__(f"no job with id {job_id}; `rig jobs` lists the jobs that exist")
        self.job_id = job_id


class JobGone(JobNotFound):
    """The job's id now names another job: Redis lost its data and gave the id again."""

    def __init__(self, job_id: object, message: str) -> None:
        RigError.__init__(self, message)
        self.job_id = job_id


def record_vanished(job_id: object, doing: str) -> JobGone:
    """The error for a job whose record was read once and is gone now, ``doing`` what (Redis
    lost its data: the job may still run, unknown to this Redis)."""
    return JobGone(job_id, f"job {job_id} is gone: its record vanished from rig's Redis while it was {doing} "
                           "(Redis lost its data?); `rig status` says what the node did with it")


class RedisUnavailable(RigError):
    """The Redis server that holds rig's state cannot be reached."""

    exit_code = 5

    def __init__(self, url: str, cause: object = None) -> None:
        detail = f" ({cause})" if cause else ""
        super().__init__(
            f"cannot reach Redis at {redact_url(url)}{detail}; start rig with `rig up` "
            "or set RIG_REDIS_URL to a running Redis"
        )
        self.url = url

    @classmethod
    def said(cls, url: str, message: str) -> RedisUnavailable:
        """This error with its own ``message`` (what the server said and what to do)."""
        err = cls.__new__(cls)
        RigError.__init__(err, message)
        err.url = url
        return err


class RedisAuthFailed(RedisUnavailable):
    """Redis answers but refuses rig's credentials (wrong or missing password, an ACL user
    without the rights). Same exit code as RedisUnavailable: rig cannot use that Redis either
    way; the message (built by rig.redis_conn.auth_failed) says which and what to do."""

    exit_code = 5

    def __init__(self, message: str, url: str) -> None:
        RigError.__init__(self, message)
        self.url = url


class RedisRefusesWrites(RedisUnavailable):
    """Redis answers but refuses to store anything (a read-only replica, a failed RDB save:
    MISCONF); the refused write changed nothing. An outage like an unreachable Redis, same exit
    code; the message (rig.redis_writes.refused_error) says which and what to do."""

    exit_code = 5

    def __init__(self, message: str, url: str) -> None:
        RigError.__init__(self, message)
        self.url = url


class RedisFull(RedisRefusesWrites):
    """Redis reached its maxmemory with the noeviction policy and refuses writes until its
    maxmemory is raised or memory is freed."""

    exit_code = 5


class ConfigError(RigError):
    """The configuration file or environment holds a value rig cannot use."""

    exit_code = 6


class StackError(RigError):
    """Bringing the stack up or down failed."""

    exit_code = 7


class PermissionDenied(RigError):
    """The caller may not do this to that job (another user's job; the caller is no admin)."""

    exit_code = 8


class InvalidRecord(RigError):
    """A record read from Redis is malformed or hostile; ``field`` names the first bad field."""

    exit_code = 9

    def __init__(self, what: str, field: str, problem: str) -> None:
        super().__init__(f"{what}: invalid record: field {field}: {problem}")
        self.what = what
        self.field = field
        self.problem = problem


class NodeInUse(RigError):
    """A node cannot be forgotten yet: it is up, or jobs still run or are placed on it."""

    exit_code = 10


def redact_url(url: str) -> str:
    """Hide a password in a redis:// URL (and a sentinel:// URL's sentinel_password) before it
    is printed."""
    from rig.sentinel_url import redact

    url = redact(url)
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{scheme}://{user}:***@{host}"


class SubmitInterrupted(KeyboardInterrupt):
    """Ctrl-C arrived after the jobs were stored (while their Flower messages went out): they
    are queued and will run. Carries their ids, so the caller can say so."""

    def __init__(self, job_ids: list[int]) -> None:
        super().__init__(f"interrupted after submitting job(s) {', '.join(map(str, job_ids))}")
        self.job_ids = job_ids


class LogMissing(RigError):
    """A job's log file is not where rig wrote it: moved or deleted (on this machine), or on
    the node that ran the attempt. Not bad input (the request was fine) and not an unknown job:
    the general failure code, the same for ``rig log`` and ``rig log -f``."""

    exit_code = 1
