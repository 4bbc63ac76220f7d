"""Which OS user a job runs as on this node.

A card worker running as root runs each job as the user who submitted it, as a batch scheduler
does: that user's uid, primary gid and supplementary groups from *this node's* password and
group databases (``getpwnam``, ``getgrouplist``), with HOME, USER and LOGNAME from the passwd
entry. The switch happens in the job's child process between fork and exec (subprocess's
``user=``, ``group=``, ``extra_groups=``), so nothing of the job ever runs with root's rights.

A worker not running as root cannot switch users: every job runs as the worker's own user,
whoever submitted it (README, "Sharing a server").

The job's user is the login name the client recorded from its real uid; its uid is recorded
too. A job is refused (it ends FAILED with the reason, it never runs as someone else) when:
- the user does not exist on this node;
- the user's uid here differs from the uid recorded at submission (two different accounts
  with one name);
- the user is root (uid 0) and ``allow_root_jobs`` is off.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass


class RunAsRefused(Exception):
    """This node will not run the job as its user; ``str()`` is the reason a person reads."""


@dataclass(frozen=True)
class RunAs:
    """The identity a job's process takes (uid, gids as numbers; home an absolute path)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def env(self) -> dict[str, str]:
        """The identity variables a login would set."""
        return {"HOME": self.home, "USER": self.user, "LOGNAME": self.user}

    def popen_args(self) -> dict[str, object]:
        """Keyword arguments for subprocess.Popen that switch the child to this identity
        (setgroups, setgid, setuid, in that order, after fork and before exec). None when the
        worker already is that identity: then Popen may use vfork, which a switch rules out —
        a fork of a large worker costs several ms of system time per job."""
        same_groups = set(self.groups) | {self.gid} == set(os.getgroups()) | {os.getgid()}
        if (self.uid, self.gid) == (os.getuid(), os.getgid()) and same_groups:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def decide(
    user: str,
    uid: int | None,
    *,
    worker_uid: int,
    allow_root_jobs: bool,
    getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
    getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist,
) -> RunAs | None:
    """The identity to run a job of ``user`` (recorded ``uid``, None in old records) as.

    Returns None when the worker is not root (``worker_uid`` != 0): the job runs as the worker.
    Raises RunAsRefused when the job must not run here (see the module's docstring).
    """
    if worker_uid != 0:
        return None
    try:
        entry = getpwnam(user)
    except KeyError:
        raise RunAsRefused(
            f"user {user!r} does not exist on this node, so the job cannot run as its submitter; "
            "create the account here (same uid) or run the job on a node that has it") from None
    if uid is not None and entry.pw_uid != uid:
        raise RunAsRefused(
            f"user {user!r} has uid {entry.pw_uid} on this node but uid {uid} where the job was "
            "submitted; give the account one uid on every node")
    if entry.pw_uid == 0 and not allow_root_jobs:
        raise RunAsRefused(
            f"jobs of {user} (uid 0) do not run on this node (allow_root_jobs = false); "
            "submit it as an ordinary user")
    try:
        groups = tuple(sorted(set(getgrouplist(entry.pw_name, entry.pw_gid))))
    except OSError as exc:
        raise RunAsRefused(f"cannot read the groups of user {user!r} on this node: {exc}") from None
    home = entry.pw_dir if entry.pw_dir.startswith("/") else "/"
    return RunAs(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=home)
