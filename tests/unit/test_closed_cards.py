"""Why cards take no jobs, grouped per node (rig.closed_cards), as every wait reason words it
(issue 11 follow-up: a node that cannot write logs was "no healthy allowed card is available"
or "unhealthy: vm/1")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rig import logspace
from rig.closed_cards import closed_cards_text
from rig.memory import GIB
from rig.models import CardState
from rig.nodes import NODE_STOPPED_REASON
from rig.placement import Request, explain_wait
from rig.waiting import WaitFacts, explain

ENOSPC = logspace.reason(Path("/x"), OSError(28, "No space left on device"))


def card(index: int, *, node: str = "vm", free_gib: float = 24, healthy: bool = True, reason: str = "",
         allowed: bool = True) -> CardState:
    return CardState(node=node, index=index, total=24 * GIB, usable=24 * GIB, reserved=int((24 - free_gib) * GIB),
                     max_jobs=2, healthy=healthy, health_reason=reason, allowed=allowed)


def test_a_node_that_cannot_write_logs_is_named_with_its_cause_when_no_card_takes_jobs():
    cards = [card(0, healthy=False, reason=ENOSPC), card(1, healthy=False, reason=ENOSPC)]
    why = explain(WaitFacts(request=Request(GIB), cards=cards))
    assert "no healthy allowed card" not in why
    assert "node vm takes no jobs: cannot write logs under /x: No space left on device (ENOSPC)" in why, why
    assert why.count("cannot write logs") == 1  # once for the node, not per card
    assert explain_wait(cards, Request(GIB)).startswith(
        "needs 1.0 GiB on 1 card; no card takes jobs now (node vm takes no jobs: cannot write logs under /x")


def test_only_one_card_marked_yet_still_names_the_node_beside_a_full_card():
    """The guard marks a card at a time: the card that met the full disk first (the others
    may still read healthy but full): the reason names the node's cause, not "unhealthy: vm/1"."""
    cards = [card(0, free_gib=0.5), card(1, healthy=False, reason=ENOSPC)]
    why = explain(WaitFacts(request=Request(GIB), cards=cards))
    assert "unhealthy: vm/1" not in why
    assert "largest free block 512 MiB (vm/0); node vm takes no jobs: cannot write logs under /x" in why, why


def test_other_unhealthy_reasons_are_named_per_card_or_per_node_when_shared():
    hot = [card(0, healthy=False, reason="temperature 95 C > 90 C"), card(1, free_gib=0.5)]
    assert "vm/0: temperature 95 C > 90 C" in explain(WaitFacts(request=Request(GIB), cards=hot))
    both = [card(0, healthy=False, reason="nvml: no reading"), card(1, healthy=False, reason="nvml: no reading")]
    assert closed_cards_text(both) == "node vm takes no jobs: nvml: no reading"
    mixed = [*both, card(0, node="w", healthy=False, reason=ENOSPC), card(1, node="w", allowed=False)]
    text = closed_cards_text(mixed)
    assert text.startswith("node vm takes no jobs: nvml: no reading; node w takes no jobs: cannot write logs"), text
    assert text.endswith("w/1: not in whitelist"), text


def test_a_pool_whose_only_node_is_stopped_still_names_the_stopped_node():
    reason = f"{NODE_STOPPED_REASON} at 12:01:05: its running jobs are adopted when it returns"
    cards = [card(i, healthy=False, reason=reason) for i in range(2)]
    why = explain(WaitFacts(request=Request(GIB), cards=cards, pool="p"))
    assert why.startswith("in pool 'p': needs 1.0 GiB on 1 card; no card takes jobs now "
                          "(node vm is stopped since 12:01:05)"), why
    assert "needs 1.0 GiB on 1 card; no card takes jobs now (node vm is stopped since 12:01:05)" == \
        explain_wait(cards, Request(GIB))
    # One card of it stopped-marked and one not closed: the card is named (not the node).
    partial = [cards[0], dataclasses.replace(cards[1], healthy=True, health_reason="", reserved=24 * GIB)]
    assert "vm/0: node vm is stopped since 12:01:05" in explain_wait(partial, Request(GIB))
