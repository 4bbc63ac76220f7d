"""Tables that fit the screen: one rule, one place (issue 14, item 4).

Each table declares its columns (:class:`Col`): a heading, a ``drop`` rank (the column with the
lowest rank goes first when the screen is too narrow; ``None``: never dropped), a least width
and how its cells may shrink:

- ``"middle"``: names; shortened in the middle so the end stays visible
  (``sweep-l…-seed-11``): twelve runs of a sweep never look alike;
- ``"end"``: free text (reasons); cut at the end with an ellipsis;
- ``None``: never cut (states, numbers, ids). Such a column is always as wide as its longest
  cell and its heading, so a heading ("reserved") or a state ("SUCCEEDED") is always whole.

:func:`fit_widths` lays the columns out for a width: it drops columns in ``drop`` order until
every remaining column's least width fits, then gives what is left to the shrinkable columns, up
to what they need. :func:`fitted_table` builds the rich Table with those widths; no cell ever
wraps (a cell with several lines, e.g. one running job a line, keeps its lines). Every text goes
through ``rig.text.clean`` here (control characters shown as escapes), and cells are rich
``Text``, never markup, so a job named ``[bold]x[/]`` shows as typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from rig.text import clean

#: Measured on a screen this wide: a table's natural minimum, not squeezed to the real one.
ELLIPSIS = "…"
#: Where a name is best cut: just before one of these, so the kept end starts at a word.
_SEPARATORS = "-_./:@ "


# -- shortening -----------------------------------------------------------------------------
def _take(text: str, width: int) -> str:
    """The longest start of ``text`` at most ``width`` cells wide."""
    out, used = [], 0
    for ch in text:
        w = cell_len(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out)


def _take_end(text: str, width: int) -> str:
    """The longest end of ``text`` at most ``width`` cells wide."""
    return _take(text[::-1], width)[::-1]


def shorten_end(text: str, width: int) -> str:
    """``text`` cut at the end with "…" to at most ``width`` cells."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return _take(ELLIPSIS, width)
    return _take(text, width - 1) + ELLIPSIS


def shorten_middle(text: str, width: int) -> str:
    """``text`` at most ``width`` cells wide, shortened in the middle: ``sweep-l…-seed-11``.
    The kept end starts at a separator (``-_./:@`` or a space) when one lies within the last
    two thirds of the room, else it is half the room (the longer half)."""
    if cell_len(text) <= width:
        return text
    if width <= 4:
        return shorten_end(text, width)
    room = width - 1
    tail = ""
    for i in range(len(text) - 1, 0, -1):  # the longest separator-led end within 2/3 of the room
        if text[i] in _SEPARATORS:
            end = text[i:]
            if cell_len(end) > room * 2 // 3:
                break
            tail = end
    if cell_len(tail) < 2:
        tail = _take_end(text, room - room // 2)
    head = _take(text, room - cell_len(tail))
    return head + ELLIPSIS + tail


# -- columns and cells ----------------------------------------------------------------------
@dataclass
class Col:
    """One column of a fitted table (see the module doc)."""

    key: str
    header: str
    drop: int | None = None  # lowest goes first on a narrow screen; None: never dropped
    shrink: str | None = None  # "middle", "end" or None (never cut)
    min_width: int = 0  # the least a shrinkable column gets (its heading is never cut)
    #: What it should get before other columns are kept (default: min_width). Columns are
    #: dropped rather than shrink a name below this; only on a screen too narrow for that do
    #: the names shrink further, to min_width.
    want: int | None = None
    max_width: int | None = None  # the most it ever takes, however wide the screen
    justify: str = "left"


@dataclass
class Cell:
    """A cell: one or more lines of job-supplied (raw) text, cleaned here; ``style`` for all
    of it; ``suffix`` (rig's own words, e.g. ``OVER``) kept whole after each shortened line."""

    lines: Sequence[str] | str
    style: str = ""
    suffix: str = ""
    suffix_style: str = ""
    line_styles: Sequence[str] = field(default_factory=tuple)
    #: Per line, instead of ``suffix``: e.g. one running job a line, only some over their memory.
    line_suffixes: Sequence[str] = field(default_factory=tuple)

    def suffix_of(self, i: int) -> str:
        return self.line_suffixes[i] if i < len(self.line_suffixes) else self.suffix

    def texts(self) -> list[str]:
        lines = [self.lines] if isinstance(self.lines, str) else list(self.lines)
        return [clean(line) for line in lines] or [""]


Row = Mapping[str, "str | Cell"]


def _cell(value: str | Cell) -> Cell:
    return value if isinstance(value, Cell) else Cell(value)


def _natural(col: Col, rows: Sequence[Row]) -> int:
    """What the column needs to show every cell and its heading whole."""
    width = cell_len(col.header)
    for row in rows:
        cell = _cell(row.get(col.key, ""))
        for i, line in enumerate(cell.texts()):
            width = max(width, cell_len(line) + cell_len(cell.suffix_of(i)))
    return width if col.max_width is None else min(width, max(col.max_width, cell_len(col.header)))


def _least(col: Col, natural: int, comfortable: bool = False) -> int:
    if col.shrink is None:
        return natural
    least = col.want if comfortable and col.want is not None else col.min_width
    return min(natural, max(least, cell_len(col.header)))


#: What a rich Table of n columns adds to its cells' widths: a border each side of every
#: column and one space of padding each side of every cell (the default box and padding).
def table_overhead(n: int) -> int:
    return 3 * n + 1


def fit_widths(cols: Sequence[Col], rows: Sequence[Row], width: int) -> list[tuple[Col, int]]:
    """The columns kept at ``width`` and each one's width (see the module doc)."""
    natural = {c.key: _natural(c, rows) for c in cols}
    droppable = sorted((c for c in cols if c.drop is not None), key=lambda c: c.drop)

    def least_total(columns: Sequence[Col], comfortable: bool) -> int:
        return sum(_least(c, natural[c.key], comfortable) for c in columns) + table_overhead(len(columns))

    # First with every name at its comfortable width (columns go rather than names shrink);
    # on a screen too narrow even for that, again with names at their least.
    for comfortable in (True, False):
        kept = list(cols)
        for col in droppable:
            if least_total(kept, comfortable) <= width:
                break
            kept.remove(col)
        if least_total(kept, comfortable) <= width:
            break
    widths = {c.key: _least(c, natural[c.key]) for c in kept}
    spare = width - sum(widths.values()) - table_overhead(len(kept))
    # What is left goes to the shrinkable columns, a cell at a time, to the neediest first.
    growing = [c for c in kept if widths[c.key] < natural[c.key]]
    while spare > 0 and growing:
        share = max(1, spare // len(growing))
        for col in list(growing):
            give = min(share, natural[col.key] - widths[col.key], spare)
            widths[col.key] += give
            spare -= give
            if widths[col.key] >= natural[col.key]:
                growing.remove(col)
            if spare <= 0:
                break
    return [(c, widths[c.key]) for c in kept]


def _render_cell(col: Col, cell: Cell, width: int) -> Text:
    out = Text(style=cell.style)
    for i, line in enumerate(cell.texts()):
        suffix = cell.suffix_of(i)
        room = width - cell_len(suffix)
        if i:
            out.append("\n")
        if col.shrink == "middle":
            line = shorten_middle(line, room)
        elif col.shrink == "end":
            line = shorten_end(line, room)
        style = cell.line_styles[i] if i < len(cell.line_styles) else ""
        out.append(line, style=style)
        if suffix:
            out.append(suffix, style=cell.suffix_style)
    return out


def fitted_table(cols: Sequence[Col], rows: Sequence[Row], width: int, **table_options: object) -> Table:
    """A rich Table of ``rows`` that fits ``width`` (columns dropped and cells shortened by
    :func:`fit_widths`); ``table_options`` go to Table (title, caption...)."""
    laid = fit_widths(cols, rows, width)
    table = Table(**table_options)  # type: ignore[arg-type]
    for col, w in laid:
        table.add_column(col.header, justify=col.justify, width=w, min_width=w, max_width=w,  # type: ignore[arg-type]
                         no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*(_render_cell(col, _cell(row.get(col.key, "")), w) for col, w in laid))
    return table

