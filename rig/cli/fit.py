"""Tables that fit the screen: drop the least needed columns until every remaining column's
minimum width (its heading and longest word) fits, so Rich never cuts a heading ("mod…") or a
state name ("RUNN…") short (issue 11 follow-up: `rig status` / `rig jobs` at 80 columns).
What a dropped column said is either in another column or in the lines under the table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

#: Measured on a screen this wide: a table's natural minimum, not squeezed to the real one.
_WIDE = 10_000


def fit_table(console: Console, build: Callable[[Sequence[str]], Table], columns: Sequence[str],
              drop_order: Sequence[str]) -> Table:
    """``build(shown)`` with all ``columns``, less the first of ``drop_order`` (then the next
    ...) while the table's minimum width exceeds ``console.width``. Returns the last tried."""
    shown = list(columns)
    table = build(shown)
    for name in drop_order:
        if _minimum(console, table) <= console.width:
            break
        if name in shown:
            shown.remove(name)
            table = build(shown)
    return table


def fits(console: Console, table: Table) -> bool:
    """Does ``table`` show every heading and word whole on ``console``?"""
    return _minimum(console, table) <= console.width


def _minimum(console: Console, table: Table) -> int:
    return Measurement.get(console, console.options.update_width(_WIDE), table).minimum
