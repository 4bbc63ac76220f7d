"""``rig up --daemon``: where the daemon says why it could not start, so that the command that
started it shows that reason (and not another rig up's line from the shared up.log)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def reason_path(run_dir: Path, node: str) -> Path:
    """A file of its own for one daemon start (two starts at once must not share one)."""
    return run_dir / f"up-{node}.{os.getpid()}.{secrets.token_hex(4)}.why"


def write_reason(path: Path | None, why: BaseException | str) -> None:
    """The daemon's one line on why it ends before or instead of running (best effort)."""
    if path is None or isinstance(why, KeyboardInterrupt | SystemExit):
        return
    text = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
    try:
        path.write_text(text + "\n")
    except OSError:
        pass


def daemon_reason(path: Path, log: Path) -> str:
    """The reason the daemon wrote (then forgotten), else a pointer to its log."""
    try:
        text = path.read_text(errors="replace").strip()
        path.unlink(missing_ok=True)
    except OSError:
        text = ""
    return text or f"see {log}"


def home_nodes(run_dir: Path) -> dict[str, int]:
    """Node name -> pid of each live ``rig up`` of this RIG_HOME (its ``up-<node>.pid`` files)."""
    from workers.process_tree import is_alive

    found: dict[str, int] = {}
    for path in sorted(run_dir.glob("up-*.pid")):
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if is_alive(pid, None):
            found[path.name[len("up-"):-len(".pid")]] = pid
    return found


def _name_origin(settings) -> str:  # noqa: ANN001 - rig.config.Settings
    """Where the node name came from when no --node was given: "the default name", "from
    RIG_NODE_NAME", "from the config file" (rig.config.setting_origins, the rule `rig config` shows)."""
    from rig.config import setting_origins

    try:
        origin = setting_origins(settings).get("node_name", "default")
    except Exception:  # noqa: BLE001 - only words: the default's
        origin = "default"
    if origin == "default":
        return "the default name"
    return "from the config file" if origin == "file" else f"from {origin}"


def another_home_node(settings, *, named: bool, command: str) -> str | None:  # noqa: ANN001 - rig.config.Settings
    """When this home runs no rig up of the node asked for but runs another node, the one line
    that says so and what to type (``rig COMMAND --node OTHER``); else None. A command of one
    node (``rig down``, ``rig recover``) typed without --node in a home whose rig up was given
    ``--node a`` would otherwise act on, or report about, the hostname's node."""
    node = settings.node_name
    others = {n: p for n, p in home_nodes(settings.run_dir).items() if n != node}
    if not others:
        return None
    which = ", ".join(f"{n} (pid {p})" for n, p in sorted(others.items()))
    what = " or ".join(f"`rig {command} --node {n}`" for n in sorted(others))
    asked = f"node {node}" + ("" if named else f" ({_name_origin(settings)}: no --node given)")
    return f"rig is not up on {asked} from this home; this home runs node {which}: {what}"


def not_up(settings, *, named: bool) -> tuple[str, int]:  # noqa: ANN001 - rig.config.Settings
    """What ``rig down`` says when this home runs no rig up of the node asked for, and its exit
    code: another node of this home runs (say which, and what to type: 2); the node name is
    owned by a rig up of another home or host (name it, and where to type what: 10); else
    plainly not up (0). A node named with --node that another home owns is that owner's
    (``rig down --node b`` in node a's home said to type `rig down --node a`, which stops the
    node the operator did not name); without --node, this home's own node comes first."""
    node = settings.node_name
    other = another_home_node(settings, named=named, command="down")
    if other and not named:
        return (other, 2)
    elsewhere = _owner_elsewhere(settings)
    if elsewhere:
        return (elsewhere, 10)
    if other:
        return (other, 2)
    return (f"rig is not up on {node}", 0)


def _owner_elsewhere(settings) -> str | None:  # noqa: ANN001 - rig.config.Settings
    """The line naming the live rig up of another home or host that owns the node name, and
    where to type `rig down` for it; None when there is none (or no Redis answers: only a hint)."""
    node = settings.node_name
    try:
        from rig.keys import Keys
        from rig.node_claim import holder, there
        from rig.redis_conn import connect

        owner = holder(connect(settings.redis_url, timeout=2.0, reply_timeout=2.0), Keys(settings.key_prefix), node)
    except Exception:  # noqa: BLE001 - only a hint: no Redis, no hint
        return None
    if owner is None or owner.same_home(settings.home) or owner.provably_dead():
        return None
    return (f"rig is not up on node {node} from RIG_HOME={settings.home}, and nothing was changed: node {node} "
            f"is owned by a rig up ({owner.describe()}); to stop it: {there(node, owner, 'down')}")
