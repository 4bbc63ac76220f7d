"""A long list of ids said in one line: the first few, then how many more."""

from __future__ import annotations

from collections.abc import Sequence

#: How many ids a one-line message names before "and N more".
SHOWN = 10


def first_ids(ids: Sequence[object], *, sep: str = ", ", shown: int = SHOWN) -> str:
    """``ids[:shown]`` joined by ``sep``, then " and N more" when there are more (``sep=" "``
    for a list the reader pastes back into a command, e.g. `rig kill`)."""
    listed = sep.join(map(str, ids[:shown]))
    return listed + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
