"""The gateway (rig.gateway): rig's API on a Unix socket, the caller's identity from the kernel.

A real socket and server thread in this process, over a Client on fakeredis or real Redis.
The socket's real peer is this test (root or not); other users are played by handing the
Gateway a Peer with their uid, which is what SO_PEERCRED would have said for them (the tests
with real second and third Unix users are in tests/integration/test_gateway_users.py)."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput, JobNotFound, PermissionDenied
from rig.forecast import NO_CARDS, Forecast, StartEstimate, forecast
from rig.forecast_store import publish
from rig.gateway import privacy, wire
from rig.gateway.client import GatewayClient, GatewayUnavailable
from rig.gateway.server import Gateway, Peer, bind
from rig.models import Job, JobState, Priority
from rig.waiting import NO_DISPATCHER
from tests.conftest import HIDDEN_PID
from tests.store.conftest import add_cards

ALICE, BOB = 40001, 40002  # uids without a passwd entry: their names are the uids as text


@pytest.fixture
def gateway(redis_client, key_prefix, tmp_path) -> Iterator[tuple[Gateway, Path]]:
    settings = load_settings(home=tmp_path / "home", key_prefix=key_prefix, admins=["root"])
    gw = Gateway(settings, Client(settings, redis_client=redis_client))
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-{key_prefix.split(':')[1]}.sock")
    server = bind(path, gw)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield gw, path
    server.shutdown()
    server.server_close()
    path.unlink(missing_ok=True)


def _as(gw: Gateway, uid: int, op: str, **args):  # noqa: ANN202
    """What the gateway answers a peer of ``uid`` (as SO_PEERCRED would name it)."""
    answer = gw.handle(Peer(os.getpid(), uid, uid), {"op": op, "args": wire.encode(args)})
    if answer["ok"]:
        return wire.decode(answer["result"])
    return answer["error"]


def _submit_as(gw: Gateway, uid: int, **options) -> Job:
    options = {"gpu_memory": "1G", "workdir": "/tmp", "env": {"WANDB_API_KEY": "secret-of-" + str(uid)}, **options}
    answer = _as(gw, uid, "submit", command=["python", "train.py", "--token", "t0p"], options=options,
                 environ={"CONDA_PREFIX": "/c", "HOME": "/home/x"})
    assert isinstance(answer, dict) and "job" in answer, answer
    return answer["job"]


def test_the_wire_rebuilds_rigs_objects_and_nothing_else():
    job = Job(id=3, name="n", user="u", command=["a"], gpu_memory=1, gpus=1, priority=Priority.HIGH,
              state=JobState.RUNNING, workdir="/", created_at=1.0, env={"A": "1"}, cards=[0, 2])
    assert wire.decode(wire.encode(job)) == job
    assert wire.decode(wire.encode({JobState.PENDING: 2, Priority.LOW: None})) == {JobState.PENDING: 2,
                                                                                   Priority.LOW: None}
    with pytest.raises(wire.WireError, match="unknown object type"):
        wire.decode({"__t": "Popen", "f": {"args": ["sh"]}})
    with pytest.raises(wire.WireError, match="unknown value type"):
        wire.decode({"__e": "Signals", "v": 9})


def test_submit_watch_and_kill_through_the_socket(gateway):
    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    me = client.ping()
    assert me["uid"] == os.getuid()
    handle = client.submit(["sleep", "1"], gpu_memory="2G", env={"X": "1"}, priority="high")
    job = client.get(handle.id)
    assert job.user == me["user"] and job.uid == os.getuid()  # the kernel's word, not the client's
    assert job.env["X"] == "1" and job.workdir == os.getcwd()
    assert [j.id for j in client.jobs()] == [job.id]
    assert client.status().pending[Priority.HIGH] == 1
    assert client.kill(job.id).state is JobState.CANCELLED
    many = client.submit_many([{"command": ["true"], "gpu_memory": "1G"} for _ in range(3)])
    assert [h.id for h in many] == [job.id + 1, job.id + 2, job.id + 3]
    with pytest.raises(JobNotFound):
        client.get(999)
    with pytest.raises(InvalidInput, match="12Q"):
        client.submit(["true"], gpu_memory="12Q")
    # Breaker (pyapi): env={"A": b"x"} ran the job with A="b'x'" (str() of the bytes).
    with pytest.raises(InvalidInput, match=r"^env A: give its value as text"):
        client.submit(["true"], gpu_memory="1G", env={"A": b"x"})
    # Breaker (pyapi): through the gateway a slip was 'unknown submit option(s): gpu_mem'.
    with pytest.raises(InvalidInput, match=r"^request 0: no option 'gpu_mem' \(did you mean gpu_memory\?\)$"):
        client.submit_many([{"command": ["true"], "gpu_mem": "1G"}])


def test_rig_kill_of_several_ids_through_the_socket(gateway, capsys):
    """`rig kill A B C` reads the records together and cancels the waiting ones together
    (Client.records, cancel_waiting): a user without Redis' password reaches rig through the
    gateway, whose client must answer both (CI: 'GatewayClient' object has no attribute 'records')."""
    from rig.cli.kill import kill_jobs

    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    ids = [h.id for h in client.submit_many([{"command": ["true"], "gpu_memory": "1G"} for _ in range(3)])]
    assert kill_jobs(client, [*ids, 999], wait=False) == JobNotFound.exit_code
    assert [client.get(j).state for j in ids] == [JobState.CANCELLED] * 3
    out = capsys.readouterr()
    assert out.out.count("cancelled (was pending)") == 3 and "no job with id 999" in out.err


def test_another_user_sees_that_a_job_exists_not_what_it_carries(gateway):
    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    assert (job.user, job.uid) == (str(ALICE), ALICE)
    assert job.env == {"CONDA_PREFIX": "/c", "WANDB_API_KEY": f"secret-of-{ALICE}"}  # HOME never travels
    seen = _as(gw, BOB, "get", job_id=job.id)
    assert (seen.user, seen.name, seen.gpu_memory, seen.state) == (job.user, job.name, job.gpu_memory, job.state)
    assert seen.command == [privacy.HIDDEN] and seen.workdir == privacy.HIDDEN
    assert seen.env == {"CONDA_PREFIX": privacy.HIDDEN, "WANDB_API_KEY": privacy.HIDDEN}
    assert _as(gw, BOB, "jobs")[0].env["WANDB_API_KEY"] == privacy.HIDDEN
    assert _as(gw, ALICE, "get", job_id=job.id).env["WANDB_API_KEY"] == f"secret-of-{ALICE}"
    assert _as(gw, 0, "get", job_id=job.id).command[-1] == "t0p"  # root is an admin


@pytest.mark.parametrize("op", ["kill", "retry", "clear_error", "result"])
def test_another_user_cannot_act_on_a_job(gateway, op):
    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    error = _as(gw, BOB, op, job_id=job.id)
    assert error["type"] == "PermissionDenied" and f"belongs to {ALICE}" in error["message"]
    assert _as(gw, ALICE, "get", job_id=job.id).state is JobState.PENDING


def test_a_submission_cannot_name_its_owner(gateway):
    gw, _ = gateway
    for forged in ({"user": "root"}, {"uid": 0}, {"_build_only": True}):
        error = _as(gw, BOB, "submit", command=["true"], options={"gpu_memory": "1G", "workdir": "/tmp", **forged})
        assert error["type"] == "InvalidInput" and "unknown submit option" in error["message"]
    for sneaky in ({"user": "root"}, {"payload": "eA==", "state": "RUNNING"}):
        error = _as(gw, BOB, "submit", command=["true"],
                    options={"gpu_memory": "1G", "workdir": "/tmp", "kind": "python", "extra": sneaky})
        assert error["type"] == "InvalidInput" and "extra may only carry" in error["message"]
    assert _submit_as(gw, BOB).uid == BOB


def test_only_the_jobs_own_process_reads_its_call(gateway):
    gw, _ = gateway
    job = _submit_as(gw, os.getuid(), kind="python", extra={"payload": "cGF5bG9hZA=="})
    error = _as(gw, os.getuid(), "task_payload", job_id=job.id)  # this test process is no job
    assert error["type"] == "PermissionDenied"
    error = _as(gw, BOB, "task_result", job_id=job.id, encoded="eA==")
    assert error["type"] == "PermissionDenied"


def test_bad_requests_get_one_line_and_the_gateway_goes_on(gateway):
    gw, path = gateway

    def raw(data: bytes) -> dict | None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(path))
            s.sendall(data)
            return wire.receive(s)

    assert "cannot read" in raw(struct.pack(">I", 5) + b"nope!")["error"]["message"]
    assert "over the gateway" in raw(struct.pack(">I", wire.MAX_FRAME + 1))["error"]["message"]
    assert "no operation" in raw(_frame({"op": "flushall"}))["error"]["message"]
    assert "must be an object" in raw(_frame({"op": "get", "args": [1]}))["error"]["message"]
    assert "wrong arguments" in raw(_frame({"op": "get", "args": {"__m": {"nope": 1}}}))["error"]["message"]
    assert "not a job id" in raw(_frame({"op": "get", "args": {"__m": {"job_id": "1; DEL"}}}))["error"]["message"]
    # A peer that connects and goes away, then one cut mid-frame: nothing stops the server.
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(str(path))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(struct.pack(">I", 100) + b"{")
    assert GatewayClient(gw.settings, path).ping()["version"]


def test_a_client_whose_gateway_is_down_says_so_in_one_line(tmp_path):
    client = GatewayClient(load_settings(home=tmp_path), tmp_path / "none.sock")
    with pytest.raises(GatewayUnavailable) as caught:
        client.get(1)
    assert "\n" not in str(caught.value) and "rig up" in str(caught.value)


def test_a_gateway_restarting_under_a_live_rig_up_is_waited_for_not_said_down(redis_client, key_prefix, tmp_path,
                                                                              monkeypatch):
    """While rig up restarted its gateway (the socket gone, or left by the dead one), a command
    said `rig is not up on this node`. With the node's rig up alive (its mark beside the socket)
    the client waits up to RESTART_WAIT_S for the gateway; then it says the gateway is not
    answering though rig up runs. A mark a dead rig up left is no reason to wait."""
    from rig.gateway import client as gateway_client
    from rig.gateway import paths

    settings = load_settings(home=tmp_path / "home", key_prefix=key_prefix)
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-{key_prefix.split(':')[1]}-restart.sock")
    path.parent.mkdir(mode=0o755, exist_ok=True)
    paths.write_supervisor_mark(path)  # this process stands for the node's rig up
    try:
        assert paths.live_supervisor(path) == os.getpid()
        assert paths.supervisor_mark(path).stat().st_mode & 0o777 == 0o644
        tried = threading.Event()
        real = gateway_client.live_supervisor
        monkeypatch.setattr(gateway_client, "live_supervisor", lambda p: (tried.set(), real(p))[1])
        answers: list = []
        waiting = threading.Thread(target=lambda: answers.append(GatewayClient(settings, path).ping()))
        waiting.start()
        assert tried.wait(10)  # the client found no gateway, and waits for it
        server = bind(path, Gateway(settings, Client(settings, redis_client=redis_client)))  # back
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            waiting.join(10)
            assert answers and answers[0]["version"]
        finally:
            server.shutdown()
            server.server_close()
            path.unlink(missing_ok=True)
        monkeypatch.setattr(gateway_client, "RESTART_WAIT_S", 0.3)
        with pytest.raises(GatewayUnavailable) as caught:
            GatewayClient(settings, path).get(1)
        message = str(caught.value)
        assert "\n" not in message and "not up" not in message, message
        assert f"rig's gateway at {path} is not answering (No such file or directory) though the node's rig up " \
               f"runs (pid {os.getpid()}): the gateway is restarting" in message, message
    finally:
        paths.remove_supervisor_mark(path)
    assert not paths.supervisor_mark(path).exists()
    paths.supervisor_mark(path).write_text("999999999\n1\n")  # a rig up gone (SIGKILL) left it
    try:
        with pytest.raises(GatewayUnavailable, match="rig is not up on this node"):
            GatewayClient(settings, path).get(1)
        paths.remove_supervisor_mark(path)  # not this process's: left alone
        assert paths.supervisor_mark(path).exists()
    finally:
        paths.supervisor_mark(path).unlink()


def test_a_client_looks_for_its_homes_gateway_while_it_restarts(tmp_path):
    """A home's socket gone while rig up restarts its gateway: the client still goes to it (and
    waits), not to Redis without a password."""
    from rig.gateway import paths

    settings = load_settings(home=tmp_path / "home")
    settings.run_dir.mkdir(parents=True)
    socket_path = paths.home_socket(settings)
    assert paths.client_socket(settings) != socket_path
    paths.supervisor_mark(socket_path).write_text("999999999\n1\n")  # a rig up gone left it
    assert paths.client_socket(settings) != socket_path
    paths.write_supervisor_mark(socket_path)
    assert paths.client_socket(settings) == socket_path


def test_a_rig_up_proc_hides_from_this_user_is_waited_for_not_said_down(tmp_path, monkeypatch, hidden_by_proc):
    """Under /proc hidepid=2 a non-root user cannot read root's rig up in /proc: while it
    restarted its gateway the client said at once `rig is not up on this node` (the mark's pid
    read as gone). kill(pid, 0) says it runs (EPERM): the client waits, and looks for that
    home's gateway meanwhile (client_socket). Reviewer (review1): it then said `though the
    node's rig up runs`, which nobody here can tell: a SIGKILLed rig up's mark stays, and another
    user's process may have taken its pid; the line says both, not that rig up runs."""
    from rig.gateway import client as gateway_client
    from rig.gateway import paths
    from workers.process_tree import proc_start_time

    settings = load_settings(home=tmp_path / "home")
    settings.run_dir.mkdir(parents=True)
    path = paths.home_socket(settings)
    paths.supervisor_mark(path).write_text(f"{HIDDEN_PID}\n4242\n")
    hidden_by_proc(HIDDEN_PID)
    assert paths.live_supervisor(path) == HIDDEN_PID
    assert paths.client_socket(settings) == path
    monkeypatch.setattr(gateway_client, "RESTART_WAIT_S", 0.3)
    with pytest.raises(GatewayUnavailable) as caught:
        GatewayClient(settings, path).get(1)
    said = str(caught.value)
    assert f"the pid of the rig up that marks it ({HIDDEN_PID}) runs, hidden from this user" in said, said
    assert "another process that took the pid" in said and "rig up runs" not in said, said
    # A visible rig up (this process marks it) is said to run.
    paths.supervisor_mark(path).write_text(f"{os.getpid()}\n{proc_start_time(os.getpid())}\n")
    with pytest.raises(GatewayUnavailable) as caught:
        GatewayClient(settings, path).get(1)
    assert f"though the node's rig up runs (pid {os.getpid()})" in str(caught.value), caught.value


def test_a_socket_the_user_may_not_reach_is_not_said_down(tmp_path):
    """A gateway shut off by a folder's mode (an admin's chmod 700) is up: the client says what
    shuts it out, not `rig is not up`."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = tmp_path / "g.sock"
    server.bind(str(path))
    server.listen(1)
    client = GatewayClient(load_settings(home=tmp_path), path)
    try:
        import errno
        from unittest import mock

        with mock.patch.object(socket.socket, "connect", side_effect=PermissionError(errno.EACCES, "Permission denied")):
            with pytest.raises(GatewayUnavailable) as caught:
                client.get(1)
    finally:
        server.close()
    message = str(caught.value)
    assert "\n" not in message and "not up" not in message and "Permission denied" in message
    assert "chmod o+x" in message


def test_a_socket_chmodded_shut_is_opened_again_and_a_replaced_one_noticed(tmp_path):
    """A gateway socket chmod'ed 0600 shut every user out while the gateway ran on: its watch
    makes it 0666 again; a removed or replaced socket is reported (the gateway then exits and
    rig up binds it afresh)."""
    from rig.gateway.server import still_bound

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = tmp_path / "g.sock"
    server.bind(str(path))
    try:
        path.chmod(0o600)
        assert still_bound(path, path.lstat().st_ino)
        assert path.stat().st_mode & 0o777 == 0o666
        assert not still_bound(path, path.lstat().st_ino + 1)
        path.unlink()
        assert not still_bound(path, 1)
    finally:
        server.close()


def _frame(message: dict) -> bytes:
    body = __import__("json").dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def test_the_client_refuses_a_socket_served_by_someone_else(monkeypatch, tmp_path):
    """A socket put where the client looks by another (non-root) user is not rig's gateway."""
    from rig.gateway import client as C

    monkeypatch.setattr(C, "_peer_uid", lambda sock: 40003)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = tmp_path / "fake.sock"
    server.bind(str(path))
    server.listen(1)
    try:
        with pytest.raises(GatewayUnavailable, match="not rig's gateway"):
            GatewayClient(load_settings(home=tmp_path), path).ping()
    finally:
        server.close()


def test_admins_by_name_and_root(gateway):
    gw, _ = gateway
    assert _as(gw, 0, "ping")["admin"] is True
    assert _as(gw, BOB, "ping")["admin"] is False
    error = _as(gw, BOB, "forget_node", name="n1")
    assert error["type"] == "PermissionDenied"
    assert PermissionDenied.exit_code == 8


def test_one_user_cannot_hold_every_connection(gateway, monkeypatch):
    from rig.gateway import server as S

    gw, path = gateway
    monkeypatch.setattr(S, "MAX_PER_USER", 2)
    monkeypatch.setattr(S.Peer, "of", classmethod(lambda cls, sock: cls(os.getpid(), BOB, BOB)))
    held = []
    for _ in range(2):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        s.sendall(_frame({"op": "ping"}))
        got = wire.receive(s)
        assert got["ok"], got
        held.append(s)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as third:
        third.connect(str(path))
        assert "busy" in wire.receive(third)["error"]["message"]
    held.pop().close()
    deadline = __import__("time").monotonic() + 5
    while True:  # the closed one's slot comes back once its thread ends
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as again:
            again.connect(str(path))
            try:
                again.sendall(_frame({"op": "ping"}))
                if wire.receive(again)["ok"]:
                    break
            except OSError:
                pass  # still busy: answered and closed before our request went out
        assert __import__("time").monotonic() < deadline
    for s in held:
        s.close()


# -- what a hostile teammate tried (issue 12's breaker) -------------------------------------------
def test_a_log_outside_the_log_folder_is_never_read(gateway):
    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    gw.client.store.update(job.id, log_paths=["/etc/shadow"], log_path="/etc/shadow")
    error = _as(gw, ALICE, "log_read", job_id=job.id, path="/etc/shadow")
    assert error["type"] == "InvalidInput" and "not in this node's log folder" in error["message"]
    inside = gw.settings.job_log_dir / "x" / ".." / ".." / "escape.log"
    gw.client.store.update(job.id, log_paths=[str(inside)])
    assert _as(gw, ALICE, "log_read", job_id=job.id, path=str(inside))["type"] == "InvalidInput"
    # Asked whether it exists: not served here (the answer is the same for a file that exists).
    assert _as(gw, ALICE, "log_exists", job_id=job.id, path=str(inside))["type"] == "LogMissing"


def test_a_log_of_another_node_is_said_to_be_there_exit_1(gateway):
    """A user on a node (or a login node) asked `rig log` for a job that ran on node c: the
    gateway called c's log path bad input (exit 2, no node named); rig log says where it ran."""
    import io

    from rig.cli.logview import show_log
    from rig.errors import LogMissing

    gw, path = gateway
    job = _submit_as(gw, ALICE)
    other = "/srv/c/.rig/logs/jobs/1-x/attempt-1.log"
    gw.client.store.update(job.id, log_paths=[other], log_path=other, attempt=1,
                           attempts=[{"attempt": 1, "node": "c", "cards": [0], "outcome": "succeeded",
                                      "log_path": other}])
    error = _as(gw, ALICE, "log_exists", job_id=job.id, path=other)
    assert error["type"] == "LogMissing" and "attempt 1 ran on c/0" in error["message"]
    client = GatewayClient(gw.settings, path)
    for follow in (False, True):  # -f: said at once, never a wait for a log this gateway never serves
        with pytest.raises(LogMissing) as caught:
            show_log(lambda: client.get(job.id), attempt=None, follow=follow, out=io.BytesIO(), say=lambda m: None,
                     here=lambda node: node == "a", exists=lambda p: client.log_exists(job.id, p))
        assert caught.value.exit_code == 1 and "ran on c/0" in str(caught.value)


def test_a_gateway_not_run_by_root_serves_only_its_own_user(gateway, monkeypatch):
    from rig.gateway import server as S

    gw, _ = gateway
    monkeypatch.setattr(S.os, "geteuid", lambda: ALICE)
    assert _as(gw, ALICE, "ping")["uid"] == ALICE
    error = _as(gw, BOB, "ping")
    assert error["type"] == "PermissionDenied" and "not root" in error["message"]


def test_others_see_no_log_lines_and_no_arguments_in_the_default_name(gateway):
    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    assert job.name == "train.py"
    shell = _as(gw, ALICE, "submit", command=["sh", "-c", "echo TOKEN-s3cr3t; sleep 1"],
                options={"gpu_memory": "1G", "workdir": "/tmp"})["job"]
    assert shell.name == "sh"  # a -c script is no name
    gw.client.store.update(job.id, evidence=["token=s3cr3t"],
                           attempts=[{"attempt": 1, "evidence": ["token=s3cr3t"], "outcome": "failed"}])
    seen = _as(gw, BOB, "get", job_id=job.id)
    assert "s3cr3t" not in repr(seen) and seen.attempts[0]["outcome"] == "failed"


def test_a_job_keeps_the_umask_of_the_process_that_submitted_it(gateway):
    """A user whose umask is 077 got world-readable files from their job (the card worker's
    022); the gateway records the peer process's umask, read from the kernel (/proc), and the
    job's process takes it (workers.card_runner)."""
    gw, _ = gateway
    old = os.umask(0o077)  # the peer is this process (Peer(os.getpid(), ...))
    try:
        job = _submit_as(gw, BOB)
    finally:
        os.umask(old)
    assert job.umask == 0o077
    assert gw.client.store.get(job.id).umask == 0o077  # stored, not only answered


def test_extra_fields_never_replace_the_records_own(gateway):
    gw, _ = gateway
    job = gw.client.store.create(_submit_as(gw, BOB), {"user": "root", "uid": 0, "payload": "eA=="})
    assert (job.user, gw.client.get(job.id).user) == (str(BOB), str(BOB))


def test_the_socket_folder_must_be_the_gateways_own(tmp_path):
    from rig.gateway.server import path_problem

    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    assert "writable by others" in path_problem(open_folder / "g.sock")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, ALICE, ALICE) if os.geteuid() == 0 else None
    if os.geteuid() == 0:
        assert f"belongs to uid {ALICE}" in path_problem(theirs / "g.sock")
        (theirs / "rootsub").mkdir()  # root's own folder inside alice's: she could rename it
        os.chown(theirs / "rootsub", 0, 0)
        assert f"{theirs} on the way to the gateway socket belongs to uid {ALICE}" in path_problem(
            theirs / "rootsub" / "g.sock")
    assert "longer than a Unix socket allows" in path_problem(tmp_path / ("x" * 120) / "g.sock")
    assert path_problem(tmp_path / "mine" / "g.sock") is None


def test_socket_folders_made_under_umask_077_let_users_through(tmp_path):
    """rig up as root with umask 077 made the gateway's folder 0700: every user was refused
    (`Permission denied`) by a gateway rig up said they reach. Folders it makes are 0755; one
    an admin closed is named (rig up warns)."""
    from rig.gateway.server import path_problem, reach_problem

    tmp_path.chmod(0o755)
    old = os.umask(0o077)
    try:
        assert path_problem(tmp_path / "run" / "rig" / "g.sock") is None
    finally:
        os.umask(old)
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "run" / "rig").stat().st_mode & 0o777 == 0o755
    assert f"{tmp_path / 'run'} is mode" not in (reach_problem(tmp_path / "run" / "rig" / "g.sock") or "")
    (tmp_path / "run").chmod(0o700)
    shut = reach_problem(tmp_path / "run" / "rig" / "g.sock")
    assert f"the folder {tmp_path / 'run'} is mode 700" in shut and "chmod o+x" in shut


@pytest.mark.parametrize("args", [{"__m": 5}, {"__m": {"job_id": {"__e": ["x"], "v": 1}}},
                                  {"__m": {"job_id": "\u0661"}}, {"__m": {"job_id": "\u00b2"}},
                                  {"__p": [[[1], 2]]}])
def test_malformed_arguments_are_one_line_errors(gateway, args):
    gw, _ = gateway
    answer = gw.handle(Peer(os.getpid(), BOB, BOB), {"op": "get", "args": args})
    assert answer["ok"] is False and answer["error"]["type"] == "InvalidInput", answer


def test_a_deeply_nested_request_is_refused(gateway):
    gw, path = gateway
    deep = "[" * 200_000 + "]" * 200_000
    body = ('{"op": "ping", "args": ' + deep + "}").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(struct.pack(">I", len(body)) + body)
        assert wire.receive(s)["ok"] is False
    assert GatewayClient(gw.settings, path).ping()["version"]


def test_a_client_told_another_installation_is_warned(monkeypatch, tmp_path):
    from rig.gateway.client import installation_mismatch

    ping = {"redis_url": "redis://127.0.0.1:6390/0", "key_prefix": "rig:", "node": "n2"}
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:pw@127.0.0.1:6390/0")
    monkeypatch.delenv("RIG_KEY_PREFIX", raising=False)
    assert installation_mismatch(ping, tmp_path / "g.sock") == []
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:6391/0")
    (line,) = installation_mismatch(ping, tmp_path / "g.sock")
    assert "RIG_REDIS_URL=redis://127.0.0.1:6391/0 is not what the gateway" in line and "node n2" in line


@pytest.mark.parametrize("argv, name", [
    (["env", "DB_PASSWORD=hunter2", "sleep", "1"], "sleep"), (["API_KEY=sk-live-123 sleep 1"], "job"),
    (["bash", "-c", "TOKEN=hunter2 ./run"], "bash"), (["python", "-c", "print(1)"], "python"),
    (["python", "train.py", "--lr", "3e-4"], "train.py"), (["/usr/bin/nvidia-smi"], "nvidia-smi")])
def test_a_default_name_is_a_programs_name_never_an_argument(argv, name):
    from rig.client import _default_name

    assert _default_name(argv, False) == name
    assert _default_name(["/bin/sh", "-c", "API_KEY=x sleep 5"], True) == "sleep"


def test_others_do_not_see_end_reasons_that_quote_the_log(gateway):
    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    gw.client.store.update(job.id, reason="NCCL error: SECRET-NCCL host=10.1.2.3", failure="nccl",
                           attempts=[{"attempt": 1, "outcome": "failed", "summary": "in /home/a/initech"}])
    seen = _as(gw, BOB, "get", job_id=job.id)
    assert "SECRET" not in repr(seen) and "initech" not in repr(seen) and seen.failure == "nccl"
    assert _as(gw, ALICE, "get", job_id=job.id).reason.startswith("NCCL error")


def test_request_bytes_are_bounded_per_user_and_in_all():
    from rig.gateway import server as S

    server = S._Server.__new__(S._Server)
    server._lock, server._bytes = __import__("threading").Lock(), {}
    assert server.take_bytes(ALICE, S.MAX_BYTES_PER_USER)
    assert not server.take_bytes(ALICE, 1)  # her own budget is spent
    assert server.take_bytes(BOB, S.MAX_BYTES_PER_USER)
    others = [40010 + n for n in range(8)]
    taken = [u for u in others if server.take_bytes(u, S.MAX_BYTES_PER_USER)]
    assert len(taken) == S.MAX_BYTES_TOTAL // S.MAX_BYTES_PER_USER - 2  # all users together are bounded
    assert server.take_bytes(0, S.MAX_BYTES_PER_USER)  # root (rig's own, admins) is never refused
    server.give_bytes(ALICE, S.MAX_BYTES_PER_USER)
    assert server.take_bytes(others[-1], 1)


def test_a_request_over_the_frame_limit_is_refused_before_sending(gateway):
    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    with pytest.raises(InvalidInput, match="submit fewer jobs per submit_many call"):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G", "env": {"X": "x" * 2**20}}
                            for _ in range(20)])
    assert client.ping()["version"]


def test_jobs_filtered_by_user_through_the_socket(gateway):
    """`rig jobs --user NAME` through the gateway: the filter travels, others' jobs stay out."""
    gw, path = gateway
    mine = _submit_as(gw, ALICE)
    theirs = _submit_as(gw, BOB)
    client = GatewayClient(gw.settings, path)
    assert [j.id for j in client.jobs(user=str(ALICE))] == [mine.id]
    assert [j.id for j in client.jobs(user=str(BOB))] == [theirs.id]
    assert client.jobs(user="nobody-here") == []
    assert [j.id for j in client.jobs()] == [theirs.id, mine.id]


def test_the_head_of_the_queue_through_the_socket(gateway):
    """`rig top`'s waiting jobs: in queue order (priority, then submission)."""
    gw, path = gateway
    low = _submit_as(gw, ALICE, priority="low")
    high = _submit_as(gw, BOB, priority="high")
    client = GatewayClient(gw.settings, path)
    head = client.waiting(limit=5)
    assert [j.id for j in head] == [high.id, low.id]
    assert [j.id for j in client.waiting(limit=1)] == [high.id]


def test_start_estimates_through_the_socket(gateway):
    """`rig show` / `rig jobs` of a user without Redis credentials: the same estimates, rebuilt
    from the wire (rig.forecast's classes, nothing else)."""
    gw, path = gateway
    job = _submit_as(gw, ALICE)
    client = GatewayClient(gw.settings, path)
    got = client.start_estimates([job.id])
    assert isinstance(got, Forecast) and got.of(job.id) == StartEstimate(job.id, None, NO_DISPATCHER)
    gw.client.r.set(gw.client.keys.sched_leader, "someone", px=60_000)  # a dispatcher runs
    publish(gw.client.r, gw.client.keys, forecast(gw.client))  # and stored its forecast
    got = client.start_estimates([job.id])
    assert got.of(job.id) == StartEstimate(job.id, None, NO_CARDS)  # no card registered yet
    assert got.made_at is not None and got.row(job.id)["estimated_at"] == got.made_at
    with pytest.raises(InvalidInput, match="job_ids must be a list"):
        client.call("start_estimates", job_ids="1,2")
    # A gateway older than the stored forecast takes no job_ids: the client asks it for all.
    gw.ops["start_estimates"] = lambda peer: gw.client.start_estimates()
    assert client.start_estimates([job.id]).of(job.id) == StartEstimate(job.id, None, NO_CARDS)


def test_a_job_picked_by_its_instance_through_the_socket(gateway):
    """`rig show ID --instance HEX` through the gateway, as `rig show ID` is: the CLI passes
    the prefix and the same rule as a direct client picks the job (a wrong one: exit 4)."""
    gw, path = gateway
    job = _submit_as(gw, ALICE)
    client = GatewayClient(gw.settings, path)
    assert client.get(job.id).instance == job.instance
    assert client.get(job.id, job.instance[:6]).instance == job.instance
    with pytest.raises(JobNotFound):
        client.get(job.id, "zz" if not job.instance.startswith("zz") else "yy")
    answer = _as(gw, ALICE, "get", job_id=job.id, pick=7)
    assert "pick must be a string" in str(answer), answer


def test_places_in_the_queue_and_a_running_jobs_end_come_through_the_gateway(gateway):
    """`rig jobs`' "queued: N job(s) ahead of it" and `rig show`'s expected end of a running job
    (issue 13) for a user who reaches rig through the gateway; another user's job included."""
    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    first, second = _submit_as(gw, ALICE), _submit_as(gw, ALICE)
    assert client.jobs_ahead([first.id, second.id, 999]) == {first.id: 0, second.id: 1}
    # why each waits, as `rig jobs` and `rig top` say it: the same sentences as on the node
    jobs = [gw.client.get(first.id), gw.client.get(second.id)]
    assert client.waiting_words(jobs) == gw.client.waiting_words(jobs)
    assert set(client.waiting_words(jobs)) == {first.id, second.id}
    # a gateway older than waiting_words: the stored sentence, else the place in the queue
    gw.ops.pop("waiting_words")
    gw.client.store.update(first.id, wait_reason="the dispatcher's own sentence")
    jobs = [gw.client.get(first.id), gw.client.get(second.id)]
    assert client.waiting_words(jobs) == {first.id: "the dispatcher's own sentence",
                                          second.id: "queued: 1 job(s) ahead of it"}
    ledger = add_cards(gw.client.ledger, 1, 24)
    ledger.store.update(first.id, time_limit=3600.0)
    ok, token = ledger.reserve(first.id, "n1", [0], 2**30)
    assert ok and ledger.claim(first.id, token, "w")[0]
    end = client.running_end(client.get(first.id))
    assert end is not None and end.source == "limit" and end.at is not None
    assert end.at == pytest.approx(gw.client.get(first.id).started_at + 3600.0, abs=2.0)
    assert end.sentence().startswith("expected to end ~") and "its time limit" in end.sentence()


def test_a_log_allowed_once_reads_on_while_redis_is_lost(gateway, monkeypatch):
    """`rig log -f` through the gateway: each read checks the job's record in Redis the first
    time; a path allowed to that user is remembered, so a Redis blip does not end the follow
    (the direct client reads the file itself and never needed Redis for it)."""
    from rig.errors import RedisUnavailable

    gw, _ = gateway
    job = _submit_as(gw, ALICE)
    log = gw.settings.job_log_dir / f"job-{job.id}" / "attempt-1.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"step 1\n")
    gw.client.store.update(job.id, log_paths=[str(log)], log_path=str(log))
    assert _as(gw, ALICE, "log_read", job_id=job.id, path=str(log)) == "c3RlcCAxCg=="  # b"step 1\n"

    def lost(*a, **kw):
        raise RedisUnavailable("Redis at 127.0.0.1:6379 cannot be reached")

    monkeypatch.setattr(gw.client, "get", lost)
    log.write_bytes(b"step 1\nstep 2\n")
    assert _as(gw, ALICE, "log_read", job_id=job.id, path=str(log), offset=7) == "c3RlcCAyCg=="  # b"step 2\n"
    assert _as(gw, ALICE, "log_look", job_id=job.id, path=str(log), offset=14)["data"] == ""
    # Only what was allowed, to whom it was allowed: anything else still needs the record.
    assert _as(gw, BOB, "log_read", job_id=job.id, path=str(log))["type"] == "RedisUnavailable"
    assert _as(gw, ALICE, "log_read", job_id=job.id, path=str(log) + ".x")["type"] == "RedisUnavailable"
    assert _as(gw, ALICE, "log_read", job_id=job.id, path=["a"])["type"] == "InvalidInput"


def test_retry_with_a_time_limit_through_an_older_gateway_says_so(gateway):
    """A timed-out job's reason says `rig retry 5 --time-limit 4h00m`; through the gateway of an
    older rig (its op_retry takes no time_limit) that said 'wrong arguments for retry:
    Gateway.op_retry() got an unexpected keyword argument 'time_limit'', naming no way out."""
    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    job = _submit_as(gw, os.getuid())
    gw.client.ledger.transition(job.id, JobState.TIMEOUT, error_queue=True, fields={"reason": "time limit"})

    def older_op_retry(peer: Peer, job_id: int, gpu_memory: str | int | None = None) -> Job:
        return gw.client.retry(job_id, gpu_memory=gpu_memory)

    gw.ops["retry"] = older_op_retry
    with pytest.raises(InvalidInput) as info:
        client.retry(job.id, time_limit="4h")
    assert "runs an older rig, which cannot give a job a new time limit" in str(info.value)
    assert f"`rig retry {job.id}` without --time-limit" in str(info.value)
    assert client.retry(job.id).state is JobState.PENDING  # without one it is sent as before


def test_rig_templates_through_the_gateway_lists_the_nodes_templates(redis_client, key_prefix, tmp_path,
                                                                     monkeypatch):
    """A user without the Redis password submits through the gateway, which applies the node's
    [templates]: `rig-submit -t mine` ran, and `rig templates` (read from the user's own config)
    did not list 'mine'. It lists what the user's submissions use."""
    from click.testing import CliRunner

    from rig.cli.main import cli

    node = load_settings(home=tmp_path / "node", key_prefix=key_prefix,
                         templates={"mine": {"gpu_memory": "10G", "priority": "high"}})
    gw = Gateway(node, Client(node, redis_client=redis_client))
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-{key_prefix.split(':')[1]}-t.sock")
    server = bind(path, gw)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("RIG_HOME", str(tmp_path / "user"))  # no config: the shipped templates only
        monkeypatch.setattr("rig.gateway.choice.make_client", lambda settings: GatewayClient(settings, path))
        result = CliRunner().invoke(cli, ["templates"], env={"COLUMNS": "160"})
        assert result.exit_code == 0, result.output
        assert "│ mine " in result.output and "│ finetune " in result.output, result.output
    finally:
        server.shutdown()
        server.server_close()
        path.unlink(missing_ok=True)


def test_a_gateway_that_cannot_use_its_redis_says_it_is_the_nodes_to_fix(gateway, monkeypatch):
    """The node's password changed under its rig up (or its Redis is down): a teammate's
    rig-submit through the gateway read 'Redis ... refused the password from the URL ...; set
    RIG_REDIS_URL=redis://:PASSWORD@..., RIG_REDIS_PASSWORD, or redis_password_file', sending a
    user who needs no password to look for it. The class (exit 5) stays; the line says whose it is."""
    import redis as redis_py

    from rig.errors import RedisAuthFailed, RedisUnavailable
    from rig.redis_conn import auth_failed, strip_password

    gw, path = gateway
    url = gw.settings.redis_url

    def refused(*a, **kw):
        raise auth_failed(url, redis_py.AuthenticationError("invalid username-password pair or user is disabled."))

    monkeypatch.setattr(gw.client, "submit", refused)
    with pytest.raises(RedisAuthFailed) as caught:
        GatewayClient(gw.settings, path).submit(["true"], gpu_memory="1G", workdir="/tmp")
    said = str(caught.value)
    assert said.startswith(f"rig's gateway on node {gw.settings.node_name} cannot use its Redis (the node's to fix")
    assert f": Redis at {strip_password(url)} " in said and caught.value.exit_code == 5

    def lost(*a, **kw):  # a bare redis-py error, as an operation reading Redis itself raises
        raise redis_py.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(gw.client, "get", lost)
    answer = _as(gw, ALICE, "get", job_id=1)
    assert answer["type"] == "RedisUnavailable", answer
    assert answer["message"].startswith(f"rig's gateway on node {gw.settings.node_name} cannot use its Redis")
    assert issubclass(RedisAuthFailed, RedisUnavailable)


def test_ctrl_c_after_a_submission_reached_the_gateway_names_the_queued_job(gateway, monkeypatch):
    """A Ctrl-C while rig-submit waited for the gateway's answer was a bare KeyboardInterrupt
    (a traceback from Python) while the gateway queued the job anyway, which then ran unseen.
    The direct client says 'interrupted after submitting job(s) N' (SubmitInterrupted); the
    gateway's client now waits for the answer a moment longer and says the same."""
    import rig.gateway.client as gateway_client
    from rig.errors import SubmitInterrupted

    gw, path = gateway
    client = GatewayClient(gw.settings, path)
    real_receive = gateway_client.wire.receive
    calls: list[int] = []

    def interrupted_once(sock, *a, **kw):  # noqa: ANN001, ANN202
        if sock is client._sock:  # the client's read (the gateway in this process reads too)
            calls.append(1)
            if len(calls) == 1:
                raise KeyboardInterrupt  # the request went out; its answer not read yet
        return real_receive(sock, *a, **kw)

    monkeypatch.setattr(gateway_client.wire, "receive", interrupted_once)
    with pytest.raises(KeyboardInterrupt) as stopped:  # caught as such: a bare one must not end pytest
        client.submit(["true"], gpu_memory="1G", workdir="/tmp")
    assert isinstance(stopped.value, SubmitInterrupted), repr(stopped.value)
    (job_id,) = stopped.value.job_ids
    assert gw.client.get(job_id).state is JobState.PENDING
    assert str(stopped.value) == f"interrupted after submitting job(s) {job_id}"
    # ... and where it lands most: decoding the answer (its first use imports rig's classes).
    monkeypatch.setattr(gateway_client.wire, "receive", real_receive)
    real_decode = gateway_client.wire.decode

    def decode_interrupted(data):  # noqa: ANN001, ANN202
        if isinstance(data, dict) and "__m" in data and "job" in data["__m"]:
            raise KeyboardInterrupt
        return real_decode(data)

    monkeypatch.setattr(gateway_client.wire, "decode", decode_interrupted)
    with pytest.raises(KeyboardInterrupt) as stopped:
        client.submit(["true"], gpu_memory="1G", workdir="/tmp")
    assert isinstance(stopped.value, SubmitInterrupted) and stopped.value.job_ids == [job_id + 1], stopped.value
    monkeypatch.setattr(gateway_client.wire, "decode", real_decode)
    monkeypatch.setattr(gateway_client.wire, "receive", interrupted_once)
    calls.clear()  # an interrupt of another request is the interrupt, as before
    with pytest.raises(KeyboardInterrupt) as plain:
        client.jobs()
    assert not isinstance(plain.value, SubmitInterrupted)
