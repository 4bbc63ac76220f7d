"""The commented config file that ``rig init`` writes (rig.init_config fills it in).

Every string value is given already written as TOML (``{node_name}`` is ``"gpu1"``, quoted and
escaped by rig.init_config.toml_string); names in comments are comment-safe. The file has no
[table] header that is not commented out, so a top-level line appended at its end is read
as a top-level setting.
"""

from __future__ import annotations

TEMPLATE = """\
# rig configuration ({path})
# Every value can also be set by an environment variable: RIG_<NAME> (e.g. RIG_MAX_TASK_PER_GPU=2),
# nested ones with a double underscore (RIG_HEALTH__TIMEOUT=60). Environment wins over this file.

# This server's name; jobs record where they ran by it.
node_name = {node_name}

# Where rig keeps its state. A Redis with AOF persistence; `rig up` starts a private one under
# {home}/redis if nothing answers at a local URL, with a generated password in
# {home}/redis.password (mode 0600) that every rig command on this machine reads by itself.
redis_url = {redis_url}
# A password for a Redis of your own (never write it here if others can read this file): the
# URL's own (redis://:PASSWORD@host:6379/0), else RIG_REDIS_PASSWORD, else this file's first
# line (no access for "other"; group-readable is fine for a team). See docs/SECURITY.md.
# redis_password_file = "/etc/rig/redis.password"
# Prefix of every Redis key rig writes (several rigs can share one Redis with different ones).
key_prefix = {key_prefix}

# Placement strategy: "multi-factor" (fragmentation-aware: avoids stranding memory, keeps
# empty cards whole for big and multi-card jobs, prefers cooler cards), "best-fit" (tightest
# card), "least-loaded" (spreads jobs), or "first-fit" (lowest card number first).
scheduler_type = {scheduler_type}

# A waiting job moves up one priority level per this many seconds (no starvation of low jobs).
aging_seconds = 600

# Within a priority: the user with the least recent usage (GiB-hours, halving every
# fair_share_half_life_hours) starts next; each user's jobs largest first ("largest-first",
# packs better) or in submission order ("fifo").
fair_share = true
fair_share_half_life_hours = 24
queue_order = "largest-first"

# Per-user limits (0: none): placed-or-running jobs, and memory held summed over cards.
max_jobs_per_user = 0
max_gpu_memory_per_user = "0"
# (One user's own limits and the pools are tables: see the end of this file.)

# A job that uses more GPU memory than it declared: "warn" (flag it) or "stop" it.
overuse_policy = "warn"

# Cards rig may use, by index (nvidia-smi order). Leave unset to use every card.
# gpu_whitelist = [0, 1, 2, 3]

# Most jobs running at once on one card, however much memory is free.
max_task_per_gpu = {max_task_per_gpu}

# Fraction of each card's memory never handed out (CUDA context, fragmentation headroom).
vram_reserve_fraction = {vram_reserve_fraction}

# Priority of a job submitted without --priority: "high", "medium" or "low".
default_priority = {default_priority}

# Attempts after the first before a failed job goes to the error queue.
max_retries = {max_retries}

# Working directory of jobs that don't give --workdir (unset: the submitter's current folder).
# Absolute paths keep relative paths in commands valid across restarts.
# command_workdir = "/data/workspace"

# Job logs (one file per attempt) and rig's own logs live in separate folders.
log_dir = {log_dir}
system_log_dir = {system_log_dir}

# Finished jobs leave Redis for an archive after archive_after_days (and the oldest beyond
# archive_keep_finished at once); `rig show`, `rig log`, `rig jobs` and `rig usage` still find
# them. Default: SQLite in {home}/archive.sqlite3. For several servers, one PostgreSQL they
# all reach (pip install 'psycopg[binary]'); every node and reader must name the same one.
# archive_url = "postgresql://rig@db.example/rig"
# archive_after_days = 7
# archive_keep_finished = 10000

# Fake cards where there is no NVIDIA driver, e.g. "8x80G" or "2x24G,1x48G".
# Unset: real cards through NVML; with no driver rig falls back to 8x80G and says so.
# fake_gpus = "8x80G"

# Seconds between SIGTERM and SIGKILL when a job is killed.
kill_grace_seconds = {kill_grace_seconds}

# Users who may kill, retry and clear anyone's jobs (root always may); others only their own.
# admins = ["alice"]

# Where the workers run as root, each job runs as the user who submitted it; a job submitted by
# root runs as root unless this is false. (Workers run as another user: every job runs as it.)
# allow_root_jobs = true

# Flower (Celery monitoring) listens here, always behind basic auth (RIG_FLOWER_AUTH, else
# {home}/flower.auth); it is plain HTTP, so keep it on loopback unless TLS stands in front.
flower_address = {flower_address}
flower_port = {flower_port}
# The Prometheus endpoint (no login): loopback unless you mean it. metrics_port = 0 turns it off.
# metrics_address = "127.0.0.1"
# metrics_port = 9840

# One user's own limits (override the two above for that user).
# [user_limits.alice]
# max_jobs = 8
# max_gpu_memory = "320G"

# Pools: named sets of nodes or cards; `rig-submit --pool a100` runs only there. A node's
# `rig up` records them: give every node the same (a submitter's own [pools] do not count).
# [pools]
# a100 = ["gpu1", "gpu2:0-3"]

# Submission presets: `rig-submit --template finetune -- python ft.py`. Explicit flags win.
# finetune, inference and test ship built in (see `rig templates`); redefine or add your own:
# [templates.finetune]
# margin = 1.2            # x the declared memory (or x the learnt figure with --gpu-memory auto)
# priority = "medium"
# retries = 1
# time_limit = "24h"
# oom_retry_grow = true
#
# [templates.nightly-eval]
# gpu_memory = "16G"
# priority = "low"
# time_limit = "6h"

# Alerts: POSTed as JSON (Slack-compatible "text") to this URL, and always written to the
# system log; one message when a condition starts, one when it clears.
# alert_webhook = "https://hooks.example.org/rig"
# [alerts]
# max_queue = 50              # waiting jobs per priority
# max_temperature = 85        # C
# max_failure_rate = 0.2      # over failure_window seconds (900)
# idle_wait_seconds = 60      # cards idle while a job that fits them waits this long
# reserved_idle_seconds = 600 # memory reserved on a card that shows no use
# max_fragmentation = 0.5     # share of free memory too fragmented for the smallest waiting job

# Seconds between health checks (below the timeout), and the silence after which a worker
# counts as dead (at least twice telemetry_interval). Written as dotted keys, not as a [health]
# table, so a line appended below this one is still a top-level setting.
health.check_interval = {check_interval}
health.timeout = {timeout}

# Relative paths (log_dir, system_log_dir, command_workdir, redis_password_file) are taken
# under rig's home ({home}), wherever rig is started from.
# Add your own settings below; a [section] header makes every line after it part of that section.
"""
