"""``rig recover``: what to do when this node's Redis lost its data or another answers."""

from __future__ import annotations

import click

from rig.cli.common import fail, handle_errors, settings_from


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
    from rig.cli.daemon import another_home_node
    from workers import recovery

    settings = settings_from(ctx)
    if node:
        settings.node_name = node
    # No --node: the default name may not be the node this home runs (`rig up --node a`). A
    # name given is checked by recovery.inspect against its owner (another home, host).
    other = None if node else another_home_node(settings, named=False, command="recover")
    if other:
        fail(other, 2)
    found = recovery.inspect(settings)
    verdict = found.verdict
    if not found.needed:
        click.echo(f"node {settings.node_name}: this Redis holds the installation it joined "
                   f"({verdict.found or 'new'}) and a record of every job running here; nothing to recover")
        cleared = recovery.clear_unrecorded(settings)  # an ending Redis lost: seen, so cleared
        if cleared:
            click.echo(f"cleared the alert: {cleared}")
        return
    listing = ", ".join(f"{p.job_id} (instance {p.instance or '?'})"
                        for p in sorted(found.running.values(), key=lambda p: p.job_id)) or "none"
    if verdict.mismatch:
        click.echo(f"{verdict.explain(settings.node_name)}; jobs of another installation running here: {listing}")
    else:
        click.echo(f"node {settings.node_name}: this Redis has no record of jobs running here: {listing} "
                   "(its data was rolled back to an older copy, or lost)")
    if not stop:
        click.echo("if RIG_REDIS_URL / --redis points at the wrong Redis, use the right one; else "
                   "`rig recover --stop` stops these jobs (their logs stay in log_dir)"
                   + (" and joins this Redis" if verdict.mismatch else "")
                   + "; until then they run on" + (" and this node's cards take no jobs" if verdict.mismatch else ""),
                   err=True)
        ctx.exit(1)
    done = recovery.stop_and_join(settings, click.echo)
    joined = f"; joined installation {done.joined}" if done.joined else ""
    cards = ("; its cards take jobs again" if done.registered
             else "; its cards take jobs once `rig up` runs here" if done.joined else "")
    click.echo(f"node {settings.node_name}: stopped {len(done.stopped)} job(s){joined}{cards}")
