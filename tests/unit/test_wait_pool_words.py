"""A job of a pool reads only its pool's cards: every wait sentence about cards says so
(``in pool 'a100': ...``), on every path of rig.waiting.explain (a tester's finding: "no card
takes jobs now" for a job of a pool whose cards were closed, while other cards were free)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rig.memory import GIB
from rig.models import CardState
from rig.nodes import NodeInfo
from rig.placement import Hold, Request
from rig.waiting import WaitFacts, explain, explain_body, pool_words


def card(index: int, *, node: str = "n1", free_gib: float = 24, total_gib: float = 24, healthy: bool = True,
         reason: str = "", allowed: bool = True, jobs: int = 0) -> CardState:
    return CardState(node=node, index=index, total=int(total_gib * GIB), usable=int(total_gib * GIB),
                     reserved=int((total_gib - free_gib) * GIB), max_jobs=2, jobs=jobs, healthy=healthy,
                     health_reason=reason, allowed=allowed)


UP = NodeInfo(name="n1", alive=True, state="up", since=1.0, started_at=1.0)
STOPPED = NodeInfo(name="n2", alive=False, state="stopped", since=1.0, started_at=1.0, stopped_at=2.0)
HOLD = Hold(job_id=7, cards=("n1/0",), nbytes=20 * GIB, until=math.inf)

#: Every path of explain_body that reads cards: name -> (facts, words the body says there)
PATHS: dict[str, tuple[WaitFacts, str]] = {
    "no card registered": (WaitFacts(request=Request(GIB), cards=[]), "registered"),
    "no node of it up": (WaitFacts(request=Request(GIB), cards=[card(0, node="n2")], nodes=[STOPPED]),
                         "node is up (node n2: stopped since"),
    "only stopped nodes big enough": (
        WaitFacts(request=Request(40 * GIB), cards=[card(0), card(0, node="n2", total_gib=80, free_gib=80)],
                  nodes=[UP, STOPPED]), "only cards of nodes that are not up could take it"),
    "only outside the whitelist": (
        WaitFacts(request=Request(40 * GIB), cards=[card(0), card(1, total_gib=80, free_gib=80, allowed=False)]),
        "only cards outside gpu_whitelist could take it: n1/1"),
    "fits now": (WaitFacts(request=Request(GIB), cards=[card(0)]), "it fits now (n1/0)"),
    "jobs ahead take the room": (
        WaitFacts(request=Request(20 * GIB), cards=[card(0)], ahead=1, ahead_cards=[card(0, free_gib=4, jobs=1)]),
        "the free memory would hold it now (n1/0), but the 1 job(s) ahead of it take that room first"),
    "full": (WaitFacts(request=Request(20 * GIB), cards=[card(0, free_gib=4, jobs=1)]),
             "needs 20.0 GiB on 1 card; largest free block 4.0 GiB (n1/0)"),
    "no card takes jobs": (WaitFacts(request=Request(GIB), cards=[card(0, healthy=False, reason="nvml: no reading")]),
                           "no card takes jobs now (n1/0: nvml: no reading)"),
    "every card held": (WaitFacts(request=Request(20 * GIB), cards=[card(0), card(1, allowed=False)],
                                  held={"n1/0": HOLD}),
                        "every card that takes jobs is held for jobs ahead of it; n1/0 (24.0 GiB free) held for job 7"),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_sentence_about_a_pools_cards_names_the_pool(path):
    facts, words = PATHS[path]
    bare, _ = explain_body(facts)
    assert words in bare and "pool" not in bare, bare  # the path taken, without a pool
    pooled = explain(dataclasses.replace(facts, pool="a100"))
    assert pooled.startswith("in pool 'a100': "), pooled
    assert words in pooled and pooled.count("a100") == 1, pooled


def test_a_users_limit_is_not_said_to_be_the_pools():
    limit = "over max_jobs_per_user (2 of 2 running or placed)"
    said = explain(WaitFacts(request=Request(GIB), cards=[card(0)], pool="a100", limit=limit))
    assert said.startswith(limit) and "pool" not in said, said


def test_pool_words():
    assert pool_words(None) == "" and pool_words("a100") == "in pool 'a100': "


def test_a_pools_job_is_not_told_no_rig_node_is_up_while_others_are():
    # Its pool's nodes are stopped; nodes outside the pool may well be up (a breaker's finding).
    said = explain(dataclasses.replace(PATHS["no node of it up"][0], pool="a100"))
    assert said.startswith("in pool 'a100': no node is up (node n2: stopped since"), said
    assert "no rig node" not in said
