"""The ledger's Lua scripts (rig/lua/*.lua) and the snippets they share (rig/lua/lib_*.lua).

A script names a snippet on a line of its own, ``--#include lib_card``; :func:`source` puts the
snippet's text there before the script is registered, so a rule used by several scripts (leaving
a user's queue, whether a card takes a job) is written once.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script

_INCLUDE = re.compile(r"^--#include (lib_\w+)[ \t]*$", re.MULTILINE)


@cache
def source(name: str) -> str:
    """The text of script ``name`` with its ``--#include lib_x`` lines replaced by the snippets."""
    text = resources.files("rig.lua").joinpath(f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: source(m.group(1)).rstrip("\n"), text)


class Scripts:
    """The ledger's scripts (reserve, claim, transition, reclaim, observe, unqueue,
    start_back) for one client."""

    def __init__(self, client: redis.Redis) -> None:
        self.reserve: Script = client.register_script(source("reserve"))
        self.claim: Script = client.register_script(source("claim"))
        self.transition: Script = client.register_script(source("transition"))
        self.reclaim: Script = client.register_script(source("reclaim"))
        self.observe: Script = client.register_script(source("observe"))
        self.unqueue: Script = client.register_script(source("unqueue"))
        self.start_back: Script = client.register_script(source("start_back"))
