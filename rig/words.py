"""How a typed word is read, everywhere: a priority (``-p HIGH``, ``RIG_DEFAULT_PRIORITY``, a
template's ``priority``), ``queue_order``, ``scheduler_type``, ``overuse_policy``, and the words
that stand for a value (``--gpu-memory auto``, ``--time-limit none``, ``--since all``). One rule, one
place: case and surrounding spaces do not matter (``"HIGH "`` is ``high``), on the command line,
in Python, in an environment variable and in the config file alike. Accepting is kinder than
refusing what a flag took.
"""

from __future__ import annotations

from typing import Any


def typed_word(value: Any) -> Any:
    """``value`` stripped and lower-cased if it is text; anything else as it is (the caller's
    check refuses it, saying what it expects)."""
    return value.strip().lower() if isinstance(value, str) else value
