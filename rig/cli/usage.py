"""``rig usage``: accounting of finished jobs (rig.accounting), archived or not, like sreport."""

from __future__ import annotations

import csv
import dataclasses
import io
import sys

import click

from rig.accounting import GROUPS, UsageLine
from rig.cli import as_json as J
from rig.cli.common import client_from, handle_errors
from rig.cli.fit import Col, fitted_table
from rig.cli.render import make_console
from rig.clock import shared_now
from rig.durations import parse_duration
from rig.words import typed_word

USAGE_COLUMNS = (
    Col("key", "?", shrink="middle", min_width=8, want=12, max_width=32),
    Col("jobs", "jobs", justify="right"),
    Col("card_h", "card-h", justify="right"),
    Col("reserved", "rsv GiB-h", drop=3, justify="right"),
    Col("used", "used GiB-h", drop=5, justify="right"),
    Col("wait", "wait", drop=2, justify="right"),
    Col("cancelled", "cancelled", drop=1, justify="right"),
    Col("failures", "failures", drop=4, shrink="end", min_width=10),
)
CAPTION = ("card-h: cards held x hours run; GiB-h: GiB per card, declared (rsv) or measured mean (used), "
           "x cards x hours; wait: mean submission -> first start; cancelled: by a person, never failures; "
           "failures: jobs per failure class")
#: The fields of a line in --csv, in order (failures as "class=n;class=n").
CSV_FIELDS = ("key", "jobs", "failed", "cancelled", "card_hours", "reserved_gib_hours", "used_gib_hours",
              "mean_wait_seconds", "failures")


@click.command()
@click.option("--since", default="7d", show_default=True, metavar="DURATION",
              help="Jobs that ended this long ago or later (90m, 12h, 30d), or 'all'.")
@click.option("--by", type=click.Choice(GROUPS), default="user", show_default=True, help="One line per this.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--csv", "as_csv", is_flag=True,
              help="Print CSV for spreadsheets; the last row, its first cell empty, is the total.")
@click.pass_context
@handle_errors
def usage(ctx: click.Context, since: str, by: str, as_json: bool, as_csv: bool) -> None:
    """GPU time finished jobs reserved and used, jobs, failures by class and mean wait, per
    user (or name, template, pool, node), archived jobs included. card-h: cards held x hours
    run; GiB-h rsv: declared GiB per card x cards x hours; GiB-h used: measured mean."""
    if as_json and as_csv:
        raise click.UsageError("give one of --json and --csv")
    client = client_from(ctx)
    client.ping()
    start = since_time(since)
    lines, whole, partial = _usage(client, start, by)
    if as_json:
        click.echo(J.dumps({"since": start, "by": by, "lines": [_plain(ln) for ln in lines], "total": _plain(whole)}))
        return
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow((by, *CSV_FIELDS[1:]))
        for line in lines:
            writer.writerow(_csv_row(line))
        # The total's first cell is empty, a value no group has (rig.accounting.group_value): a
        # user or job named "total" stays apart from it.
        writer.writerow(("", *_csv_row(whole)[1:]))
        sys.stdout.write(out.getvalue())
        return
    console = make_console()
    if not lines:
        click.echo("no finished job" if start is None else f"no job ended in the last {since}", err=True)
        return
    window = "all finished jobs" if start is None else f"jobs that ended in the last {since}"
    if partial:  # the archive was not read: the title must not claim all of them (a tester's)
        window += " that Redis holds (the archive was not read: see above)"
    cols = [dataclasses.replace(USAGE_COLUMNS[0], header=by), *USAGE_COLUMNS[1:]]
    rows = [_cells(line) for line in [*lines, whole]]
    console.print(fitted_table(cols, rows, console.width, title=f"usage of {window}",
                               title_justify="left", caption=CAPTION, caption_justify="left"))


def _usage(client, since: float | None, by: str) -> tuple[list[UsageLine], UsageLine, bool]:  # noqa: ANN001
    """The lines and total (Client.usage: the archive's per-day sums, rig.history), and
    whether they lack the archive (its warning said on stderr); a gateway client asks its
    node, whose Client.usage answers."""
    from rig.client import Client
    from rig.history import archive_warning

    lines, whole = client.usage(since=since, by=by)
    warning = archive_warning(client, "the totals cover only the finished jobs Redis holds")
    if warning:
        click.echo(warning, err=True)  # exit 0 all the same: README, rig usage
    if not isinstance(client, Client):
        return lines, whole, bool(warning)
    built = client.history.archive_rollup_built()
    if built is not None:
        click.echo(f"archive: summed {built[0]:,} job(s) archived by an older rig per day for rig usage, once "
                   f"({built[1]:.1f} s)", err=True)
    return lines, whole, bool(warning)


def since_time(text: str) -> float | None:
    """The epoch time ``--since DURATION`` means: that long before now (the shared clock, as
    ``client.ping()`` measured it; rig.clock); None for ``all`` (every finished job)."""
    if typed_word(text) == "all":
        return None
    return shared_now() - parse_duration(text, what="--since", unit_required=True)


def _plain(line: UsageLine) -> dict:
    return {**dataclasses.asdict(line), "failed": line.failed}


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _wait(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def _failures(line: UsageLine) -> str:
    return " ".join(f"{name}={n}" for name, n in line.failures.items()) or "-"


def _cells(line: UsageLine) -> dict[str, str]:
    return {"key": line.key, "jobs": f"{line.jobs:,}", "card_h": _hours(line.card_hours),
            "reserved": _hours(line.reserved_gib_hours), "used": _hours(line.used_gib_hours),
            "wait": _wait(line.mean_wait_seconds), "cancelled": f"{line.cancelled:,}", "failures": _failures(line)}


#: What a spreadsheet takes as the start of a formula in a cell (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """A user's text (a job's name, template, user) as a CSV cell a spreadsheet shows as text:
    one starting like a formula gets a leading ' (a job named `=HYPERLINK(...)` must not run
    when the accounting is opened)."""
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def _csv_row(line: UsageLine) -> tuple:
    def num(value: float | None) -> str:
        return "" if value is None else f"{value:.4f}"

    return (csv_text(line.key), line.jobs, line.failed, line.cancelled, num(line.card_hours), num(line.reserved_gib_hours),
            num(line.used_gib_hours), num(line.mean_wait_seconds),
            ";".join(f"{k}={v}" for k, v in line.failures.items()))
