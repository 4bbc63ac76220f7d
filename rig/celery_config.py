"""The Celery app configuration shared by submitters, workers, beat and Flower.

Celery is the transport: it carries "a job was submitted" to the dispatcher on the per-priority
queues and "start job N" to one card's own queue. The truth about jobs lives in rig's records
and ledger (CELERY-NOTES 1), so every delivery is fenced there.
"""

from __future__ import annotations

from celery import Celery
from celery.app.utils import Settings as CelerySettings

from rig import sentinel_url
from rig.config import Settings
from rig.connections import broker_pool_limit, process_label
from rig.keys import Keys
from rig.models import Priority
from rig.redis_conn import client_options

#: Queue the control worker serves besides the priority queues: periodic and admin tasks.
CONTROL_QUEUE = "rig.control"
#: Far above the longest job: a job running for days is never handed out again by Celery
#: (the claim fence stops a duplicate anyway).
VISIBILITY_TIMEOUT_S = 30 * 24 * 3600

TASK_SUBMITTED = "rig.submitted"
TASK_START_JOB = "rig.start_job"
TASK_TICK = "rig.tick"
TASK_HEALTH = "rig.health"
TASK_ALERTS = "rig.alerts"
TASK_ARCHIVE = "rig.archive"
#: How often each node's control worker sweeps its own old job logs (s; workers/app.py).
LOG_SWEEP_INTERVAL_S = 3600.0
#: Options of both Redis clients Celery opens, the broker's (kombu) and beat's (celery-redbeat):
#: the same as rig's own clients (rig.redis_conn.client_options): a connection attempt gives up
#: after 5 s, a reply that takes over 10 s drops the connection (a half-open one cannot hang a
#: publish, a worker's ack or beat), TCP keepalive, and an idle connection is checked before it
#: is used again. kombu's BRPOP blocks for 1 s (brpop_timeout), well under the reply timeout.
REDIS_CLIENT_OPTIONS = client_options()


#: Variables of the ``celery`` command line that set an app's broker, result backend, loader or
#: config module over the app's own settings (its -b, --result-backend, --loader and --config);
#: every ``CELERY_*`` variable is Celery's too (``CELERY_BROKER_URL`` beats ``broker_url``).
CELERY_COMMAND_VARIABLES = ("BROKER_URL", "RESULT_BACKEND", "LOADER", "CONFIG_MODULE")


def celery_variables(environ: dict[str, str]) -> list[str]:
    """The variables of ``environ`` with which Celery would override rig's own configuration:
    a ``CELERY_BROKER_URL`` left in the operator's shell by another Celery project made rig's
    workers consume from that broker (a dead one: `rig up` said "rig is up", no worker ever
    came up, jobs waited for ever). rig up starts its Celery processes without them."""
    return sorted(name for name in environ if name.startswith("CELERY_") or name in CELERY_COMMAND_VARIABLES)


def celery_variables_note(environ: dict[str, str]) -> str | None:
    """`rig up`'s one line naming the variables it leaves out, or None."""
    names = celery_variables(environ)
    if not names:
        return None
    listed = ", ".join(f"${n}" for n in names)
    return (f"note: {listed} (in the environment) {'is' if len(names) == 1 else 'are'} not passed to rig's "
            f"workers, beat and Flower: they use rig's Redis (redis_url) only")


class _OwnBroker(CelerySettings):
    """Celery's settings without its environment's say on the broker and result backend: a
    direct client (root's rig-submit) with CELERY_BROKER_URL in its shell published its
    wake-ups there. Only the settings make_celery writes count."""

    @property
    def broker_url(self) -> str | None:
        return self.first("broker_url", "broker_host")

    @property
    def broker_read_url(self) -> str | None:
        return self.get("broker_read_url") or self.broker_url

    @property
    def broker_write_url(self) -> str | None:
        return self.get("broker_write_url") or self.broker_url

    @property
    def result_backend(self) -> str | None:
        return self.first("result_backend")


def card_queue(node: str, index: int) -> str:
    """The queue only the worker of that one card consumes."""
    return f"rig.card.{node}.{index}"


def dispatcher_queues() -> list[str]:
    """Priority queues first, in strict order, then the control queue."""
    return [p.queue for p in (Priority.HIGH, Priority.MEDIUM, Priority.LOW)] + [CONTROL_QUEUE]


def redis_forms(url: str) -> dict[str, object]:
    """Celery's settings that name rig's Redis, from its one URL: broker_url (plus, under
    Sentinel, the transport options kombu and Flower need) and beat's redbeat_redis_url and
    redbeat_redis_options. A ``sentinel://`` URL is read by rig.sentinel_url only."""
    beat_options: dict[str, object] = {
        **REDIS_CLIENT_OPTIONS,
        # Like the broker (broker_connection_max_retries=None): its schedule reads and writes
        # retry through a Redis restart (a negative period retries without end). Its lock
        # renewal does not (redis-py's Lock holds the bare client): an outage across a renewal
        # (every beat loop) ends beat there, rig up restarts it, as after a crash.
        "retry_period": -1,
    }
    if (label := process_label()) is not None:
        beat_options["client_name"] = f"redbeat:{label}"
    if not sentinel_url.is_sentinel(url):
        return {"broker_url": url, "broker_sentinel_options": {}, "redbeat_redis_url": url,
                "redbeat_redis_options": beat_options}
    target = sentinel_url.parse(url)
    return {
        "broker_url": target.kombu_url(),
        "broker_sentinel_options": target.kombu_options(REDIS_CLIENT_OPTIONS),
        "redbeat_redis_url": target.redbeat_url(),
        "redbeat_redis_options": {"retry_period": -1, **target.redbeat_options(REDIS_CLIENT_OPTIONS)},
    }


def make_celery(settings: Settings) -> Celery:
    keys = Keys(settings.key_prefix)
    app = Celery("rig", set_as_current=False)
    forms = redis_forms(settings.redis_url)
    app.conf.update(
        broker_url=forms["broker_url"],
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
            "queue_order_strategy": "priority",
            "global_keyprefix": keys.celery_prefix,
            **REDIS_CLIENT_OPTIONS,
            **forms["broker_sentinel_options"],  # type: ignore[dict-item]
            # CLIENT LIST names each node process's Celery connections (rig's own: rig:...).
            **({"client_name": f"celery:{label}"} if (label := process_label()) else {}),
        },
        # Connections kept for publishing (Celery's default: 10): a publish holds one for one
        # LPUSH, so more publishing threads wait instead of opening more (rig.connections).
        broker_pool_limit=broker_pool_limit(),
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # keep trying through a Redis restart
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=False,  # the ledger decides what happens to a lost job
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # Task events only matter to Flower: the workers start without them unless their rig
        # up runs a Flower (`-E`, rig.stack), and a Flower started elsewhere turns them on (it
        # broadcasts enable_events every 5 s, its default --enable_events). rig's own tasks
        # send none (send_events=False, workers/app.py): Flower is told about jobs instead,
        # one task per job (workers/flower_bridge.py).
        worker_send_task_events=False,
        # No "task-sent" events: they cost a third of a submission; Flower shows tasks once received.
        task_send_sent_event=False,
        task_default_queue=CONTROL_QUEUE,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        # A Redis that refuses writes (full, read-only, MISCONF: rig.redis_writes) is an outage
        # like a lost connection: the consumer reconnects and waits instead of exiting (the
        # refusal is a ResponseError, a "channel error" to kombu), and beat waits (workers.beat).
        broker_channel_error_retry=True,
        beat_scheduler="workers.beat:RigBeatScheduler",
        # The URL carries the password (rig.redis_conn: Settings.redis_url is resolved). Set
        # redbeat's options here, not by its fallback to broker_transport_options (deprecated;
        # those name the broker's queues, and its client gets none of their socket options).
        redbeat_redis_url=forms["redbeat_redis_url"],
        redbeat_redis_options=forms["redbeat_redis_options"],
        redbeat_key_prefix=keys.redbeat_prefix,
        # A killed beat's lock expires in 10 s and the other beat takes over (it checks every
        # 2 s); the lock holder renews it on every loop.
        redbeat_lock_timeout=10,
        beat_max_loop_interval=2,
        beat_schedule={
            "rig-tick": {
                "task": TASK_TICK,
                "schedule": max(1.0, settings.health.check_interval),
                "options": {"queue": CONTROL_QUEUE, "expires": max(1.0, settings.health.check_interval)},
            },
            "rig-health": {
                "task": TASK_HEALTH,
                "schedule": settings.health.check_interval,
                "options": {"queue": CONTROL_QUEUE, "expires": settings.health.check_interval},
            },
            "rig-alerts": {
                "task": TASK_ALERTS,
                "schedule": settings.alert_interval,
                "options": {"queue": CONTROL_QUEUE, "expires": settings.alert_interval},
            },
            "rig-archive": {
                "task": TASK_ARCHIVE,
                "schedule": settings.archive_interval,
                "options": {"queue": CONTROL_QUEUE, "expires": settings.archive_interval},
            },
        },
        timezone="UTC",
    )
    # rig's Redis, whatever CELERY_BROKER_URL says (app.conf keeps its identity when Celery
    # loads it; its own __setattr__ would take __class__ for a setting).
    object.__setattr__(app.conf, "__class__", _OwnBroker)
    return app
