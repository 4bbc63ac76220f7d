"""``rig-submit``: queue a job.

  rig-submit --name bert --gpu-memory 12G --priority high -- python train.py --config c.yaml
  rig-submit --gpu-memory 4G --cmd "python eval.py > out.txt"
"""

from __future__ import annotations

import sys

import click
import redis

from rig.cli.common import RigCommand, client_from, handle_errors, no_node_note, parse_env_items
from rig.errors import InvalidInput, RigError, SubmitInterrupted
from rig.memory import format_memory
from rig.models import JobState
from rig.text import clean
from rig.waiting import worth_saying


def submit_options(fn):  # noqa: ANN001, ANN201
    opts = [
        click.option("--name", "-n", help="A name to find the job by (default: the program's name)."),
        click.option("--gpu-memory", "-m", "gpu_memory", metavar="SIZE",
                     help="GPU memory the job needs on each card, e.g. 12G, 512M (binary units); "
                          "'auto' = measured peak of your earlier runs with the same --name x margin."),
        click.option("--gpus", "-g", type=int, default=1, show_default=True,
                     help="Number of cards (all on one server, all given at once)."),
        click.option("--priority", "-p", metavar="high|medium|low",
                     help="Strict priority; default from config (medium)."),
        click.option("--cmd", "-c", "cmd", metavar="TEXT", help="The command as one shell string."),
        click.option("--workdir", "-w", type=click.Path(file_okay=False),
                     help="Working directory (default: command_workdir, else the current one)."),
        click.option("--env", "-e", "env", multiple=True, metavar="NAME[=VALUE]",
                     help="Environment variable for the job (repeatable); NAME alone passes your "
                          "current value. CUDA_VISIBLE_DEVICES, USER, LOGNAME and RIG_* are rig's."),
        click.option("--export", "export", metavar="ALL|NONE|NAME,...",
                     help="Which of your environment variables the job gets (as Slurm's --export): ALL "
                          "(default; not rig's own, CUDA_VISIBLE_DEVICES or your login session's), NONE, "
                          "or the names listed. --env adds to it. Only you, admins and the job read the values."),
        click.option("--retries", type=int, metavar="N",
                     help="Retries after a failed attempt before the error queue (default: max_retries)."),
        click.option("--time-limit", "time_limit", metavar="DURATION",
                     help="Stop the job after this much running time (90s, 30m, 2h; a bare number is seconds, "
                          "as it always was): it ends TIMEOUT. 'none': no limit, not even a template's."),
        # A pair, so a template's oom_retry_grow = true (finetune's) can be said no to: "flags
        # win" had no flag for no.
        click.option("--oom-retry-grow/--no-oom-retry-grow", "oom_retry_grow", default=None,
                     help="After a CUDA out-of-memory, retry with a larger declaration (default: the "
                          "template's, else no)."),
        click.option("--template", "-t", metavar="NAME",
                     help="A preset from the config (finetune, inference, test, ...): `rig templates`."),
        click.option("--pool", metavar="NAME",
                     help="Run only on the cards of this pool ([pools] in the config; `rig status --pool`)."),
        click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code."),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


@handle_errors
def do_submit(ctx: click.Context, name, gpu_memory, gpus, priority, cmd, workdir, env, wait, command,  # noqa: ANN001
              retries=None, time_limit=None, oom_retry_grow=None, template=None, pool=None,
              export=None) -> None:
    if cmd is not None and command:  # --cmd '' too: not dropped in silence for the one after --
        raise InvalidInput("give the command either after `--` or with --cmd, not both")
    if gpu_memory is None and template is None:
        raise InvalidInput("--gpu-memory is required: how much GPU memory the job needs, e.g. 12G")
    client = client_from(ctx)
    try:
        handle = client.submit(
            cmd if cmd else list(command), gpu_memory=gpu_memory, gpus=gpus, priority=priority,
            name=name, workdir=workdir, env=parse_env_items(env), retries=retries,
            time_limit=time_limit, oom_retry_grow=oom_retry_grow, template=template, pool=pool,
            export=export,
        )
    except SubmitInterrupted as stopped:
        # Ctrl-C after the job was stored: it is queued and will run. Say its id (stdout, as
        # always) and how to stop it.
        (job_id,) = stopped.job_ids
        click.echo(job_id)
        click.echo(f"job {job_id} was submitted before the interrupt and will run; `rig kill {job_id}` stops it",
                   err=True)
        sys.exit(130)
    job = handle._job
    try:
        click.echo(handle.id)
        for note in (client.last_auto_note, client.last_durability_note):
            if note:
                click.echo(note, err=True)
        # Per card, as --gpu-memory is and as a wait says it ("on each of 2 cards"): "40.0 GiB on
        # 2 cards" read as 40 GiB in all.
        cards = "1 card" if job.gpus == 1 else f"each of {job.gpus} cards"
        click.echo(f"submitted job {job.id} '{clean(job.name)}': {format_memory(job.gpu_memory)} on {cards}, "
                   f"{job.priority.value} priority" + (f", pool {clean(job.pool)}" if job.pool else ""), err=True)
        _say_why_waiting(client, job.id)
        if wait:
            _wait(client, job.id, job.instance)
    except KeyboardInterrupt:
        # Whenever Ctrl-C comes once the job is stored (explaining its wait, or waiting for
        # it), the job is not stopped: say so, and how to stop it (exit 130, as a shell does).
        click.echo("", err=True)
        click.echo(interrupted_line(client, job.id), err=True)
        sys.exit(130)


def _say_why_waiting(client, job_id: int) -> None:  # noqa: ANN001
    """One stderr line when the job cannot start at once (no node up, no dispatcher, no room):
    the same explanation as `rig show` (rig.waiting), once the dispatcher had its chance to
    take the job (rig.waiting.first_look: a stopped dispatcher's lock lingers). Nothing when it
    is placed or about to be."""
    try:
        why = client.first_look(job_id)
    except (RigError, redis.RedisError):
        return  # the job is submitted; an explanation that cannot be read is not an error
    if worth_saying(why):
        click.echo(f"job {job_id} waits: {clean(why)}", err=True)
        try:
            note = no_node_note(client)
        except redis.RedisError:
            return
        if note:
            click.echo(note, err=True)


def _wait(client, job_id: int, instance: str | None = None) -> None:  # noqa: ANN001
    """--wait: follow the job to its end and exit with its code. Ctrl-C stops the waiting, not
    the job: say so, and how to stop it, then exit 130 (as a shell does for SIGINT)."""
    def show(job) -> None:  # noqa: ANN001
        click.echo(wait_line(job), err=True)

    # Ctrl-C: do_submit says what it means. A Redis blip is ridden out (rig.reconnect).
    final = client.wait(job_id, on_change=show, instance=instance, say=lambda line: click.echo(line, err=True))
    click.echo(f"job {final.id} {final.state.value}: {clean(final.reason or '')}".rstrip(": "), err=True)
    if final.state is JobState.SUCCEEDED:
        sys.exit(0)
    if final.state is JobState.TIMEOUT:
        sys.exit(124)  # as timeout(1) does
    sys.exit(final.exit_code if final.exit_code not in (None, 0) else 1)


def wait_line(job) -> str:  # noqa: ANN001 - rig.models.Job
    """One --wait line for a change of ``job``'s state. A job waiting or placed again after a
    failed attempt is at its next attempt (``job.attempt`` counts those started): "pending
    (attempt 2)" was said while attempt 3 waited."""
    where = f" on {clean(job.node)}/{','.join(map(str, job.cards))}" if job.node else ""
    number = job.attempt + (1 if job.state in (JobState.PENDING, JobState.ASSIGNED) else 0)
    attempt = f" (attempt {number})" if number > 1 else ""
    return f"job {job.id}: {job.state.value.lower()}{where}{attempt}"


def interrupted_line(client, job_id: int) -> str:  # noqa: ANN001
    """What `rig-submit --wait` says when Ctrl-C stops the waiting: the job is not stopped."""
    kill = f"`rig kill {job_id}` stops it"
    try:
        job = client.get(job_id)
    except (RigError, redis.RedisError, OSError):
        return f"job {job_id} keeps running (rig-submit only stopped waiting); {kill}"
    if job.state.terminal:
        return f"job {job_id} had already ended ({job.state.value}); `rig show {job_id}` says how"
    if job.state is JobState.PENDING:
        return f"job {job_id} stays queued (rig-submit only stopped waiting); {kill}"
    return f"job {job_id} keeps running (rig-submit only stopped waiting); {kill}"


@click.command(cls=RigCommand, context_settings={"help_option_names": ["-h", "--help"]})
@submit_options
@click.pass_context
def main(ctx: click.Context, **kwargs) -> None:  # noqa: ANN003
    """Queue COMMAND to run on a GPU with enough free memory. Prints the job id."""
    ctx.ensure_object(dict)
    do_submit(ctx, **kwargs)


if __name__ == "__main__":
    main()
