"""One node (cards or control workers) per RIG_HOME: a tester's `rig up --daemon --node other
--fake-gpus 2x24G` beside node vm in the same home was accepted, and both nodes' workers wrote
logs/system/card0.log, control.log, beat.log, up.log. A second node is refused in one line
(exit 7) naming the running one; a `--only flower` add-on (docs/FLOWER.md) is not a node."""

from __future__ import annotations

import os

import pytest

from rig.config import load_settings
from rig.errors import StackError
from rig.stack import Stack, UpOptions, pid_file, root_node_here, second_node, write_pid_file
from tests.conftest import HIDDEN_PID


def _running(home, node: str, *, kind: str = "node") -> None:
    """A live rig up of ``node`` in ``home`` (this test process stands for it)."""
    settings = load_settings(home=home, node_name=node)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    write_pid_file(settings, node=kind == "node")
    assert pid_file(settings).read_text().split()[0] == str(os.getpid())


def test_a_second_node_in_one_home_is_refused_naming_the_running_one(tmp_path):
    _running(tmp_path / "home", "vm")
    other = load_settings(home=tmp_path / "home", node_name="other", fake_gpus="2x24G")
    with pytest.raises(StackError) as err:
        Stack(other, UpOptions(), say=lambda _: None).up()
    line = str(err.value)
    assert err.value.exit_code == 7 and "\n" not in line
    assert "already runs node vm (pid" in line and "RIG_HOME=" in line and "rig up --node other" in line, line
    assert not pid_file(other).exists()  # nothing of it was started or written


def test_a_flower_add_on_is_no_second_node_and_may_run_beside_one(tmp_path):
    _running(tmp_path / "home", "vm-flower", kind="addon")
    assert second_node(load_settings(home=tmp_path / "home", node_name="vm")) is None
    _running(tmp_path / "home", "vm")
    assert second_node(load_settings(home=tmp_path / "home", node_name="vm")) is None  # itself
    assert "already runs node vm " in second_node(load_settings(home=tmp_path / "home", node_name="b"))


def test_two_rig_ups_started_at_once_in_one_home_cannot_both_pass(tmp_path):
    """The pid files are written after the checks that read them: two rig ups started at the
    same moment both passed. The home's node lock, taken before them, refuses the second with
    the same line, whether it names the same node or another; an add-on takes no lock."""
    import subprocess
    import sys

    from rig.stack import hold_home_lock

    home = tmp_path / "home"
    vm = load_settings(home=home, node_name="vm")
    vm.run_dir.mkdir(parents=True, exist_ok=True)
    # Another process holds it, as another rig up would (flock is per open file).
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from rig.config import load_settings; from rig.stack import hold_home_lock; "
        f"hold_home_lock(load_settings(home={str(home)!r}, node_name='vm')); print(flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline()  # it holds the lock, before it wrote its pid file
        with pytest.raises(StackError, match=r"^another rig up is starting in this RIG_HOME \(.*\) right now"):
            hold_home_lock(vm)
        pid_file(vm).write_text(f"{holder.pid}\nredis://127.0.0.1:6379/0\nnode\n")  # then it writes it
        with pytest.raises(StackError, match=rf"^rig is already up on node vm \(pid {holder.pid}\)"):
            hold_home_lock(vm)
        other = load_settings(home=home, node_name="other", fake_gpus="2x24G")
        with pytest.raises(StackError) as err:
            Stack(other, UpOptions(), say=lambda _: None).up()
        assert f"already runs node vm (pid {holder.pid})" in str(err.value) and err.value.exit_code == 7
        assert not pid_file(other).exists()
        pid_file(vm).unlink()
        # The pid-file checks alone would have let it start: the lock refuses it.
        with pytest.raises(StackError, match="another rig up is starting in this RIG_HOME"):
            Stack(other, UpOptions(), say=lambda _: None).up()
    finally:
        holder.kill()
        holder.wait(10)
    fd = hold_home_lock(vm)  # the kernel let go when its holder died (SIGKILL)
    os.close(fd)


def test_two_homes_naming_one_system_log_dir_are_refused_naming_the_node_that_writes_there(tmp_path):
    """Nodes in two homes whose configs give one absolute system_log_dir wrote the same
    card0.log, control.log, up.log, ... with no word. The second is refused in one line (exit 7)
    naming the first, before anything is started or written; once the first is gone it starts."""
    from rig.stack import LOG_DIR_LOCK, hold_log_dir_lock

    logs = tmp_path / "logs"
    logs.mkdir()
    first = load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs)
    held = hold_log_dir_lock(first)  # node vm's rig up, in home a
    other = load_settings(home=tmp_path / "b", node_name="other", fake_gpus="2x24G", system_log_dir=logs)
    stack = Stack(other, UpOptions(), say=lambda _: None)
    try:
        with pytest.raises(StackError) as err:
            stack.up()
    finally:
        stack.release_home()
    line = str(err.value)
    assert err.value.exit_code == 7 and "\n" not in line
    assert f"system_log_dir {logs} is already the logs of node vm (pid {os.getpid()}, RIG_HOME={tmp_path / 'a'})" \
        in line and "RIG_SYSTEM_LOG_DIR=" in line, line
    assert not pid_file(other).exists()
    assert sorted(p.name for p in logs.iterdir()) == [LOG_DIR_LOCK]  # no log of node other's
    (logs / LOG_DIR_LOCK).write_text("old\n999999999\n/gone\n")  # a holder that could not write its own
    with pytest.raises(StackError, match=r"is already the logs of another node \(its rig up runs\); two nodes"):
        hold_log_dir_lock(other)
    os.close(held)  # node vm stopped (or died: the kernel lets go)
    fd = hold_log_dir_lock(other)
    assert (logs / LOG_DIR_LOCK).read_text() == f"other\n{os.getpid()}\n{tmp_path / 'b'}\n"
    os.close(fd)


def test_a_system_log_dir_holder_proc_hides_is_named(tmp_path, hidden_by_proc):
    """Under /proc hidepid=2 another user's rig up holding the system_log_dir lock has no
    /proc entry for this user: the refusal said "another node" though the lock file names it.
    kill(pid, 0) says it runs (EPERM): the refusal names its node, pid and home."""
    from rig.stack import LOG_DIR_LOCK, hold_log_dir_lock

    logs = tmp_path / "logs"
    logs.mkdir()
    held = hold_log_dir_lock(load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs))
    try:
        (logs / LOG_DIR_LOCK).write_text(f"vm\n{HIDDEN_PID}\n{tmp_path / 'a'}\n")  # root's rig up, say
        hidden_by_proc(HIDDEN_PID, PermissionError)  # hidepid=1 this time: there, unreadable
        with pytest.raises(StackError) as err:
            hold_log_dir_lock(load_settings(home=tmp_path / "b", node_name="other", system_log_dir=logs))
    finally:
        os.close(held)
    assert f"is already the logs of node vm (pid {HIDDEN_PID}, RIG_HOME={tmp_path / 'a'})" in str(err.value), err.value


def test_rig_up_daemon_refused_another_nodes_system_log_dir_writes_nothing_there(tmp_path, monkeypatch):
    """`rig up --daemon` of a node whose system_log_dir another node's rig up holds started its
    daemon with that folder's up.log as its output: the refusal (naming the other node) landed
    in the other node's up.log. The parent is refused first, in the order the daemon would be."""
    from click.testing import CliRunner

    from rig.cli.main import cli
    from rig.stack import LOG_DIR_LOCK, hold_log_dir_lock

    logs = tmp_path / "logs"
    logs.mkdir()
    held = hold_log_dir_lock(load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs))
    for name, value in (("HOME", tmp_path / "b"), ("SYSTEM_LOG_DIR", logs), ("NODE_NAME", "other"),
                        ("FAKE_GPUS", "2x24G"), ("REDIS_URL", "redis://127.0.0.1:1/0")):  # never asked
        monkeypatch.setenv(f"RIG_{name}", str(value))
    try:
        result = CliRunner().invoke(cli, ["up", "--daemon", "--no-flower", "--no-metrics", "--no-gateway"])
    finally:
        os.close(held)
    assert result.exit_code == 7, result.output
    assert f"system_log_dir {logs} is already the logs of node vm (pid {os.getpid()}" in result.output
    assert sorted(p.name for p in logs.iterdir()) == [LOG_DIR_LOCK]  # nothing said in vm's up.log


def test_an_add_on_of_another_home_is_refused_another_nodes_system_log_dir(tmp_path, monkeypatch):
    """`rig up --only flower` (or `--only gateway`) from another RIG_HOME naming the
    system_log_dir a running node holds shared its up.log, flower.log, gateway.out: refused in
    one line (exit 7), by the daemon's parent before anything is written there and by rig up
    itself. From the node's own home (another node name too) it may run; with no node there,
    nothing is refused."""
    from click.testing import CliRunner

    from rig.cli.main import cli
    from rig.stack import LOG_DIR_LOCK, check_add_on_log_dir, hold_log_dir_lock

    def past_the_check(_self) -> None:  # never reach a Redis, whatever happens
        raise AssertionError("rig up went past the log folder's check")

    monkeypatch.setattr(Stack, "_ensure_redis", past_the_check)
    logs = tmp_path / "logs"
    logs.mkdir()
    check_add_on_log_dir(load_settings(home=tmp_path / "b", node_name="vm", system_log_dir=logs), ("flower",))
    held = hold_log_dir_lock(load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs))
    try:
        for part in ("flower", "gateway"):
            other = load_settings(home=tmp_path / "b", node_name="vm", system_log_dir=logs)
            stack = Stack(other, UpOptions(only=(part,)), say=lambda _: None)
            with pytest.raises(StackError) as err:
                stack.up()
            line = str(err.value)
            assert err.value.exit_code == 7 and "\n" not in line
            assert f"is already the logs of node vm (pid {os.getpid()}, RIG_HOME={tmp_path / 'a'})" in line, line
            assert f"`rig up --only {part}` of RIG_HOME={tmp_path / 'b'}" in line, line
        for name, value in (("HOME", tmp_path / "b"), ("SYSTEM_LOG_DIR", logs), ("NODE_NAME", "vm"),
                            ("REDIS_URL", "redis://127.0.0.1:1/0")):  # never asked
            monkeypatch.setenv(f"RIG_{name}", str(value))
        result = CliRunner().invoke(cli, ["up", "--daemon", "--only", "flower"])
        assert result.exit_code == 7 and "is already the logs of node vm" in result.output, result.output
        assert sorted(p.name for p in logs.iterdir()) == [LOG_DIR_LOCK]  # no up.log, flower.log
        # The node's own home: its add-ons are the node's (docs/FLOWER.md).
        for node in ("vm", "vm-flower"):
            check_add_on_log_dir(load_settings(home=tmp_path / "a", node_name=node, system_log_dir=logs), ("flower",))
    finally:
        os.close(held)
    check_add_on_log_dir(load_settings(home=tmp_path / "b", node_name="vm", system_log_dir=logs), ("flower",))


def test_a_node_lock_that_is_a_symlink_is_refused_and_its_target_left_alone(tmp_path):
    """node.lock was opened following symlinks, then truncated and written: a link planted in a
    folder others may write had a (root) rig up cut the file it named. Refused in one line."""
    from rig.stack import LOG_DIR_LOCK, hold_log_dir_lock

    logs = tmp_path / "logs"
    logs.mkdir()
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    (logs / LOG_DIR_LOCK).symlink_to(victim)
    with pytest.raises(StackError) as err:
        hold_log_dir_lock(load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs))
    line = str(err.value)
    assert "\n" not in line and f"rig up refuses {logs / LOG_DIR_LOCK}: it is a symlink" in line, line
    assert "RIG_SYSTEM_LOG_DIR=" in line
    assert victim.read_text() == "root:x:0:0\n"


def _as_nobody(fn) -> str:
    """What ``fn()`` raised (its text) in a child process run as user nobody (this one is root)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        text = "no error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except BaseException as exc:  # noqa: BLE001 - the child reports whatever it was
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    return text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_a_log_dir_this_user_cannot_write_is_not_called_another_users_node(tmp_path):
    """A system_log_dir this user may not write, with no lock file in it, was refused as
    'system_log_dir is another user's node's', of a folder no node had used. The line says which
    is true: this user may not write there, or the lock file is that user's."""
    import shutil
    import tempfile
    from pathlib import Path

    from rig.stack import LOG_DIR_LOCK, hold_log_dir_lock

    top = Path(tempfile.mkdtemp(prefix="rig-logdir-", dir="/tmp"))  # pytest's tmp_path: 0700 parents
    try:
        top.chmod(0o755)
        logs = top / "logs"
        logs.mkdir(mode=0o755)  # root's, not writable by nobody
        settings = load_settings(home=tmp_path / "a", node_name="vm", system_log_dir=logs)
        line = _as_nobody(lambda: hold_log_dir_lock(settings))
        assert line.startswith("StackError: ") and "\n" not in line, line
        assert f"user nobody may not write in {logs};" in line and "another user" not in line, line
        (logs / LOG_DIR_LOCK).write_text("")
        (logs / LOG_DIR_LOCK).chmod(0o600)  # root's lock file, unreadable by nobody
        line = _as_nobody(lambda: hold_log_dir_lock(settings))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert "it is user root's node's lock; give node vm a folder of its own" in line, line


def test_a_users_node_with_real_cards_beside_roots_is_refused(tmp_path, monkeypatch):
    """A teammate's `rig up` on a server where root's rig up runs (its own private Redis, or the
    node's under another name) started without a word: with real cards both nodes fill every
    card, neither counting the other's jobs. Refused in one line (exit 7) before anything starts,
    naming root's rig up and its gateway; fake cards, root itself and no live root node pass."""
    from rig.gateway.paths import write_supervisor_mark

    socket_path = tmp_path / "gw" / "gw.sock"
    socket_path.parent.mkdir()
    write_supervisor_mark(socket_path)  # root's (this test runs as root: .ci/run) live rig up: this process
    if os.stat(socket_path.parent / "gw.sock.up").st_uid != 0:
        pytest.skip("the mark must be root's (run as root)")
    monkeypatch.setattr(os, "geteuid", lambda: 1001)

    def started(*a, **kw):  # past the checks: never start a node from a test
        raise AssertionError("rig up went on to start its parts")

    monkeypatch.setattr(Stack, "stop_leftovers", started)
    mine = load_settings(home=tmp_path / "home", node_name="mine", gateway_socket=socket_path,
                         redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(StackError) as err:
        Stack(mine, UpOptions(), say=lambda _: None).up()
    line = str(err.value)
    assert err.value.exit_code == 7 and "\n" not in line
    assert line.startswith(f"rig is already up on this server as root (its rig up, pid {os.getpid()}, serves the "
                           f"gateway {socket_path})"), line
    assert not pid_file(mine).exists()
    assert root_node_here(load_settings(home=tmp_path / "h2", gateway_socket=socket_path, fake_gpus="2x24G")) is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert root_node_here(mine) is None
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    (socket_path.parent / "gw.sock.up").write_text(f"{HIDDEN_PID}\n1\n")  # its rig up is gone
    assert root_node_here(mine) is None
