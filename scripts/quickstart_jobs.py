"""The sizes of scripts/quickstart's demo jobs, fitted to the cards that are up.

    rig status --json | python scripts/quickstart_jobs.py
    # prints: BIG PAIR NOTE  (GiB per card for 'finetune', for 'pair', or 0: no such job)

quickstart's jobs were written for fake 8x80G cards: a 40 GiB 'finetune' and a 2-card 'pair'.
On a one-card workstation or cards under 42 GiB (a 24 GiB card, an A100 40GB) rig-submit
refused them (exit 3, "can never run") half-way through quickstart, after it had already queued
the first job. Here 'finetune' takes 40 GiB where a card offers it, else half the largest card;
'pair' takes 20 GiB per card where a node has two cards with that room, else half the
second-largest card of the node with the most room; 0 (skipped, with a note) when no node has
two cards.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

GIB = 1024**3
#: What quickstart asks for on cards big enough (fake 8x80G, the default without a driver).
BIG_GIB = 40
PAIR_GIB = 20


def sizes(status: dict) -> tuple[int, int, str]:
    """(finetune GiB, pair GiB per card or 0, a note for quickstart to print or "")."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for card in status.get("cards", []):
        if card.get("allowed", True) and not card.get("gone", False):
            by_node[str(card.get("node", ""))].append(int(card.get("usable", 0)) // GIB)
    largest = max((max(u) for u in by_node.values()), default=0)
    big = BIG_GIB if largest >= BIG_GIB else max(1, largest // 2)
    second = max((sorted(u, reverse=True)[1] for u in by_node.values() if len(u) >= 2), default=0)
    pair = PAIR_GIB if second >= PAIR_GIB else second // 2
    notes = []
    if big != BIG_GIB:
        notes.append(f"'finetune' asks for {big}G (the largest card offers {largest} GiB)")
    if not pair:
        notes.append("no node has two cards with room: the 2-card 'pair' job is skipped")
    elif pair != PAIR_GIB:
        notes.append(f"'pair' asks for {pair}G per card")
    return big, pair, "; ".join(notes)


def argv0(pid: int) -> str | None:
    """The program a process runs as its command line names it (None: gone, or not readable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace") or None
    except OSError:
        return None


def served_elsewhere(status: dict, venv: str, host: str, program=argv0) -> str:
    """What quickstart says when the rig already up on this host was started from another
    installation than this clone's .venv (another clone, a wheel), else "". quickstart then
    only submits its demo to that rig: a second clone, or an older checkout's rig left up, ran
    the demo on code other than the one just installed, without a word."""
    root = venv.rstrip("/") + "/"
    for node in status.get("nodes", []):
        pid = node.get("pid")
        if node.get("state") != "up" or node.get("host") != host or not pid:
            continue
        started = program(int(pid))
        if started and not started.startswith(root):
            return (f"note: rig is already up on node {node.get('name')} (pid {pid}), started from {started}, "
                    f"not from this clone's .venv: the demo runs on that rig; stop it with `rig down` and run "
                    "scripts/quickstart again to use this clone")
    return ""


def main() -> None:
    if sys.argv[1:2] == ["--served-elsewhere"]:  # quickstart_jobs.py --served-elsewhere VENV
        import socket

        note = served_elsewhere(json.load(sys.stdin), sys.argv[2], socket.gethostname())
        if note:
            print(note)
        return
    big, pair, note = sizes(json.load(sys.stdin))
    print(big, pair, note)


if __name__ == "__main__":
    main()
