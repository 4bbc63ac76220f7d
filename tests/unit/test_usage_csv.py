"""`rig usage --csv`: a job's name, template or user that starts like a spreadsheet formula is
written as text (a leading '), never as a formula a spreadsheet runs when the file is opened
(a tester's finding: a job named `=HYPERLINK("x")` went out as is)."""

from __future__ import annotations

import csv
import io

import pytest

from rig.accounting import UsageLine
from rig.cli.usage import _csv_row, csv_text


@pytest.mark.parametrize("name", ['=HYPERLINK("x")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_a_formula_is_written_as_text(name):
    assert csv_text(name) == "'" + name
    out = io.StringIO()
    csv.writer(out).writerow(_csv_row(UsageLine(key=name, jobs=1, card_hours=1.0, reserved_gib_hours=1.0,
                                                used_gib_hours=None)))
    assert next(csv.reader(io.StringIO(out.getvalue())))[0] == "'" + name


@pytest.mark.parametrize("name", ["bert", "lr=0.1", "(none)", "ünï", ""])
def test_other_text_is_as_it_is(name):
    assert csv_text(name) == name
