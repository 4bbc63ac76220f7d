"""``rig recover``: what to do when this node's Redis lost its data or another answers."""

from __future__ import annotations

import click

from rig.cli.common import handle_errors, settings_from


@click.command("recover")
@click.option("--node", metavar="NAME", help="This server's node name (default: node_name).")
@click.option("--stop", "stop", is_flag=True,
              help="Stop the old installation's jobs still running here, then join this Redis.")
@click.pass_context
@handle_errors
def recover(ctx: click.Context, node: str | None, stop: bool) -> None:
    """When Redis is not the installation this node joined (it came back empty, or another
    Redis answers), the node freezes: its jobs run on, nothing is concluded or killed, its
    cards take no jobs. Without --stop this says what was found; with --stop their
    processes are stopped (logs stay on disk) and the node joins the Redis that answers now."""
    from workers import recovery

    settings = settings_from(ctx)
    if node:
        settings.node_name = node
    found = recovery.inspect(settings)
    verdict = found.verdict
    if not verdict.mismatch:
        click.echo(f"node {settings.node_name}: this Redis holds the installation it joined "
                   f"({verdict.found or 'new'}); nothing to recover")
        return
    jobs = sorted({p.job_id for p in found.running.values()})
    click.echo(f"{verdict.explain(settings.node_name)}; jobs of it running here: "
               f"{', '.join(map(str, jobs)) or 'none'}")
    if not stop:
        click.echo("`rig recover --stop` stops them (their logs stay in log_dir) and joins this Redis; "
                   "until then they run on and this node's cards take no jobs", err=True)
        ctx.exit(1)
    done = recovery.stop_and_join(settings, click.echo)
    click.echo(f"node {settings.node_name}: stopped {len(done.stopped)} job(s); joined installation "
               f"{done.joined}; its cards take jobs again")
