"""A node that runs nothing never reads plainly "up", and its cards are no place a job "fits
now" (rig.nodes NodeInfo.no_worker and .gone). A tester SIGKILLed `rig up` while a job ran:
its workers died with it, yet for the heartbeat's life (30 s) `rig status` said `node vm: up
since ..., 8 card(s), 0 worker(s)` and rig-submit `it fits now (vm/0)`. fakeredis and real Redis."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from rig.cli.render import NO_WORKER_NOTE, node_title
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.waiting import FITS_NOW, why_waiting
from tests.conftest import HIDDEN_PID
from workers.process_tree import boot_host

TTL = 30.0


@pytest.fixture
def world(redis_client, key_prefix, make_ledger):
    settings = load_settings(key_prefix=key_prefix, node_name="vm", hold_after_seconds=0)
    keys = Keys(key_prefix)
    ledger = make_ledger(2, 24, node="vm", uuid="vm-u{index}")
    return keys, ledger, NodeRegistry(redis_client, keys), Client(settings, redis_client=redis_client)


def _submit(ledger: Ledger) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=4 * GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
    )).id


def _worker_beat(redis_client, keys: Keys, name: str) -> None:
    """A live worker heartbeat, as workers/app.py writes it (role@node)."""
    redis_client.sadd(keys.workers, name)
    redis_client.set(keys.worker(name), "{}", ex=int(TTL))


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_node_whose_rig_up_is_gone_here_is_not_up_while_its_heartbeat_lingers(world, redis_client):
    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=_dead_pid())  # the heartbeat is fresh
    (node,) = nodes.read()
    assert node.host == socket.gethostname()
    assert node.state == "silent" and node.presumed_down and not node.alive, node
    assert "no longer runs" in node.describe and "up since" not in node_title(node, "vm", 2)
    why = why_waiting(client, client.get(_submit(ledger)))
    assert FITS_NOW not in why and "no longer runs" in why, why


def test_a_node_whose_rig_up_is_gone_here_is_not_up_while_its_workers_beats_linger(world, redis_client):
    """Every rig process of the node SIGKILLed at once: its workers' heartbeats outlive them
    too. On the node's host and boot, `rig status` said "up, 2 worker(s)" for ~30 s."""
    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=_dead_pid())
    _worker_beat(redis_client, keys, "card0@vm")
    _worker_beat(redis_client, keys, "control@vm")
    (node,) = nodes.read()
    assert node.state == "silent" and node.presumed_down and not node.alive, node
    title = node_title(node, "vm", 2)
    assert "up since" not in title and "worker(s)" not in title, title
    assert "no longer runs" in title and "its heartbeat expires in " in title, title
    # Another host (or this one before a reboot) cannot check the pid: the heartbeats decide.
    redis_client.hset(keys.node("vm"), "host_id", "elsewhere/boot")
    (node,) = nodes.read()
    assert node.state == "up" and node.workers == 2 and node.gone is None, node
    # Nor a container with pids of its own on this host and boot (network_mode: host gives it
    # this host's name): its pid is another process here, or none.
    host, boot, namespace = boot_host().split("/")
    redis_client.hset(keys.node("vm"), "host_id", f"{host}/{boot}/{namespace}0")
    (node,) = nodes.read()
    assert node.state == "up" and node.gone is None, node


def test_a_pid_reused_by_another_process_is_not_the_nodes_rig_up(world, redis_client):
    """The recorded pid runs, but started at another time: another process took it."""
    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=1)
    _worker_beat(redis_client, keys, "card0@vm")
    assert nodes.read()[0].state == "up"
    redis_client.hset(keys.node("vm"), "pid_start", "1")  # pid 1 started later than tick 1
    (node,) = nodes.read()
    assert node.state == "silent" and node.gone and "pid 1" in node.gone, node


def test_a_rig_up_that_proc_hides_from_this_user_is_not_read_as_gone(world, redis_client, hidden_by_proc):
    """Reviewer (review3): on a host whose /proc is mounted hidepid=2 (the README's hardening),
    another user's /proc/PID is absent, so every user but the node's read root's live node as
    'silent, presumed down' ('its rig up (pid N) no longer runs'). kill(pid, 0) still answers
    EPERM for a process that runs: then the heartbeats decide, as on another host."""
    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=HIDDEN_PID)
    _worker_beat(redis_client, keys, "card0@vm")
    hidden_by_proc(HIDDEN_PID)
    (node,) = nodes.read()
    assert node.state == "up" and node.gone is None and node.workers == 1, node
    # A pid that no longer runs (ESRCH) is still gone, hidden or not.
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=_dead_pid())
    (node,) = nodes.read()
    assert node.state == "silent" and node.gone, node


def test_a_node_with_no_live_worker_is_no_place_a_job_fits_now(world, redis_client):
    """Seen from any host (its pid alive, or not checkable): up, but no worker runs its jobs."""
    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=1)  # pid 1 runs (and on every host)
    (node,) = nodes.read()
    assert node.no_worker and node.describe.startswith("started ") and "no worker alive" in node.describe
    title = node_title(node, "vm", 2)
    assert "up since" not in title and "0 worker(s)" not in title and NO_WORKER_NOTE in title, title
    job = client.get(_submit(ledger))
    why = why_waiting(client, job)
    assert FITS_NOW not in why and "no worker alive" in why, why
    # Its card worker comes: the same card is a place the job fits now.
    _worker_beat(redis_client, keys, "card0@vm")
    (node,) = nodes.read()
    assert not node.no_worker and node.describe.startswith("up since ")
    assert why_waiting(client, job).startswith(f"{FITS_NOW} (vm/"), why_waiting(client, job)


def test_the_workers_of_a_node_whose_rig_up_is_gone_here_are_not_counted_alive(world, redis_client):
    """A tester SIGKILLed a second node's `rig up` with its workers: `rig status` said
    `node b: DOWN ...` (its node line: 0 workers) and then `workers alive: 12`, listing b's 3
    dead workers "7s ago"; rig top's title, the web page and rig_workers_alive counted them too,
    until their beats expired (health.timeout). The node's rule (NodeInfo.workers) decides."""
    from prometheus_client import generate_latest

    from rig.metrics import make_registry

    keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=_dead_pid())
    nodes.register("b", ttl=TTL, backend="fake", cards=0, pid=1)  # pid 1 runs on every host
    for name in ("card0@vm", "control@vm", "control@b"):
        _worker_beat(redis_client, keys, name)
        role, node = name.split("@")
        redis_client.set(keys.worker(name), json.dumps({"role": role.rstrip("0"), "node": node}), ex=int(TTL))

    def counted() -> tuple[list[str], list[str], str]:
        scraped = generate_latest(make_registry(client)).decode()
        alive = [line for line in scraped.splitlines() if line.startswith("rig_workers_alive")]
        return [w.name for w in client.workers()], [w.name for w in client.status().workers], "\n".join(alive)

    names, in_status, scraped = counted()
    assert names == in_status == ["control@b"], (names, in_status)
    assert 'rig_workers_alive{role="control"} 1.0' in scraped and "card" not in scraped, scraped
    # Another host cannot check the pid: the heartbeats decide there, for the node and its workers.
    redis_client.hset(keys.node("vm"), "host_id", "elsewhere/boot")
    names, in_status, scraped = counted()
    assert names == in_status == ["card0@vm", "control@b", "control@vm"], (names, in_status)


def test_the_beats_of_a_former_rig_ups_workers_do_not_count_for_the_next_one(world, redis_client):
    """A node's rig up and all its workers SIGKILLed, `rig up` again at once: for the life of
    the dead workers' last beats `rig status` said "up, 3 worker(s)". A beat names the rig up
    that started its worker (rig.supervision.beat_supervisor); one naming another rig up than
    the node's record does not count, for the node nor in the workers' list."""
    from rig.supervision import beat_of_up
    from workers.process_tree import proc_start_time

    keys, ledger, nodes, client = world
    me = os.getpid()
    nodes.register("vm", ttl=TTL, backend="fake", cards=2, pid=me)  # the new rig up: alive
    former = {"up_pid": _dead_pid(), "up_start": 1}
    current = {"up_pid": me, "up_start": proc_start_time(me)}
    for name, up in (("card0@vm", former), ("card1@vm", former), ("control@vm", current), ("flower@vm", {})):
        _worker_beat(redis_client, keys, name)
        redis_client.set(keys.worker(name), json.dumps({"role": name.split("@")[0], "node": "vm", **up}), ex=int(TTL))
    (node,) = nodes.read()
    assert node.state == "up" and node.workers == 2, node
    assert [w.name for w in client.workers()] == ["control@vm", "flower@vm"]
    # The same pid started at another time is another process: not this rig up.
    assert not beat_of_up(json.dumps({**current, "up_start": current["up_start"] + 1}), me, current["up_start"])


def test_a_worker_beat_names_the_rig_up_that_started_it(monkeypatch):
    from rig.supervision import SUPERVISOR_PID, SUPERVISOR_START, beat_supervisor

    monkeypatch.setenv(SUPERVISOR_PID, "4242")
    monkeypatch.setenv(SUPERVISOR_START, "77")
    assert beat_supervisor() == {"up_pid": 4242, "up_start": 77}
    monkeypatch.delenv(SUPERVISOR_PID)
    assert beat_supervisor() == {}
