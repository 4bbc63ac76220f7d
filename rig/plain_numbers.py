"""Numbers from other libraries (numpy's ``np.int64``, what ``arr.sum()`` or ``len`` over an
array gives) taken as Python's own, where a job option takes a number (``gpus``, ``retries``,
``gpu_memory`` in bytes, ``time_limit`` in seconds). A bool, Python's or numpy's, is left as it
is: it is a yes/no, never a count, and the rules refuse it."""

from __future__ import annotations

import numbers


def plain_number(value: object) -> object:
    """``value`` as an ``int`` when it is a whole number of another type (numbers.Integral:
    numpy's integers), a ``float`` when it is another real (numpy's float32); anything else
    (str, int, float, bool, None) unchanged."""
    if isinstance(value, bool | int | float) or not isinstance(value, numbers.Real):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)
