"""How many connections to Redis one node opens: the bound on each process rig up starts, and
the node's total (``node_bound``), the one formula the docs give and the test checks.

``rig up`` starts one Celery worker per card (``c`` = max_task_per_gpu task threads), a control
worker (4 task threads), beat, Flower and the gateway. Each process has:

* **rig's own connections** (rig.redis_conn.connect): one pool shared by every rig client of
  the process, of at most ``rig_pool_limit(role)`` connections, handed to the process through
  ``RIG_REDIS_POOL_LIMIT``; a thread that finds them all busy waits (POOL_WAIT_S) for one. The
  bound is at least what the process's threads hold at once: in a card worker each job's
  thread holds one for one command at a time, the start consumer one for its blocking take
  (BLMOVE, 1 s at a time), the kill listener one for good (pub/sub), the tick loop
  (heartbeat, readings, adoption) one, Celery's clock one: ``c + 4``, plus one of headroom. The control worker: 4 task threads, the dispatcher (BLPOP, 1 s), the forecaster,
  the Flower bridge (pub/sub, for good), heartbeat and local health: 9, plus headroom.
* **Celery's** (kombu's Redis transport; CLIENT LIST names them ``celery:<node>:<role>``): the
  consumer's BRPOP, the broadcast channel's PSUBSCRIBE and its replies, the commands of the
  consumer's channel (acks: at most one per thread that acks at once, the ``c`` task threads
  and the consumer's own two), and at most BROKER_POOL_LIMIT for publishing:
  ``celery_limit(threads) = threads + 7``. kombu opens them on demand, so a process holds
  fewer (6 measured in a card worker, idle or full).
* beat's schedule client (celery-redbeat, ``redbeat:<node>:beat``): one thread, one connection.

tests/integration/test_connections.py counts a real node's connections by these client
names, idle and with every card full, against ``node_bound``.
"""

from __future__ import annotations

import os

from rig.config import Settings

#: Publishing connections per process (rig.celery_config passes it as broker_pool_limit).
BROKER_POOL_LIMIT = 2
#: Flower's: its workers page asks 8 inspect calls at once (stats, active queues, registered,
#: scheduled, active, reserved, revoked, conf), each on a connection of this pool; with 2 they
#: queued behind one another and the page never listed the workers. Celery's default.
FLOWER_BROKER_POOL_LIMIT = 10
#: Task threads of the control worker (rig.stack starts it with ``-c 4``).
CONTROL_THREADS = 4
#: rig's own pool of the control worker: its 9 threads that may hold one at once, plus 3.
CONTROL_POOL = 12
#: beat: its clock and the writes of its scheduler hooks (workers.beat), one thread.
BEAT_POOL = 3
#: Flower: the app's clock and the remote-control handlers.
FLOWER_POOL = 4
#: The gateway: requests are served by threads, one command at a time each; more wait.
GATEWAY_POOL = 8
#: A card worker's threads besides its jobs' that may hold one of rig's connections at once
#: (the start consumer's BLMOVE, 1 s at a time: workers.start_list; the kill listener, for
#: good; the tick loop; Celery's clock) plus one of headroom.
CARD_EXTRA = 5


def rig_pool_limit(role: str, settings: Settings) -> int | None:
    """The most connections rig's own clients in one process of ``role`` open together; None
    for a process rig up does not start (rig up itself, a user's program, the CLI)."""
    if role == "card":
        return settings.max_task_per_gpu + CARD_EXTRA
    return {"control": CONTROL_POOL, "beat": BEAT_POOL, "flower": FLOWER_POOL, "gateway": GATEWAY_POOL}.get(role)


def broker_pool_limit(role: str | None = None) -> int:
    """Celery's ``broker_pool_limit`` for a process of ``role`` (default: this process's
    RIG_ROLE): FLOWER_BROKER_POOL_LIMIT for Flower, else BROKER_POOL_LIMIT."""
    role = os.environ.get("RIG_ROLE", "") if role is None else role
    return FLOWER_BROKER_POOL_LIMIT if role == "flower" else BROKER_POOL_LIMIT


def celery_limit(threads: int, role: str = "") -> int:
    """The most connections kombu opens in a Celery process with ``threads`` task threads:
    BRPOP, PSUBSCRIBE, the broadcast replies, the consumer channel's commands (one per thread
    that uses it at once: the task threads, the consumer and its timer), the publishers."""
    return 1 + 1 + 1 + (threads + 2) + broker_pool_limit(role)


def node_bound(settings: Settings, cards: int, *, beat: bool = True, flower: bool = True,
               gateway: bool = True) -> int:
    """The most connections the processes rig up starts on a node with ``cards`` card workers
    open together (rig up's own process and the jobs not counted: a handful, see the docs)."""
    c = settings.max_task_per_gpu
    total = cards * (rig_pool_limit("card", settings) + celery_limit(c))  # type: ignore[operator]
    total += CONTROL_POOL + celery_limit(CONTROL_THREADS)
    if beat:
        total += BEAT_POOL + BROKER_POOL_LIMIT + 1  # publishes the periodic tasks; redbeat's client
    if flower:
        total += FLOWER_POOL + celery_limit(1, "flower")  # its event consumer, inspect calls, broker page
    if gateway:
        total += GATEWAY_POOL
    return total


def process_label() -> str | None:
    """This process's place in its node, for Redis' CLIENT LIST (``rig:<node>:card3`` for rig's
    own connections, ``celery:<node>:card3`` for kombu's): from the marks rig up gives its
    children (RIG_ROLE, RIG_CARD_INDEX, RIG_NODE_NAME); None in any other process."""
    role = os.environ.get("RIG_ROLE", "")
    if not role:
        return None
    label = f"{os.environ.get('RIG_NODE_NAME', '')}:{role}{os.environ.get('RIG_CARD_INDEX', '')}"
    # A client name may not hold spaces or newlines (Redis refuses CLIENT SETNAME).
    return "".join(ch if ch.isprintable() and not ch.isspace() else "_" for ch in label)
