"""The ledger's Lua scripts (rig/lua/*.lua), registered once per client."""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script


@cache
def _source(name: str) -> str:
    return resources.files("rig.lua").joinpath(f"{name}.lua").read_text()


class Scripts:
    """The ledger's scripts (reserve, claim, transition, reclaim, observe, unqueue) for one client."""

    def __init__(self, client: redis.Redis) -> None:
        self.reserve: Script = client.register_script(_source("reserve"))
        self.claim: Script = client.register_script(_source("claim"))
        self.transition: Script = client.register_script(_source("transition"))
        self.reclaim: Script = client.register_script(_source("reclaim"))
        self.observe: Script = client.register_script(_source("observe"))
        self.unqueue: Script = client.register_script(_source("unqueue"))
