"""``rig``: bring the stack up and down, see and control jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click

from rig.cli import as_json as J
from rig.cli.common import (
    INSTANCE_OPTION,
    MAX_LIMIT,
    RigGroup,
    check_limit,
    client_from,
    fail,
    handle_errors,
    no_node_note,
    parse_job_id,
    settings_from,
)
from rig.cli.recover import recover
from rig.cli.render import (
    make_console,
    render_errors,
    render_job,
    render_jobs,
    render_metrics,
    render_status,
)
from rig.cli.submit import do_submit, submit_options
from rig.cli.top import top
from rig.cli.usage import since_time, usage
from rig.durations import format_duration
from rig.errors import ConfigError, InvalidInput, StackError
from rig.models import JobState
from rig.registration import read_notes, write_notes
from rig.text import clean


@click.group(cls=RigGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--redis-url", envvar=None, help="Redis holding rig's state (default from config).")
@click.option("--fake-gpus", metavar="SPEC", help="Use fake cards, e.g. 8x80G (no NVIDIA driver needed).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, fake_gpus: str | None) -> None:
    """rig: a VRAM-aware GPU job queue for shared servers."""
    ctx.ensure_object(dict)
    ctx.obj["overrides"] = {"redis_url": redis_url, "fake_gpus": fake_gpus}


# -- submitting -------------------------------------------------------------------------------
@cli.command("submit")
@submit_options
@click.pass_context
def submit_cmd(ctx: click.Context, **kwargs) -> None:  # noqa: ANN003
    """Queue COMMAND (same as rig-submit). Prints the job id."""
    do_submit(ctx, **kwargs)


# -- seeing -------------------------------------------------------------------------------------
#: `rig up --daemon --redis URL` hands the URL to its daemon in this variable (rig.config_check.OWN_VARIABLES).
DAEMON_REDIS_URL = "RIG_UP_REDIS_URL"

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@cli.command()
@click.option("--pool", metavar="NAME", help="Only this pool's cards and the jobs waiting for it.")
@JSON_OPTION
@click.pass_context
@handle_errors
def status(ctx: click.Context, as_json: bool, pool: str | None) -> None:
    """Cards per node (memory, use, temperature, jobs), waiting jobs per priority, users,
    live workers."""
    client = client_from(ctx)
    client.ping()
    report = client.status(pool=pool)
    if as_json:
        click.echo(J.dumps(J.status_dict(report)))
        return
    render_status(report, make_console())
    if not report.cards and not report.nodes and (note := no_node_note(client)):
        click.echo(note, err=True)


@cli.command()
@click.option("--state", "-s", help="Only jobs in this state (pending, running, failed, ...).")
@click.option("--user", "-u", metavar="NAME", help="Only the jobs this login name submitted.")
@click.option("--mine", is_flag=True, help="Only your own jobs (your login name, as rig records it).")
@click.option("--limit", "-n", type=int, default=50, show_default=True)
@click.option("--since", metavar="DURATION", help="Only jobs submitted this long ago or later (12h, 30d).")
@JSON_OPTION
@click.pass_context
@handle_errors
def jobs(ctx: click.Context, state: str | None, user: str | None, mine: bool, limit: int, since: str | None,
         as_json: bool) -> None:
    """List jobs, newest first, with why each waits or ended (the reason column) and, where the
    screen is wide enough, when each waiting one is estimated to start; archived jobs included."""
    check_limit(limit)
    # "" is a slip (`--user "$U"` with U unset), never "no filter" nor "no jobs of user "
    if user is not None and not user.strip():
        raise InvalidInput(f"--user needs a login name, got {user!r}; give one (or --mine for your own)")
    if mine:
        from rig.client import current_identity  # the same rule as ownership: the real uid's name

        me = current_identity().name
        if user is not None and user != me:
            raise InvalidInput(f"--mine is {me}, --user is {user}: give one of them")
        user = me
    client = client_from(ctx)
    st = JobState.parse(state) if state is not None else None  # "" is refused, never every state
    client.ping()
    # One more than shown: whether the list was cut is said, never left to be guessed (at
    # MAX_LIMIT itself, where client.jobs takes no more, no more exist anyway).
    found = client.jobs(st, limit=min(limit + 1, MAX_LIMIT), user=user,
                        since=since_time(since) if since is not None else None)  # "": refused
    cut = len(found) > limit
    found = found[:limit]
    from rig.history import archive_warning

    if warning := archive_warning(client):  # Redis' jobs listed all the same (rig.history)
        click.echo(warning, err=True)
    if cut:
        click.echo(f"the newest {limit} shown; more jobs match: --limit N shows more"
                   + ("" if since else ", --since (e.g. 2h) fewer"), err=True)
    waiting = [j for j in found if j.state is JobState.PENDING]
    # rig.forecast, the one estimate, as the leading dispatcher stored it (rig.forecast_store)
    estimates = client.start_estimates([j.id for j in waiting]) if waiting else None
    # Why each waits: the dispatcher's sentence while it holds, else its place or rig show's words.
    said = client.waiting_words(waiting)
    if as_json:
        click.echo(J.dumps([J.job_dict(j, **(estimates.row(j.id) if estimates and j.state is JobState.PENDING
                                             else {}),
                                       **({"waiting_because": said[j.id]} if j.id in said else {}))
                            for j in found]))
        return
    if not found and user is not None:  # not an error: nothing on stdout, a word on stderr
        click.echo(f"no jobs of user {clean(user)}" + (f" in state {st.value}" if st else ""), err=True)
        return
    starts = ({j.id: estimates.of(j.id).short(estimates.now, estimates.made_at) for j in waiting}
              if estimates else None)
    render_jobs(found, make_console(), starts, said)


@cli.command()
@click.argument("job_id")
@INSTANCE_OPTION
@JSON_OPTION
@click.pass_context
@handle_errors
def show(ctx: click.Context, job_id: str, instance: str | None, as_json: bool) -> None:
    """Everything about one job; for a waiting job, why it waits and its estimated start."""
    client = client_from(ctx)
    client.ping()
    job = client.get(job_id, instance)
    why = client.why_waiting(job)  # the one explanation (rig.waiting), for the table and JSON alike
    start: dict[str, object] = {}
    if job.state is JobState.PENDING:  # rig.forecast: the one estimate, worded in one place
        start = client.start_estimates([job.id]).row(job.id)
    elif job.state in (JobState.ASSIGNED, JobState.RUNNING):  # its end as the dispatcher expects it
        end = client.running_end(job)  # None: a gateway older than this client cannot say
        start = end.as_dict() if end is not None else {}
    if as_json:
        click.echo(J.dumps(J.job_dict(job, waiting_because=why, **start,
                                      in_error_queue=client.in_error_queue(job.id))))
        return
    render_job(job, why, make_console(), in_error_queue=client.in_error_queue(job.id),
               estimated_start=start.get("estimated_start_text"), expected_run=start.get("expected_run_text"),
               expected_end=start.get("expected_end_text"))
    if instance is None and (other := client.other_instance(job)) is not None:
        # Redis lost its data and ids restarted: the id names two jobs (a tester saw only one).
        click.echo(f"note: the archive also holds an earlier job {job.id} ('{clean(other.name)}' by "
                   f"{clean(other.user)}, {other.state.value}, instance {other.instance[:8]}): "
                   f"`rig show {job.id} --instance {other.instance[:8]}`", err=True)


@cli.command()
@click.argument("job_id")
@INSTANCE_OPTION
@JSON_OPTION
@click.pass_context
@handle_errors
def metrics(ctx: click.Context, job_id: str, instance: str | None, as_json: bool) -> None:
    """Declared vs measured GPU memory (peak, mean), GPU utilisation and duration, per attempt."""
    client = client_from(ctx)
    client.ping()
    job = client.get(job_id, instance)
    if as_json:
        current = None
        if job.state is JobState.RUNNING:
            current = {"attempt": job.attempt, "gpu_memory": job.gpu_memory, "vram_peak": job.vram_peak,
                       "vram_mean": job.vram_mean, "util_mean": job.util_mean, "started_at": job.started_at}
        click.echo(J.dumps({"id": job.id, "name": job.name, "attempts": job.attempts, "running": current}))
        return
    render_metrics(job, make_console())


@cli.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new output, through every retried attempt, until the job is final.")
@click.option("--attempt", "-a", type=int, help="Which attempt's log (default: the latest).")
@INSTANCE_OPTION
@click.pass_context
@handle_errors
def log(ctx: click.Context, job_id: str, follow: bool, attempt: int | None, instance: str | None) -> None:
    """Print a job's output (stdout and stderr) on stdout; which attempt, on stderr. With -f,
    follow it, retried attempts included, until the job is final (rig.cli.logview)."""
    from rig.cli.logview import followed, id_given_again, show_log, this_machine
    from rig.reconnect import WATCH_RECONNECT_S, RideOut

    client = client_from(ctx)
    client.ping()
    job = client.get(parse_job_id(job_id), instance)
    # Refused before any line about it: `rig log -f` of another user's job printed its header
    # ("--- job 12, attempt 1 (a/0) ---") and only then the refusal (the gateway checks again).
    client.check_control(job, "read the log of")
    # With --instance, every later read is of that very job (its whole instance), never the
    # other job now holding the id.
    picked = (job.instance or instance) if instance is not None else None
    # Following rides out a Redis blip (rig.reconnect); one look without -f does not.
    ride = RideOut(lambda line: click.echo(line, err=True), WATCH_RECONNECT_S if follow else 0.0)
    # Without it, the job read now (its instance): after Redis lost its data the id may name
    # another job, whose log is not this one's (rig.cli.logview.followed).
    current = ((lambda: ride.call(client.get, job.id, picked)) if picked is not None
               else (lambda: ride.call(followed, client, job.id, job.instance)))
    show_log(current, attempt=attempt, follow=follow, out=sys.stdout.buffer,
             say=lambda line: click.echo(line, err=True), why=client.why_waiting,
             here=this_machine(client.settings.node_name, client.nodes()),
             open_log=lambda path: client.open_log(job.id, path, picked),
             exists=lambda path: ride.call(client.log_exists, job.id, path, picked),
             name_instance=instance is not None or id_given_again(client, job),
             retention=lambda ended: (("error_log_retention_days", client.settings.error_log_retention_days)
                                      if client.in_error_queue(ended.id)
                                      else ("log_retention_days", client.settings.log_retention_days)))


# -- controlling ------------------------------------------------------------------------------
@cli.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--no-wait", is_flag=True, help="Return at once; don't wait for a running job to stop.")
@click.pass_context
@handle_errors
def kill(ctx: click.Context, job_ids: tuple[str, ...], no_wait: bool) -> None:
    """Stop jobs: waiting ones are cancelled, running ones stopped with everything they spawned."""
    from rig.cli.kill import kill_command

    def connect():  # noqa: ANN202 - what client_from makes
        client = client_from(ctx)
        client.ping()
        return client

    # malformed and unknown ids: one line each, the rest killed
    status = kill_command(connect, job_ids, wait=not no_wait)
    if status:
        sys.exit(status)


@cli.command()
@click.option("--clear", "clear_ids", multiple=True, metavar="JOB",
              help="Take a job out of the error queue (repeatable); it keeps its final state.")
@click.option("--limit", "-n", type=int, default=100, show_default=True)
@JSON_OPTION
@click.pass_context
@handle_errors
def errors(ctx: click.Context, clear_ids: tuple[str, ...], limit: int, as_json: bool) -> None:
    """The error queue: jobs that failed for good or timed out, waiting for a person."""
    check_limit(limit, "jobs of the error queue")  # -5 listed all but 5 of them, 0 every one
    client = client_from(ctx)
    client.ping()
    for jid in clear_ids:
        client.check_control(client.get(jid), "clear")  # all refusals before any change
    if clear_ids:
        for jid in clear_ids:
            job = client.clear_error(jid)
            click.echo(f"job {job.id} cleared from the error queue (stays {job.state.value})")
        return
    queued = client.errors(limit=limit)
    if as_json:
        click.echo(J.dumps([J.job_dict(j) for j in queued]))
        return
    render_errors(queued, make_console(), total=client.error_count())


@cli.command()
@click.argument("job_id")
@click.option("--gpu-memory", "-m", "gpu_memory", metavar="SIZE", help="A new memory declaration.")
@click.option("--time-limit", "time_limit", metavar="DURATION",
              help="A new time limit (e.g. 4h; a bare number is seconds), for a job that timed out.")
@click.pass_context
@handle_errors
def retry(ctx: click.Context, job_id: str, gpu_memory: str | None, time_limit: str | None) -> None:
    """Send a job from the error queue back to the queue (its place is kept)."""
    client = client_from(ctx)
    client.ping()
    job = client.retry(job_id, gpu_memory=gpu_memory, time_limit=time_limit)
    limit = f", time limit {format_duration(job.time_limit)}" if job.time_limit else ""
    click.echo(f"job {job.id} is waiting again ({job.priority.value} priority, "
               f"{job.gpu_memory / 2**30:.1f} GiB per card{limit})")


@cli.command()
@click.pass_context
@handle_errors
def templates(ctx: click.Context) -> None:
    """The submission presets (`rig-submit --template NAME`); define more in the config."""
    from rig.cli.fit import Col, fitted_table

    cols = (Col("name", "name", shrink="middle", min_width=8, want=12),
            Col("memory", "memory", drop=5, shrink="end", min_width=6, want=14),
            Col("margin", "margin", drop=3),
            Col("priority", "priority", drop=6),
            Col("retries", "retries", drop=2),
            Col("limit", "time limit", drop=4),
            Col("grow", "grow on OOM", drop=1),
            Col("what", "what for", shrink="end", min_width=12, want=30, first_to=60))
    from rig.errors import RedisAuthFailed, RedisUnavailable

    try:
        # The client's: the cluster's templates (rig.cluster_templates), through the gateway
        # or straight from the nodes' records, which every submission uses.
        presets = client_from(ctx).templates()
    except RedisUnavailable as exc:
        if isinstance(exc, RedisAuthFailed):
            raise
        # Unreachable, the list stays useful offline, said to be this config's (it was, in silence).
        presets = dict(settings_from(ctx).templates)
        click.echo(f"warning: {exc}: these are this config's templates; the cluster's, recorded by its nodes "
                   f"and used by every submission, may differ", err=True)
    rows = [{"name": name, "memory": t.gpu_memory or "(--gpu-memory)", "margin": f"x {t.margin:g}",
             "priority": t.priority or "-", "retries": "-" if t.retries is None else str(t.retries),
             "limit": t.time_limit or "-",
             "grow": "-" if t.oom_retry_grow is None else ("yes" if t.oom_retry_grow else "no"),
             "what": t.description}
            for name, t in sorted(presets.items())]
    console = make_console()
    console.print(fitted_table(cols, rows, console.width, title="templates (explicit flags win)",
                               title_justify="left"))


@cli.command()
@click.argument("path", required=False, type=click.Path(dir_okay=False))
@click.option("--node-name", help="This server's name (default: hostname).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_context
@handle_errors
def init(ctx: click.Context, path: str | None, node_name: str | None, force: bool) -> None:
    """Write a commented config file (default: $RIG_CONFIG, else $RIG_HOME/config.toml). It
    never reads the config in force, so it can replace a broken one."""
    from rig.init_config import init_config

    written = init_config(path, node_name, force)
    click.echo(f"wrote {written.path}")
    for note in written.notes:
        click.echo(note, err=True)


@cli.command()
@click.pass_context
@handle_errors
def config(ctx: click.Context) -> None:
    """Print the settings in force, each with where it came from (default, file, RIG_* variable,
    flag)."""
    settings = settings_from(ctx)
    click.echo(f"# config file: {settings.config_file or 'none (defaults and RIG_* variables)'}")
    from rig.config import PATH_FIELDS, setting_origins, shown_setting

    click.echo(f"# relative paths ({', '.join(PATH_FIELDS)}) are taken under home, {shown_setting(settings.home, quoted=False)}")
    from rig.redis_conn import password_source, strip_password

    origins = setting_origins(settings)

    for key, value in settings.model_dump().items():
        if key == "redis_url":  # never print the password; say where it comes from
            source = password_source(value)
            value = strip_password(value) + (f" (password from {source})" if source else " (no password)")
        elif key == "archive_url" and value:  # a PostgreSQL password in it: never printed either
            from rig.archive import safe_url

            value = safe_url(value)
        if key != "config_file":
            click.echo(f"{key} = {shown_setting(value)}" + (f"  # {origins[key]}" if key in origins else ""))


# -- the stack ----------------------------------------------------------------------------------
@cli.command()
@click.option("--daemon", "-d", is_flag=True, help="Run in the background; `rig down` stops it.")
@click.option("--no-flower", is_flag=True, help="Don't start Flower.")
@click.option("--no-beat", is_flag=True, help="Don't start beat (another node runs it).")
@click.option("--no-metrics", is_flag=True, help="Don't serve the Prometheus endpoint.")
@click.option("--no-gateway", is_flag=True,
              help="Don't start the gateway (users without Redis' password then cannot use rig here).")
@click.option("--only", multiple=True,
              type=click.Choice(["redis", "cards", "control", "beat", "flower", "metrics", "gateway"]),
              help="Start only these parts (repeatable), e.g. for docker-compose services.")
@click.option("--fake-gpus", "fake_gpus_opt", metavar="SPEC", help="Use fake cards, e.g. 8x80G.")
@click.option("--redis-url", "--redis", "redis_url_opt", metavar="URL",
              help="Redis holding rig's state; on a second server, the first one's (see README, several servers).")
@click.option("--node", "node_opt", metavar="NAME", help="This server's name in the cluster (default: hostname).")
@click.option("--reason-file", "reason_file", hidden=True, type=click.Path(path_type=Path),
              help="(rig up --daemon's own) where this daemon writes why it could not start.")
@click.pass_context
@handle_errors
def up(ctx: click.Context, daemon: bool, no_flower: bool, no_beat: bool, no_metrics: bool, no_gateway: bool,
       only: tuple[str, ...],
       fake_gpus_opt: str | None, redis_url_opt: str | None, node_opt: str | None,
       reason_file: Path | None = None) -> None:
    """Bring up this node: Redis (if none is reachable), one worker per card, the dispatcher,
    beat and Flower. Ctrl-C stops everything it started; running jobs keep running and are
    adopted by the next `rig up`. Several servers share one Redis: `rig up --node b --redis URL`."""
    from rig.cli import lossy
    from rig.cli.daemon import daemon_reason, reason_path, write_reason
    from rig.stack import (
        GATEWAY,
        Stack,
        UpOptions,
        already_up,
        check_add_on_log_dir,
        ensure_writable_home,
        hold_node_locks,
        running_pid,
        runs_node,
    )
    from rig.supervision import safe_python

    if fake_gpus_opt:
        ctx.obj["overrides"]["fake_gpus"] = fake_gpus_opt
    # `rig up --daemon --redis URL` hands the URL to its daemon in DAEMON_REDIS_URL, not in its argv
    # (`ps`) nor as RIG_REDIS_URL: the daemon then said "$RIG_REDIS_URL (in the environment)
    # overrides redis_url in rig.toml; unset it", of a variable the operator never set.
    redis_url_opt = redis_url_opt or os.environ.pop(DAEMON_REDIS_URL, None)
    if redis_url_opt:
        ctx.obj["overrides"]["redis_url"] = redis_url_opt
    if node_opt:
        ctx.obj["overrides"]["node_name"] = node_opt
    settings = settings_from(ctx)
    ensure_writable_home(settings)
    if settings.fake_gpus:
        from rig.gpus import parse_fake_spec

        parse_fake_spec(settings.fake_gpus)  # a bad spec is one line now, not a dead worker later
    overrides = {k: v for k, v in ctx.obj["overrides"].items() if v}
    env_overrides = {f"RIG_{k.upper()}": str(v) for k, v in overrides.items()}
    if daemon:
        existing = running_pid(settings)
        if existing:
            raise StackError(already_up(settings.node_name, existing, only))
        if runs_node(only):  # refused here, as its daemon would be: in the other node's up.log
            for held in hold_node_locks(settings, only):
                os.close(held)
        else:
            check_add_on_log_dir(settings, only)
        # -P: a folder named rig in the working directory must not replace rig (rig.supervision).
        argv = safe_python("rig.cli.main")
        for key, value in overrides.items():
            # node_name: an option of `up` itself, below. redis_url may hold a password, and the
            # daemon's argv stays visible in `ps` for its whole life: it travels in
            # DAEMON_REDIS_URL instead, which the daemon takes as its --redis.
            if key not in ("node_name", "redis_url"):
                argv += [f"--{key.replace('_', '-')}", str(value)]
        daemon_env = {k: v for k, v in env_overrides.items() if k != "RIG_REDIS_URL"}
        if "redis_url" in overrides:
            daemon_env[DAEMON_REDIS_URL] = str(overrides["redis_url"])
        argv += ["up"] + (["--no-flower"] if no_flower else []) + (["--no-beat"] if no_beat else [])
        argv += ["--node", node_opt] if node_opt else []
        argv += ["--no-metrics"] if no_metrics else []
        argv += ["--no-gateway"] if no_gateway else []
        for part in only:
            argv += ["--only", part]
        why_file = reason_path(settings.run_dir, settings.node_name)
        argv += ["--reason-file", str(why_file)]
        out_path = settings.rig_log_dir / "up.log"
        with open(out_path, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **daemon_env})
        ready = settings.run_dir / f"up-{settings.node_name}.ready"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                # Its own reason (up.log is shared with any other rig up of this home).
                last = daemon_reason(why_file, out_path)
                # Redis unreachable or refusing the password (5), bad configuration (6), the
                # node name owned by another rig up (10): that code.
                fail(f"rig up exited (code {proc.returncode}): {last}",
                     proc.returncode if proc.returncode in (5, 6, 10) else 7)
            if ready.exists() and ready.read_text().strip() == str(proc.pid):
                why_file.unlink(missing_ok=True)
                for line in read_notes(settings.run_dir, settings.node_name):
                    click.echo(line, err=True)  # e.g. a gpu_whitelist that leaves no usable card
                click.echo(f"rig is up on {settings.node_name} (pid {proc.pid}); logs in {settings.rig_log_dir}; "
                           "`rig down` stops it")
                for line in read_notes(settings.run_dir, settings.node_name, kind="addresses"):
                    click.echo(line)  # where Flower and /metrics listen, and where the logins are
                from rig.redis_conn import resolve_auth
                from rig.stack import redis_warnings  # no password, full, no fail-over in time...

                # With the password rig uses: a private Redis the daemon started has the home's
                # new one, which these settings (read before it existed) lack; the configured URL
                # alone warned "no password" on a Redis that has one.
                try:
                    used = resolve_auth(settings.redis_url, home=settings.home).url
                except ConfigError:
                    used = settings.redis_url
                for notice in redis_warnings(used):  # else only in up.log
                    click.echo(f"warning: {notice}", err=True)
                return
            time.sleep(0.2)
        fail(f"rig up did not become ready within 120 s; see {out_path}", 7)

    stack = Stack(settings, UpOptions(only=only, no_flower=no_flower, no_beat=no_beat, no_metrics=no_metrics,
                                      no_gateway=no_gateway,
                                      env_overrides=env_overrides), say=lossy.say)
    ready = settings.run_dir / f"up-{settings.node_name}.ready"
    wrote_ready = False
    try:
        stack.up()
        missing = stack.wait_ready()
        if [m for m in missing if m != GATEWAY]:  # the gateway's line is among the addresses
            lossy.say(f"warning: no heartbeat yet from {', '.join(m for m in missing if m != GATEWAY)}; "
                      f"see {settings.rig_log_dir}")
        lossy.say(stack.describe())
        for line in stack.addresses():
            lossy.say(line)
        lossy.say(f"rig is up on {settings.node_name}. Submit with `rig-submit --gpu-memory 4G -- CMD`; "
                  "Ctrl-C stops rig (running jobs keep running).")
        write_notes(settings.run_dir, settings.node_name, stack.take_notes())
        write_notes(settings.run_dir, settings.node_name, stack.addresses(), kind="addresses")
        ready.write_text(f"{os.getpid()}\n")
        wrote_ready = True
        stack.run_until_signalled()
    except BaseException as exc:
        write_reason(reason_file, exc)  # rig up --daemon shows this daemon's own reason
        raise
    finally:
        if wrote_ready:
            ready.unlink(missing_ok=True)
        # A refused start (rig is already up, Redis refuses) started nothing: say nothing of
        # stopping, and leave the running node's files alone.
        started = stack.started_anything()
        if started:
            lossy.say("stopping rig ...")
        stack.down()
        if started:
            lossy.say("rig stopped")
            from rig.stack import jobs_left_running, running_jobs_line

            left = jobs_left_running(settings)
            if left:
                lossy.say(running_jobs_line(left))
    if stack.lost_name:
        write_reason(reason_file, stack.lost_name)
        fail(stack.lost_name, 10)


@cli.command()
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.option("--node", "node_opt", metavar="NAME", help="The node `rig up --node NAME` started (default: hostname).")
@click.pass_context
@handle_errors
def down(ctx: click.Context, timeout: float, node_opt: str | None) -> None:
    """Stop every rig process of this node: its `rig up` and, after a crash, what it left
    (running jobs keep running)."""
    from rig.stack import stop_node

    if node_opt:
        ctx.obj["overrides"]["node_name"] = node_opt
    settings = settings_from(ctx)
    report = stop_node(settings, timeout, say=lambda m: click.echo(m, err=True))
    if report.supervisors:
        click.echo(f"rig stopped (pid {', '.join(map(str, report.supervisors))})")
    if report.leftovers:
        click.echo(f"stopped what a crashed rig up of {settings.node_name} left: {report.leftovers} "
                   "(running jobs keep running)")
    if report.running_jobs and (report.supervisors or report.leftovers):
        from rig.stack import running_jobs_line

        click.echo(running_jobs_line(report.running_jobs))
    if not report.supervisors and not report.leftovers:
        from rig.cli.daemon import not_up

        line, code = not_up(settings, named=bool(node_opt))
        if code:
            fail(line, code)
        click.echo(line)


@cli.command("forget-node")
@click.argument("name")
@click.option("--force", is_flag=True, help="Forget it even though it was only stopped (`rig down`).")
@click.pass_context
@handle_errors
def forget_node(ctx: click.Context, name: str, force: bool) -> None:
    """Forget node NAME, gone for good: its record, heartbeats and cards leave `rig status`.
    Admins only; refused while it is up or has jobs, and while it is merely stopped unless
    --force. Waiting jobs no other node could run are FAILED (unschedulable). `rig up --node
    NAME` would add it again."""
    client = client_from(ctx)
    client.ping()
    failed: dict[int, str] = {}
    cards = client.forget_node(name, force=force, failed=failed)
    removed = f"its {len(cards)} card(s) ({', '.join(cards)})" if cards else "no cards"
    click.echo(f"node {name} forgotten with {removed}")
    for job_id, reason in sorted(failed.items()):
        click.echo(f"job {job_id} FAILED: {reason}")


def main() -> None:
    cli(prog_name="rig")


cli.add_command(top)
cli.add_command(usage)
cli.add_command(recover)


if __name__ == "__main__":
    main()
