"""Real second and third Unix users on a root node, through the gateway (issue 12).

The test creates two users (``rigtest-alice``, ``rigtest-bob``) and a venv of Debian's
/usr/bin/python3 they can run (root's Python lives where they cannot enter). A real node runs
as root on a private Redis with a password the users cannot read. As themselves they submit,
watch, read logs and kill their own jobs with the real `rig-submit` / `rig` / `rig.submit` /
`@rig.task`; they cannot act on each other's jobs, read each other's environment values, forge
an owner, or reach Redis; each job runs as its true submitter."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.models import JobState
from rig.testing.faults import _free_port
from rig.testing.faults_nodes import _password_redis
from rig.testing.harness import RigHarness
from rig.testing.user_venv import SYSTEM_PYTHON
from rig.testing.user_venv import user_venv as build_user_venv

pytestmark = [pytest.mark.slow, pytest.mark.background]

REPO = Path(__file__).resolve().parents[2]
USERS = ("rigtest-alice", "rigtest-bob")


@pytest.fixture(scope="module")
def user_venv() -> Path:
    """A venv of /usr/bin/python3 with this rig installed that the users can run (rig.testing.user_venv)."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not SYSTEM_PYTHON.exists():
        pytest.skip("needs root, useradd and /usr/bin/python3 (.ci/run runs as root)")
    return build_user_venv(REPO)


@pytest.fixture(scope="module")
def users(user_venv) -> Iterator[dict[str, pwd.struct_passwd]]:
    made = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
            made.append(name)
    yield {name: pwd.getpwnam(name) for name in USERS}
    for name in made:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture
def node(tmp_path, users) -> Iterator[tuple[RigHarness, str, Path]]:
    port = _free_port()
    server = _password_redis(tmp_path / "redis", port, "node-only-" + uuid.uuid4().hex)
    password = server.args[server.args.index("--requirepass") + 1]
    shared = Path("/tmp") / f"rig-users-{uuid.uuid4().hex[:10]}"  # where both users may write
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    harness = RigHarness(tmp_path / "home", fake_gpus="1x80G", redis_url=f"redis://:{password}@127.0.0.1:{port}/0")
    try:
        harness.up(gateway=True)
        yield harness, f"redis://127.0.0.1:{port}/0", shared
    finally:
        harness.cleanup()
        server.kill()
        server.wait()
        shutil.rmtree(shared, ignore_errors=True)


def _as(user: pwd.struct_passwd, venv: Path, node: tuple[RigHarness, str, Path], *argv: str,
        env: dict[str, str] | None = None, timeout: float = 90, umask: int = -1) -> subprocess.CompletedProcess:
    harness, url, shared = node
    full_env = {"HOME": user.pw_dir, "PATH": f"{venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "RIG_REDIS_URL": url, "RIG_GATEWAY_SOCKET": str(harness.settings.gateway_socket),
                "OUT": str(shared), **(env or {})}
    return subprocess.run(list(argv), user=user.pw_uid, group=user.pw_gid,
                          extra_groups=os.getgrouplist(user.pw_name, user.pw_gid), env=full_env, cwd=shared,
                          capture_output=True, text=True, timeout=timeout, umask=umask)


def _wait(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


GATED = 'echo "hello from $(id -un) in $(pwd)"; id -un > "$OUT/whoami-$RIG_JOB_ID"; ' \
        'while [ ! -e "$OUT/go" ]; do sleep 0.1; done'


def test_two_users_share_a_root_node_without_acting_as_each_other(node, users, user_venv):
    harness, _url, shared = node
    alice, bob = users["rigtest-alice"], users["rigtest-bob"]

    def run(user, *argv, env=None):  # noqa: ANN001, ANN202
        return _as(user, user_venv, node, *argv, env=env)

    def submit(user) -> int:  # noqa: ANN001
        done = run(user, "rig-submit", "--gpu-memory", "1G", "--cmd", GATED, env={"API_TOKEN": f"{user.pw_name}-token"})
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[0])

    a, b = submit(alice), submit(bob)
    for jid in (a, b):
        harness.wait_for_state(jid, {JobState.RUNNING}, timeout=60)
    records = {j.id: j for j in harness.client.store.get_many([a, b])}
    assert (records[a].user, records[a].uid) == (alice.pw_name, alice.pw_uid)
    assert (records[b].user, records[b].uid) == (bob.pw_name, bob.pw_uid)

    # Everyone sees that a job exists and whose it is; only its owner what it carries.
    mine, theirs = (json.loads(run(bob, "rig", "show", str(j), "--json").stdout) for j in (b, a))
    assert mine["env"]["API_TOKEN"] == "rigtest-bob-token" and "id -un" in json.dumps(mine["command"])
    assert theirs["user"] == alice.pw_name and theirs["state"] == "RUNNING"
    assert theirs["env"]["API_TOKEN"] == "(hidden)" and "id -un" not in json.dumps(theirs)
    assert "rigtest-alice-token" not in run(bob, "rig", "jobs", "--json").stdout
    assert run(bob, "rig", "status").returncode == 0

    # Nobody acts on another's job: exit 8, one line, nothing changes.
    for argv in (["rig", "kill", str(a)], ["rig", "retry", str(a)], ["rig", "errors", "--clear", str(a)],
                 ["rig", "log", str(a)]):
        refused = run(bob, *argv)
        assert refused.returncode == 8 and "belongs to rigtest-alice" in refused.stderr, (argv, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1
    assert harness.client.get(a).state is JobState.RUNNING

    # Their own log, through the gateway (log_dir is root's).
    shown = run(alice, "rig", "log", str(a))
    assert shown.returncode == 0 and f"hello from rigtest-alice in {shared}" in shown.stdout, shown.stderr

    # No Redis for users: the password is nowhere they can read, and Redis refuses them.
    probe = run(bob, "python", "-c", "import os, redis; redis.Redis.from_url(os.environ['RIG_REDIS_URL']).ping()")
    assert probe.returncode != 0 and "AuthenticationError" in probe.stderr, probe.stderr
    job_env = Path(f"/proc/{harness.client.get(b).pid}/environ").read_bytes()
    assert b"node-only-" not in job_env and b"RIG_GATEWAY_SOCKET=" in job_env

    # The Python API as bob: the owner is the kernel's word.
    api = run(bob, "python", "-c", "import rig; h = rig.submit(['true'], gpu_memory='1G'); "
                                   "j = h.wait(60); print(j.user, j.uid, j.state.value)")
    assert api.stdout.split() == [bob.pw_name, str(bob.pw_uid), "SUCCEEDED"], api.stderr

    (shared / "go").touch()
    for jid, user in ((a, alice), (b, bob)):
        assert harness.client.wait(jid, timeout=60).state is JobState.SUCCEEDED
        assert (shared / f"whoami-{jid}").read_text().strip() == user.pw_name  # ran as its submitter


def test_a_user_kills_their_own_job_and_runs_a_task(node, users, user_venv):
    harness, _url, shared = node
    alice = users["rigtest-alice"]
    started = _as(alice, user_venv, node, "rig-submit", "--gpu-memory", "1G", "--", "sleep", "300")
    jid = int(started.stdout.split()[0])
    harness.wait_for_state(jid, {JobState.RUNNING}, timeout=60)
    killed = _as(alice, user_venv, node, "rig", "kill", str(jid))
    assert killed.returncode == 0, killed.stderr
    assert harness.client.get(jid).state is JobState.CANCELLED

    script = shared / "double.py"
    script.write_text("import rig\n\n\n@rig.task(gpu_memory='1G')\ndef double(x):\n    return 2 * x\n\n\n"
                      "if __name__ == '__main__':\n    print(double.delay(21).get(timeout=90))\n")
    script.chmod(0o644)
    ran = _as(alice, user_venv, node, "python", str(script), timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip() == "42", ran.stderr


def test_a_users_job_writes_its_files_with_their_umask(node, users, user_venv):
    """A user with umask 077 found the files of their job readable by everyone (the root card
    worker's 022): the job takes its submitter's umask."""
    _harness, _url, shared = node
    bob = users["rigtest-bob"]
    ran = _as(bob, user_venv, node, "rig-submit", "--wait", "--gpu-memory", "1G", "--cmd",
              'umask > "$OUT/umask-seen"; echo private > "$OUT/private.txt"', umask=0o077)
    assert ran.returncode == 0, ran.stderr
    assert (shared / "umask-seen").read_text().strip() == "0077"
    made = (shared / "private.txt").stat()
    assert (made.st_uid, made.st_mode & 0o777) == (bob.pw_uid, 0o600)


def test_a_user_follows_their_log_through_a_remake(node, users, user_venv, tmp_path):
    """`rig log -f` as a real user (log_dir is root's: it reads through the gateway) while the
    job's log folder is deleted: the keeper makes the log again and the follower prints the new
    file from its start, with one line on stderr, to the job's last line."""
    harness, url, shared = node
    alice = users["rigtest-alice"]
    started = _as(alice, user_venv, node, "rig-submit", "--gpu-memory", "1G", "--cmd",
                  'echo before; while [ ! -e "$OUT/go" ]; do sleep 0.02; done; i=0; '
                  'while [ ! -e "$OUT/end" ]; do echo after $i; i=$((i+1)); sleep 0.02; done; echo the-last-line')
    assert started.returncode == 0, started.stderr
    jid = int(started.stdout.split()[0])
    harness.wait_for_state(jid, {JobState.RUNNING}, timeout=60)
    log = Path(harness.client.get(jid).log_paths[0])
    out, err = tmp_path / "out", tmp_path / "err"
    env = {"HOME": alice.pw_dir, "PATH": f"{user_venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "RIG_REDIS_URL": url,
           "RIG_GATEWAY_SOCKET": str(harness.settings.gateway_socket)}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        follower = subprocess.Popen(["rig", "log", "-f", str(jid)], user=alice.pw_uid, group=alice.pw_gid,
                                    extra_groups=os.getgrouplist(alice.pw_name, alice.pw_gid), env=env, cwd=shared,
                                    stdout=stdout, stderr=stderr)
    try:
        _wait(lambda: out.read_bytes() == b"before\n", 60, "the log's first line")
        shutil.rmtree(log.parent)
        (shared / "go").touch()
        _wait(lambda: b"was deleted and made again" in err.read_bytes() and out.read_bytes().count(b"after") >= 20,
              60, "the follower to go on in the new file")
    finally:
        (shared / "go").touch()
        (shared / "end").touch()
        try:
            follower.wait(60)
        finally:
            follower.kill()
    text, said = out.read_bytes(), err.read_text()
    assert follower.returncode == 0, said
    new = log.read_bytes()  # the new file whole, from the keeper's line to the job's last
    assert new.startswith(b"[rig: this log was deleted") and text.endswith(new), (text[-300:], new[-300:], said)
    assert text.startswith(b"before\n") and text.endswith(b"the-last-line\n")
    assert said.count("was deleted and made again") == 1 and "Traceback" not in said, said


def test_a_user_who_may_not_read_the_password_file_uses_the_gateway(node, users, user_venv):
    """A team's password file kept from users (root's, 0640): a user whose settings name it (a
    shared rig.toml, or RIG_REDIS_PASSWORD_FILE) submits through the gateway; it was exit 6
    "cannot read the Redis password file ... ask its owner" from every command."""
    harness, _url, shared = node
    secret = shared / "redis.password"
    secret.write_text("not-the-password\n")
    secret.chmod(0o640)  # root:root: alice is not in its group
    alice = users["rigtest-alice"]
    env = {"RIG_REDIS_PASSWORD_FILE": str(secret)}
    ran = _as(alice, user_venv, node, "rig-submit", "--gpu-memory", "1G", "--", "true", env=env)
    assert ran.returncode == 0, ran.stderr
    jid = int(ran.stdout.split()[0])
    assert harness.client.get(jid).user == "rigtest-alice"
