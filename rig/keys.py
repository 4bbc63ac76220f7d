"""The one place that builds Redis key names. No other module formats a key string.

Key schema (P = settings.key_prefix, default ``rig:``):

  P job:next_id                 string   last job id handed out (INCR)
  P job:<id>                    hash     the job record (see rig.models.Job)
  P job:<id>:spec               string   its command and workdir, packed (rig.packed)
  P env:<digest>                string   one user's job environment, packed; named by the jobs'
                                         env_ref field (rig.models.SPEC_FIELDS)
  P env:refs                    hash     digest -> how many job records name that environment
  P jobs:all                    zset     every job id, score = id
  P jobs:state:<STATE>          zset     job ids in that state, score = id
  P pending                     zset     waiting jobs; score = priority rank * 1e12 + id
  P pending:user:<user>         zset     that user's waiting jobs, same scores (fair share)
  P pending:users               set      users with waiting jobs
  P usage:<user>                hash     recent usage: value (GiB-hours) decayed to at (epoch s)
  P durations-names:<user>      hash     job name -> run seconds of that user's earlier successful
                                         runs, newest first, space separated (rig.bounded_runs; at
                                         most estimates.NAMES_KEPT names per user, the latest to run)
  P durations-name-seen:<user>  zset     job name -> when it last ran (the oldest leave first)
  P durations-template:<user>:<template>  list   the same per template (rig.estimates)
  P durations-commands:<user>   hash     command digest -> the same per command, space separated
                                         (at most estimates.COMMANDS_KEPT per user)
  P durations-command-seen:<user>  zset  command digest -> when it last ran (which ones leave first)
  P recent-runtimes:<user>      list     that user's recent successful runs "<s> <bytes> <cards> <user>"
  P recent-runtimes-users       zset     users with recent runs; score = when the last one ended
  P errors                      zset     the error queue: ended jobs waiting for a person; score = time
  P cards                       set      card ids "<node>/<index>"
  P card:<node>:<index>         hash     one card's capacity, reservations and readings; 'version'
                                         moves with every write of it or its jobs (rig.ledger.CARD_VERSION)
  P card:<node>:<index>:jobs    hash     job id -> bytes reserved on that card
  P card:<node>:<index>:starts  list     starts placed on that card (its first card), "<job id> <token>",
                                         pushed by reserve.lua with the reservation; its card worker
                                         takes them (BLMOVE) into ...:taking
  P card:<node>:<index>:taking  list     starts that card's worker has taken and not yet claimed or
                                         refused (a reliable queue: a worker that starts moves them back)
  P peaks:<user>                hash     job name -> measured peak bytes of that user's earlier
                                         successful runs, newest first, space separated (at most
                                         estimates.NAMES_KEPT names per user)
  P peaks-seen:<user>           zset     job name -> when it last ran
  P nodes                       set      node names
  P node:<node>                 hash     a node's registration (cards, started_at, pools: its
                                         config's [pools] as JSON, rig.pools) and liveness
                                         (last_seen, down_since, stopped_at: rig.nodes)
  P node:<node>:alive           string   node heartbeat, expires after health.timeout
  P node:<node>:health:lock     string   the control worker running that node's local checks (PX)
  P worker:<name>               string   heartbeat, expires after health.timeout
  P workers                     set      worker names seen
  P sched:wake                  list     nudges for the dispatcher (BLPOP)
  P replication:mark            string   counter written before each WAIT (rig.replication)
  P sched:leader                string   the dispatcher holding the lock (PX)
  P sched:forecast              hash     the leader's estimated starts (rig.forecast_store): job id ->
                                         compact JSON, plus made_at, every, complete, newest_id;
                                         written in one MULTI, expires after a few intervals
  P health:lock                 string   the control worker running a health check (PX)
  P logs:lock                   string   the control worker sweeping old logs (PX)
  P archive:lock                string   the control worker moving finished jobs to the archive (PX)
  P join:lock                   string   a rig up checking the cluster's pools and registering its
                                         node (redis-py Lock, PX): two at once cannot both pass
  P archive:url                 string   the cluster's one archive (first node's archive_url, no password; SET NX)
  P archive:ok_at               string   when an archiving pass last finished (epoch s)
  P archive:held                string   set once the cluster's archive was given jobs (a missing file is a loss)
  P archive:host                string   a SQLite archive's host: JSON {id: machine id, name, url}, set with
                                         archive:url (rig.archive_host); absent for PostgreSQL or an older record
  P archive:previous            string   the archive the cluster used before its last move (no password)
  P archive:rollback            string   "<epoch s> <line>": the last time Redis was found gone back to an older
                                         copy, and what was repaired (rig.rollback; expires after 7 days)
  P archive:checked             string   the run_id of the Redis server rig.rollback last checked against the archive
  P archive:pass                hash     the archiving passes: interval (s, the archiving node's), node, and
                                         while passes fail: skips (in a row), skipped_since, skipped_at (epoch
                                         s), reason (one line), url; a pass that succeeds deletes the last five
  P alerts:active               hash     alert key -> JSON of the alert now firing
  P alerts:since                hash     condition -> when it was first seen (epoch s)
  P flower:told                 hash     job id -> "<STATE>:<attempt>" last told to Flower, for jobs
                                         not ended yet (workers.flower_bridge; an end deletes it)
  P flower:ended                zset     job id -> when its end was told (epoch s): the ends told
                                         again to a Flower that (re)starts (bounded, workers.flower_bridge)
  P flower:ended_events         hash     job id -> JSON [hostname, type, fields] of that end's event
  P metrics:counters            hash     Prometheus counters, only ever incremented (rig.metrics):
                                         submitted (rig.store), started (claim.lua), requeued and
                                         ended:<STATE>:<failure class or ''> (transition.lua)
  P metrics:start-wait          hash     histogram of submission -> first start (s), fed by
                                         claim.lua: le:<bound> (cumulative), sum, count
  P timeline                    zset     one sample a minute for rig's web page (rig.timeline):
                                         score = the minute (epoch s), member = JSON; a day kept
  P events                      channel  job state changes, "<id> <STATE>"
  P kill                        channel  "<id>": stop this running job
  P celery:                     prefix   kombu's own keys (queues, unacked, bindings)
  P redbeat:                    prefix   celery-redbeat's schedule and lock
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key builder bound to one prefix."""

    prefix: str = "rig:"

    # jobs
    @property
    def next_job_id(self) -> str:
        return f"{self.prefix}job:next_id"

    def job(self, job_id: int | str) -> str:
        return f"{self.prefix}job:{job_id}"

    def job_spec(self, job_id: int | str) -> str:
        """String: the job's write-once submission fields, packed (rig.models.SPEC_FIELDS)."""
        return f"{self.prefix}job:{job_id}:spec"

    def env_blob(self, digest: str) -> str:
        """String: one user's job environment, packed, shared by the jobs naming it (env_ref)."""
        return f"{self.prefix}env:{digest}"

    @property
    def env_refs(self) -> str:
        """Hash: environment digest -> the number of job records naming it (the last one
        forgotten deletes the blob: rig/lua/archived.lua)."""
        return f"{self.prefix}env:refs"

    @property
    def all_jobs(self) -> str:
        return f"{self.prefix}jobs:all"

    def state_index(self, state: str) -> str:
        return f"{self.prefix}jobs:state:{state}"

    @property
    def pending(self) -> str:
        return f"{self.prefix}pending"

    def pending_user(self, user: str) -> str:
        return f"{self.prefix}pending:user:{user}"

    @property
    def pending_users(self) -> str:
        return f"{self.prefix}pending:users"

    def usage(self, user: str) -> str:
        return f"{self.prefix}usage:{user}"

    def durations_of_names(self, user: str) -> str:
        """Run times of one user's jobs per name (name -> runs; rig.bounded_runs): another
        user's jobs of the same name never skew them (nor the backfill estimate made from them)."""
        return f"{self.prefix}durations-names:{user}"

    def durations_of_names_seen(self, user: str) -> str:
        """When each name of ``durations_of_names(user)`` last ran (the oldest leave first)."""
        return f"{self.prefix}durations-name-seen:{user}"

    def durations_of_template(self, user: str, template: str) -> str:
        """Run times of one user's jobs submitted with one template (rig.estimates)."""
        return f"{self.prefix}durations-template:{user}:{template}"

    def durations_of_commands(self, user: str) -> str:
        """Run times of one user's jobs per command (rig.estimates.command_digest -> runs)."""
        return f"{self.prefix}durations-commands:{user}"

    def durations_of_commands_seen(self, user: str) -> str:
        """When each command of ``durations_of_commands(user)`` last ran (the oldest leave first)."""
        return f"{self.prefix}durations-command-seen:{user}"

    def recent_runtimes(self, user: str) -> str:
        """One user's recent successful runs with their sizes (rig.estimates.RecentRun)."""
        return f"{self.prefix}recent-runtimes:{user}"

    @property
    def recent_runtime_users(self) -> str:
        """Users with recent runs, scored by when their last run ended (rig.estimates)."""
        return f"{self.prefix}recent-runtimes-users"

    @property
    def errors(self) -> str:
        return f"{self.prefix}errors"

    def peaks(self, user: str) -> str:
        """Measured peaks of one user's jobs per name (``--gpu-memory auto``; rig.bounded_runs):
        per user, so another's run of the same name never sets what this user's job declares."""
        return f"{self.prefix}peaks:{user}"

    def peaks_before_names_were_bounded(self, user: str, name: str) -> str:
        """Where rig before ``peaks(user)`` kept the same as a list per name (read only, for
        ``--gpu-memory auto`` right after an upgrade; each expires 30 days after its last run)."""
        return f"{self.prefix}history:{user}:{name}"

    def peaks_seen(self, user: str) -> str:
        """When each name of ``peaks(user)`` last ran (the oldest leave first)."""
        return f"{self.prefix}peaks-seen:{user}"

    # cards and nodes
    @property
    def cards(self) -> str:
        return f"{self.prefix}cards"

    def card(self, node: str, index: int | str) -> str:
        return f"{self.prefix}card:{node}:{index}"

    def card_jobs(self, node: str, index: int | str) -> str:
        return f"{self.prefix}card:{node}:{index}:jobs"

    def card_starts(self, node: str, index: int | str) -> str:
        """List: "<job id> <token>" of each start placed on this card (reserve.lua pushes it)."""
        return f"{self.prefix}card:{node}:{index}:starts"

    def card_taking(self, node: str, index: int | str) -> str:
        """List: the starts this card's worker took off ``card_starts`` and has not claimed yet."""
        return f"{self.prefix}card:{node}:{index}:taking"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}nodes"

    @property
    def installation(self) -> str:
        """Hash: ``id`` (this installation's identity, rig.installation) and ``created_at``."""
        return f"{self.prefix}installation"

    def node(self, node: str) -> str:
        return f"{self.prefix}node:{node}"

    def node_alive(self, node: str) -> str:
        return f"{self.prefix}node:{node}:alive"

    def node_health_lock(self, node: str) -> str:
        return f"{self.prefix}node:{node}:health:lock"

    def node_owner(self, node: str) -> str:
        """String: who owns the node name now (rig.node_claim), expiring after health.timeout s."""
        return f"{self.prefix}node:{node}:owner"

    # workers and dispatch
    def worker(self, name: str) -> str:
        return f"{self.prefix}worker:{name}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    @property
    def sched_wake(self) -> str:
        return f"{self.prefix}sched:wake"

    @property
    def replication_mark(self) -> str:
        """String: incremented just before a WAIT, on the same connection (rig.replication)."""
        return f"{self.prefix}replication:mark"

    @property
    def sched_leader(self) -> str:
        return f"{self.prefix}sched:leader"

    @property
    def forecast(self) -> str:
        """The leading dispatcher's estimated starts (rig.forecast_store)."""
        return f"{self.prefix}sched:forecast"

    @property
    def health_lock(self) -> str:
        return f"{self.prefix}health:lock"

    @property
    def logs_lock(self) -> str:
        return f"{self.prefix}logs:lock"

    @property
    def archive_lock(self) -> str:
        return f"{self.prefix}archive:lock"

    @property
    def join_lock(self) -> str:
        """A rig up's pools check and its node's registration, one rig up at a time (rig.stack)."""
        return f"{self.prefix}join:lock"

    @property
    def archive_url(self) -> str:
        """String: the cluster's archive (rig.archive_cluster), password left out; never flips."""
        return f"{self.prefix}archive:url"

    @property
    def archive_ok_at(self) -> str:
        """String: when an archiving pass last finished (epoch s)."""
        return f"{self.prefix}archive:ok_at"

    @property
    def archive_held(self) -> str:
        """String: present once the cluster's archive was given jobs; how many it took (rig.archive_cluster)."""
        return f"{self.prefix}archive:held"

    @property
    def archive_host(self) -> str:
        """String: the host of the cluster's SQLite archive, JSON (rig.archive_host.Host.record)."""
        return f"{self.prefix}archive:host"

    @property
    def archive_previous(self) -> str:
        """String: the archive the cluster used before its last move (no password)."""
        return f"{self.prefix}archive:previous"

    @property
    def archive_rollback(self) -> str:
        """String: ``<epoch s> <line>`` of the last rollback of Redis found (rig.rollback)."""
        return f"{self.prefix}archive:rollback"

    @property
    def archive_checked(self) -> str:
        """String: the Redis server's run_id when rig.rollback last checked it (rig.rollback.unchecked)."""
        return f"{self.prefix}archive:checked"

    @property
    def archive_pass(self) -> str:
        """Hash: the archiving passes' interval and, while they fail, why (rig.archive_cluster)."""
        return f"{self.prefix}archive:pass"

    @property
    def alerts_active(self) -> str:
        return f"{self.prefix}alerts:active"

    @property
    def alerts_since(self) -> str:
        return f"{self.prefix}alerts:since"

    @property
    def flower_told(self) -> str:
        return f"{self.prefix}flower:told"

    @property
    def flower_ended(self) -> str:
        """Sorted set: job id -> when its end was told to Flower (epoch s), the recent ends."""
        return f"{self.prefix}flower:ended"

    @property
    def flower_ended_events(self) -> str:
        """Hash: job id -> JSON [hostname, event type, fields] of the end told (flower_ended)."""
        return f"{self.prefix}flower:ended_events"

    @property
    def metrics_counters(self) -> str:
        """Hash of Prometheus counters (rig.metrics.COUNTER_FIELDS); HINCRBY only."""
        return f"{self.prefix}metrics:counters"

    @property
    def metrics_start_wait(self) -> str:
        """Hash: the cumulative histogram of submission -> first start (rig.metrics)."""
        return f"{self.prefix}metrics:start-wait"

    @property
    def timeline(self) -> str:
        """Zset of per-minute samples (rig.timeline): bounded to TIMELINE_WINDOW_S."""
        return f"{self.prefix}timeline"

    @property
    def events_channel(self) -> str:
        return f"{self.prefix}events"

    @property
    def kill_channel(self) -> str:
        return f"{self.prefix}kill"

    # third-party prefixes
    @property
    def celery_prefix(self) -> str:
        return f"{self.prefix}celery:"

    @property
    def redbeat_prefix(self) -> str:
        return f"{self.prefix}redbeat:"


def card_id(node: str, index: int | str) -> str:
    """The id a person and the ledger use for one card: ``<node>/<index>``."""
    return f"{node}/{index}"


def card_worker_name(node: str, index: int | str) -> str:
    """The Celery worker name (``-n``) of the worker serving card ``index`` of ``node``; its
    heartbeat key is ``Keys.worker(card_worker_name(...))``."""
    return f"card{index}@{node}"


def control_worker_name(node: str) -> str:
    """The Celery worker name of ``node``'s control worker (dispatcher, local health)."""
    return f"control@{node}"


def split_card_id(cid: str) -> tuple[str, int]:
    node, _, index = cid.rpartition("/")
    return node, int(index)
