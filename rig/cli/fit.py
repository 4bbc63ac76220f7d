"""Tables that fit the screen: one rule, one place (issue 14, item 4).

Each table declares its columns (:class:`Col`): a heading, a ``drop`` rank (the column with the
lowest rank goes first when the screen is too narrow; ``None``: never dropped), a least width
and how its cells may shrink:

- ``"middle"``: names; shortened column by column (:func:`shorten_names`): what a name shares
  with its neighbours (``sweep-``, ``rigdemo-``) goes first, then the middle, so the end stays
  visible (``…lr0.0003-seed-12`` / ``…lr0.001-seed-13``): the runs of a sweep never look alike;
- ``"end"``: free text (reasons); cut at the end with an ellipsis;
- ``None``: never cut (states, numbers, ids). Such a column is always as wide as its longest
  cell and its heading, so a heading ("reserved") or a state ("SUCCEEDED") is always whole.

:func:`fit_widths` lays the columns out for a width: it drops columns in ``drop`` order until
every remaining column's least width fits, then gives what is left to the shrinkable columns:
up to what they need (when some columns grow first, e.g. reasons: every column up to its
``want``, then those, then all). :func:`fitted_table` builds the rich Table with those widths; no cell ever
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
#: How many more characters a group's cut may take to end at a separator ("…alice", not "…o-alice").
_SNAP = 4


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


def _first_token(text: str) -> str:
    """``text`` up to its first separator ("sweep" of ``sweep-lr0.001-seed-11``); "" if none."""
    for i, ch in enumerate(text):
        if ch in _SEPARATORS:
            return text[:i]
    return ""


def _last_token(text: str) -> str:
    """``text`` from its last separator on ("11" of ``sweep-lr0.001-seed-11``); "" if none."""
    for i in range(len(text) - 1, -1, -1):
        if text[i] in _SEPARATORS:
            return text[i + 1:]
    return ""


def _common_prefix(texts: Sequence[str]) -> int:
    """How many characters all ``texts`` share at the start."""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return n


def _common_suffix(texts: Sequence[str]) -> int:
    return _common_prefix([t[::-1] for t in texts])


def _to_separator(text: str, n: int) -> int:
    """``n`` or less: the shared start ends just after a separator ("sweep-lr0." of
    ``sweep-lr0.001`` and ``sweep-lr0.0003``; "…-seed-" of ``seed-1`` and ``seed-12``, whose "1"
    is not the same token)."""
    while n > 0 and text[n - 1] not in _SEPARATORS:
        n -= 1
    return n


def _shared_parts(texts: Sequence[str]) -> dict[str, tuple[int, int]]:
    """For each distinct text, how many characters at its start and at its end it shares with
    its group: the other texts with the same first token (a sweep: ``sweep-…``, users:
    ``rigdemo-…``), or, when none has it, the other texts with the same last token (names that
    differ only at the start). Those characters tell nothing apart, so they go first. The two
    parts never overlap and leave at least one character of the text."""
    distinct = sorted(set(texts))
    by_first: dict[str, list[str]] = {}
    by_last: dict[str, list[str]] = {}
    for text in distinct:
        by_first.setdefault(_first_token(text), []).append(text)
        by_last.setdefault(_last_token(text), []).append(text)
    common: dict[tuple[str, str], tuple[int, int]] = {}  # per group, computed once (a 1,000-run sweep)
    shared: dict[str, tuple[int, int]] = {}
    for text in distinct:
        key = ("first", _first_token(text))
        group = by_first[key[1]] if key[1] else []
        if len(group) < 2:
            key = ("last", _last_token(text))
            group = by_last[key[1]] if key[1] else []
        if len(group) < 2:
            shared[text] = (0, 0)
            continue
        if key not in common:
            common[key] = (_common_prefix(group), _common_suffix(group))
        start, end = common[key]
        prefix = _to_separator(text, min(start, len(text) - 1))
        shared[text] = (prefix, min(end, len(text) - 1 - prefix))
    return shared


def _drop_start(text: str, most: int, width: int) -> int:
    """How many characters (at most ``most``) must go from the start of ``text`` so that
    "…" and the rest fit ``width`` cells."""
    n = 0
    while n < most and cell_len(text[n:]) + 1 > width:
        n += 1
    return n


def shorten_names(texts: Sequence[str], width: int | Sequence[int]) -> list[str]:
    """The names of one column, each at most ``width`` cells (one width, or one per text),
    shortened so that they stay apart: the part a name shares with its group (see
    :func:`_shared_parts`) goes first, from the start (``…lr0.0003-seed-12`` /
    ``…lr0.001-seed-13``; ``…alice`` / ``…bob``), then from the end (``a-long…`` /
    ``b-long…``); only what still does not fit is shortened in the middle
    (:func:`shorten_middle`). A group's names lose the same characters at the start, so they
    line up, just after a separator of their shared start when there is one. A name that
    fits stays whole. Every table that shortens names uses this."""
    widths = [width] * len(texts) if isinstance(width, int) else list(width)
    shared = _shared_parts(texts)
    # The same cut at the start for a whole group: the most that any of its long names needs.
    group_cut: dict[tuple[str, int], int] = {}
    for text, w in zip(texts, widths, strict=True):
        if w > 4 and cell_len(text) > w:
            prefix = shared[text][0]
            key = (text[:prefix], prefix)
            group_cut[key] = max(group_cut.get(key, 0), _drop_start(text, prefix, w))
    for (head, prefix), cut in group_cut.items():
        # Cut just after a separator of the shared start when there is one: "…alice", not "…o-alice".
        if not cut or head[cut - 1] in _SEPARATORS:
            continue
        sep = next((i for i in range(cut, min(prefix, cut + _SNAP)) if head[i] in _SEPARATORS), None)
        if sep is not None:
            group_cut[(head, prefix)] = sep + 1
    out = []
    for text, w in zip(texts, widths, strict=True):
        if cell_len(text) <= w:
            out.append(text)
            continue
        if w <= 4:
            out.append(shorten_end(text, w))
            continue
        prefix, suffix = shared[text]
        cut = group_cut[(text[:prefix], prefix)]
        head = ELLIPSIS if cut else ""
        core = text[cut:]
        if cell_len(head + core) > w and suffix:
            keep = len(core) - suffix  # drop from the shared end, as little as fits
            while keep < len(core) and cell_len(head + core[:keep + 1]) + 1 <= w:
                keep += 1
            core, tail = core[:keep], ELLIPSIS
        else:
            tail = ""
        room = w - cell_len(head) - cell_len(tail)
        out.append(head + (shorten_middle(core, room) if room > 4 else shorten_end(core, room)) + tail)
    return out


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
    #: Grows to this many cells (or what it needs, if less) once every column has its ``want``,
    #: before the others grow further (a reason: on a wide screen it is read before the names
    #: are whole). None: grows with the others.
    first_to: int | None = None
    #: To be ``first_to`` wide, this column pushes out the columns whose ``drop`` is lower than
    #: this (None: none); with less room it is cut instead.
    first_over: int | None = None
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
    #: Per line, kept whole before it (rig's own words, e.g. a job's ``12:`` before its name, so
    #: that names are shortened among names).
    line_prefixes: Sequence[str] = field(default_factory=tuple)

    def prefix_of(self, i: int) -> str:
        return self.line_prefixes[i] if i < len(self.line_prefixes) else ""

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
            width = max(width, cell_len(cell.prefix_of(i)) + cell_len(line) + cell_len(cell.suffix_of(i)))
    return width if col.max_width is None else min(width, max(col.max_width, cell_len(col.header)))


def _least(col: Col, natural: int, phase: str = "least") -> int:
    """The least width of ``col`` in a layout phase: ``"roomy"`` (a column that grows first at
    its ``first_to``, names at their ``want``), ``"comfortable"`` (at their ``want``) or
    ``"least"`` (at their ``min_width``)."""
    if col.shrink is None:
        return natural
    least = col.min_width
    if phase != "least" and col.want is not None:
        least = col.want
    if phase == "roomy" and col.first_to is not None:
        least = max(least, col.first_to)
    return min(natural, max(least, cell_len(col.header)))


#: What a rich Table of n columns adds to its cells' widths: a border each side of every
#: column and one space of padding each side of every cell (the default box and padding).
def table_overhead(n: int) -> int:
    return 3 * n + 1


def fit_widths(cols: Sequence[Col], rows: Sequence[Row], width: int) -> list[tuple[Col, int]]:
    """The columns kept at ``width`` and each one's width (see the module doc)."""
    natural = {c.key: _natural(c, rows) for c in cols}
    droppable = sorted((c for c in cols if c.drop is not None), key=lambda c: c.drop)

    def least_total(columns: Sequence[Col], phase: str) -> int:
        return sum(_least(c, natural[c.key], phase) for c in columns) + table_overhead(len(columns))

    # First with what grows first (a reason) at its first_to, pushing out only the columns
    # ranked below its first_over; then with every name at its comfortable width (columns go
    # rather than names shrink); on a screen too narrow even for that, with names at their least.
    roomy = [c for c in cols if c.first_to is not None]
    below = min((c.first_over for c in roomy), default=None)
    phases = (["roomy"] if roomy else []) + ["comfortable", "least"]
    for phase in phases:
        kept = list(cols)
        if phase != "roomy" and below is not None:
            # The roomy layout did not fit: what grows first will be cut, so the columns ranked
            # below its first_over go before it is (at 160 columns a waiting job's reason read 25
            # cells beside age, exit, gpus and runtime; at 180, 65 without them).
            kept = [c for c in kept if c.drop is None or c.drop >= below]
        for col in droppable:
            if col not in kept:
                continue
            if least_total(kept, phase) <= width:
                break
            if phase == "roomy" and (below is None or col.drop >= below):  # type: ignore[operator]
                break
            kept.remove(col)
        if least_total(kept, phase) <= width:
            break
    widths = {c.key: _least(c, natural[c.key]) for c in kept}
    spare = width - sum(widths.values()) - table_overhead(len(kept))
    # What is left goes to the shrinkable columns, a cell at a time, to the neediest first;
    # when some grow first: every column up to its want, then those, then the rest.
    def grow(columns: Sequence[Col], cap: Mapping[str, int]) -> None:
        nonlocal spare
        growing = [c for c in columns if widths[c.key] < cap[c.key]]
        while spare > 0 and growing:
            share = max(1, spare // len(growing))
            for col in list(growing):
                give = min(share, cap[col.key] - widths[col.key], spare)
                widths[col.key] += give
                spare -= give
                if widths[col.key] >= cap[col.key]:
                    growing.remove(col)
                if spare <= 0:
                    break

    first = [c for c in kept if c.first_to is not None]
    if first:
        grow(kept, {c.key: min(natural[c.key], max(c.want or 0, widths[c.key])) for c in kept})
        grow(first, {c.key: min(natural[c.key], max(c.first_to or 0, widths[c.key])) for c in first})
    grow(kept, natural)
    return [(c, widths[c.key]) for c in kept]


def _render_cell(col: Col, cell: Cell, width: int, names: Sequence[str] | None = None) -> Text:
    """``names``: the cell's lines already shortened with the rest of its column
    (:func:`shorten_names`), for a ``"middle"`` column."""
    out = Text(style=cell.style)
    for i, line in enumerate(cell.texts()):
        prefix, suffix = cell.prefix_of(i), cell.suffix_of(i)
        room = width - cell_len(prefix) - cell_len(suffix)
        if i:
            out.append("\n")
        if prefix:
            out.append(prefix)
        if names is not None:
            line = names[i]
        elif col.shrink == "middle":
            line = shorten_middle(line, room)
        elif col.shrink == "end":
            line = shorten_end(line, room)
        style = cell.line_styles[i] if i < len(cell.line_styles) else ""
        out.append(line, style=style)
        if suffix:
            out.append(suffix, style=cell.suffix_style)
    return out


def _column_names(col: Col, cells: Sequence[Cell], width: int) -> list[list[str]]:
    """Every line of a ``"middle"`` column, shortened together (:func:`shorten_names`): one
    list of lines per cell."""
    texts, rooms, counts = [], [], []
    for cell in cells:
        lines = cell.texts()
        counts.append(len(lines))
        for i, line in enumerate(lines):
            texts.append(line)
            rooms.append(width - cell_len(cell.prefix_of(i)) - cell_len(cell.suffix_of(i)))
    short = iter(shorten_names(texts, rooms))
    return [[next(short) for _ in range(n)] for n in counts]


def fitted_table(cols: Sequence[Col], rows: Sequence[Row], width: int, **table_options: object) -> Table:
    """A rich Table of ``rows`` that fits ``width`` (columns dropped and cells shortened by
    :func:`fit_widths`; names shortened column by column, :func:`shorten_names`);
    ``table_options`` go to Table (title, caption...)."""
    laid = fit_widths(cols, rows, width)
    table = Table(**table_options)  # type: ignore[arg-type]
    for col, w in laid:
        table.add_column(col.header, justify=col.justify, width=w, min_width=w, max_width=w,  # type: ignore[arg-type]
                         no_wrap=True, overflow="ellipsis")
    cells = {col.key: [_cell(row.get(col.key, "")) for row in rows] for col, _ in laid}
    names = {col.key: _column_names(col, cells[col.key], w) for col, w in laid if col.shrink == "middle"}
    for r in range(len(rows)):
        table.add_row(*(_render_cell(col, cells[col.key][r], w, names[col.key][r] if col.key in names else None)
                        for col, w in laid))
    return table
