"""Whose a job is, and who may act on it: the one rule (the client's check, the gateway's
check and what the gateway hides of other users' jobs all ask here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig.errors import PermissionDenied

if TYPE_CHECKING:
    from rig.client import Identity
    from rig.models import Job

ADMINS_HINT = "(root, or a user named in `admins` / RIG_ADMINS)"


def owns(job: Job, who: Identity) -> bool:
    """Did ``who`` submit ``job``? By login name, as recorded from the submitter's real uid
    (the gateway's peer credentials). A record with a damaged owner is nobody's."""
    return job.field_valid("user") and job.user == who.name


def refusal(job: Job, who: Identity, *, admin: bool, action: str) -> PermissionDenied | None:
    """The error for ``who`` doing ``action`` to ``job``, or None when they may (its owner,
    or an admin)."""
    if admin or owns(job, who):
        return None
    if not job.field_valid("user"):
        return PermissionDenied(f"job {job.id} has no valid owner in its record; only an admin may {action} it "
                                + ADMINS_HINT)
    return PermissionDenied(f"job {job.id} belongs to {job.user}; only {job.user} or an admin may {action} it "
                            + ADMINS_HINT)
