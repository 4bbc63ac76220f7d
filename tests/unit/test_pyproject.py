"""pyproject.toml in the form setuptools keeps building: ``project.license`` as a TOML table
made every ``pip install`` print setuptools' deprecation ("By 2027-Feb-18 ... builds will no
longer be supported"); an SPDX string needs setuptools 77 in the build requirements."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_license_is_an_spdx_string_and_the_build_takes_it():
    data = tomllib.loads(PYPROJECT.read_text())
    assert data["project"]["license"] == "MIT"  # a string (SPDX), not {text = "MIT"}
    floors = [re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", req) for req in data["build-system"]["requires"]]
    assert any(m and int(m.group(1)) >= 77 for m in floors), data["build-system"]["requires"]
