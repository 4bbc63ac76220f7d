"""Every Client method the CLI calls exists on GatewayClient too: a user without Redis' password
reaches rig through the gateway with the same commands (CI once: `rig kill` of several ids
called Client.records, which GatewayClient lacked, and a gateway user got a traceback)."""

from __future__ import annotations

import re
from pathlib import Path

from rig.client import Client
from rig.gateway.client import GatewayClient

CLI = Path(__file__).resolve().parents[2] / "rig" / "cli"
#: Called only where the client is known to be a Client (an isinstance check beside the call).
DIRECT_ONLY = {"history"}


def test_the_gateway_client_answers_every_client_method_the_cli_calls():
    called = {(m.group(1), path.name) for path in CLI.glob("*.py")
              for m in re.finditer(r"\bclient\.(\w+)\b", path.read_text())}
    assert len(called) > 20  # the pattern still finds the calls
    missing = sorted((name, where) for name, where in called
                     if hasattr(Client, name) and not hasattr(GatewayClient, name) and name not in DIRECT_ONLY)
    assert not missing, f"GatewayClient lacks what the CLI calls: {missing}"
