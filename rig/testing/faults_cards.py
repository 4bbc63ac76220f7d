"""Fault scenarios: a card stops being rig's while a job runs on it (issue 11, item 2).

Each runs a real node on four fake 24 GB cards, one 20 GB job per card (gated), then `rig down`
and `rig up` again with the card(s) taken away, and checks:

- the jobs on the cards taken away keep running, are supervised by a card worker of their
  card (not stopped as "worker dead", not re-run: each runs once), and conclude with their
  true result (a job whose command exits 7 is FAILED with exit code 7, the others SUCCEEDED);
- nothing new is placed on those cards (a job submitted after the restart runs on the others);
- every reservation is given back (0 leaked), no process is left (0 orphans);
- the operator is told: `rig status` says why each card takes no new jobs (cards closed for the same words share a line).

Scenarios:

- ``card-leaves-whitelist``: restarted with ``gpu_whitelist = [0, 1]``; card 2's job ends while
  rig is down (the case reported: its exit file said 0, the job stayed RUNNING with its memory
  reserved), and must be concluded SUCCEEDED and released once the node is back;
- ``card-leaves-node``: restarted with ``fake_gpus = 2x24G`` (the node has fewer cards);
- ``card-leaves-pool``: restarted with card 3 out of the pool its jobs were submitted to;
- ``whitelist-narrowed-keeps-queue``: a 2-card job waits (not FAILED) while gpu_whitelist = [0]
  on two cards, saying only a card outside the whitelist could take it; it runs once widened;
- ``kill-on-closed-card``: `rig kill` of the job on a card no longer in the whitelist, with
  an unknown id beside it: the job is CANCELLED and released, the unknown id is one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rig.keys import card_worker_name
from rig.models import Job, JobState
from rig.stack import settings_env
from rig.testing.faults import GATE, Scenario, ScenarioResult, _wait

#: The job's exit status depends on its card, so a false ending shows: card 3's job exits 7. It
#: waits for the scenario's go-file, or for one of its card's own ("$GO.card2").
BODY = ('while [ ! -f "$GO" ] && [ ! -f "$GO.card$CUDA_VISIBLE_DEVICES" ]; do sleep 0.05; done; '
        '[ "$CUDA_VISIBLE_DEVICES" = 3 ] && exit 7; exit 0')
#: health.timeout (s): a card without a worker would have its jobs stopped ("worker dead") after
#: this long; the scenarios watch the jobs for more than twice that before letting them go. Not
#: less: rig up kills a worker silent for two timeouts, and on a loaded machine five workers
#: starting at once take ~10 s to heartbeat.
HEALTH_TIMEOUT = 6.0


def _cli(sc: Scenario, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """The real `rig` command line against the scenario's node (its settings as RIG_*)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(sc.node.settings)}
    return subprocess.run([sys.executable, "-m", "rig.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=sc.workdir)


def _start(sc: Scenario, **submit: object) -> dict[int, int]:
    """Bring the node up and run one gated 20 GB job per card; returns job id -> card."""
    sc.node.up()
    ids = [sc.submit(body=BODY, gpu_memory="20G", retries=0, **submit) for _ in range(4)]
    sc.wait_running(ids)
    where = {j.id: j.cards[0] for j in sc.node.client.store.get_many(ids)}
    if sorted(where.values()) != [0, 1, 2, 3]:
        raise RuntimeError(f"expected one job per card, got {where}")
    # RUNNING is recorded at the claim, a moment before the process exists.
    _wait(lambda: len(set(sc.node.job_processes().values())) == 4, 30, "the jobs' processes")
    return where


def _restart(sc: Scenario, *, end_meanwhile: int | None = None, **changes: object) -> None:
    """`rig down` (jobs run on), then `rig up` with ``changes`` to its settings. With
    ``end_meanwhile`` (a card), that card's job ends while no rig runs: only its exit file
    says how (the job stayed RUNNING with its memory reserved, unwatched)."""
    sc.node.down()
    if end_meanwhile is not None:
        gate = Path(f"{sc.go}.card{end_meanwhile}")
        gate.touch()
        _wait(lambda: not any(p for p in sc.node.job_processes().values()
                              if _card_of(sc, p[0]) == end_meanwhile), 30, "the job to end while rig is down")
    sc.node.settings = sc.node.settings.model_copy(update=changes)
    sc.node.up()


def _card_of(sc: Scenario, job_id: int) -> int | None:
    job = sc.node.client.get(job_id)
    return job.cards[0] if job.cards else None


def _watch_closed(sc: Scenario, where: dict[int, int], closed: set[int]) -> None:
    """For more than two health timeouts after the restart: the jobs on ``closed`` cards run on
    in their first attempt, and each such card has a live worker."""
    on_closed = [jid for jid, card in where.items() if card in closed]
    deadline = time.monotonic() + 2.5 * HEALTH_TIMEOUT
    while time.monotonic() < deadline:  # a window in which nothing may happen: no event to await
        for jid in on_closed:
            job = sc.node.client.get(jid)
            if job.state is not JobState.RUNNING or job.attempt != 1:
                sc.result.problems.append(f"job {jid} on closed card {where[jid]} became {job.state.value} "
                                          f"(attempt {job.attempt}) while it ran: {job.reason}")
                return
        time.sleep(0.5)
    alive = {jid for jid, _attempt in sc.node.job_processes().values()}
    if not set(on_closed) <= alive:
        sc.result.problems.append(f"processes of jobs on closed cards gone: {sorted(set(on_closed) - alive)}")
    # A closed card whose jobs all ended needs no worker (its worker retires: _workers_retired).
    for card in sorted(closed & {where[jid] for jid in on_closed}):
        if not sc.node.redis.exists(sc.node.keys.worker(card_worker_name(sc.node.name, card))):
            sc.result.problems.append(f"card {card} has no worker while its job runs")


def _says(line: str, node: str, card: int, why: str) -> bool:
    """Does this line of `rig status` say ``card`` takes no new jobs for ``why``? Cards closed
    for the same words share a line ("n/2, n/3 take no ..."; "all 4 cards of n take no ...")."""
    found = re.match(r"^(.+?) takes? no new jobs: (.*)$", line)
    if found is None or not found.group(2).startswith(why):
        return False
    who = found.group(1)
    return f"{node}/{card}" in who.split(", ") or (who.startswith("all ") and who.endswith(f" cards of {node}"))


def _status_says(sc: Scenario, card: int, why: str) -> None:
    """`rig status` must say why ``card`` takes no jobs, on a line of its own."""
    status = _cli(sc, "status")
    want = f"{sc.node.name}/{card} takes no new jobs: {why}"
    lines = [line.strip() for line in status.stdout.splitlines() if _says(line.strip(), sc.node.name, card, why)]
    if status.returncode != 0 or not lines:
        sc.result.problems.append(f"rig status (exit {status.returncode}) does not say {want!r}: "
                                  f"{status.stdout[-600:]}{status.stderr[-300:]}")
    else:
        sc.result.notes.append(f"rig status: {lines[0]}")


def _late_job(sc: Scenario, **submit: object) -> int:
    """A job submitted after the restart: it must run on a card still open (_check_results)."""
    return sc.submit(body=f"{GATE}; exit 0", gpu_memory="20G", retries=0, **submit)


def _check_results(sc: Scenario, finals: dict[int, Job], where: dict[int, int], late: int,
                   closed: set[int], killed: int | None = None) -> None:
    """Each job ended with its true result, once; the late one ran on an open card."""
    for jid, card in where.items():
        job = finals.get(jid)
        if job is None:
            continue  # counted as lost
        want = (JobState.CANCELLED, None) if jid == killed else (
            (JobState.FAILED, 7) if card == 3 else (JobState.SUCCEEDED, 0))
        if (job.state, job.exit_code if jid != killed else None) != want or job.attempt != 1:
            sc.result.problems.append(f"job {jid} on card {card}: {job.state.value}, exit {job.exit_code}, "
                                      f"attempt {job.attempt}, want {want[0].value} exit {want[1]} once: {job.reason}")
    job = finals.get(late)
    if job is not None and (job.state is not JobState.SUCCEEDED or not job.attempts
                            or set(job.attempts[-1].get("cards") or []) & closed):
        where_ran = job.attempts[-1].get("cards") if job.attempts else None
        sc.result.problems.append(f"the job submitted after the restart: {job.state.value} on cards {where_ran}")


def _closed_cards_empty(sc: Scenario, closed: set[int]) -> None:
    for card in sc.node.client.ledger.cards():
        if card.index in closed and (card.reserved or card.jobs):
            sc.result.problems.append(f"card {card.id} still holds {card.reserved} bytes / {card.jobs} jobs")


def _workers_retired(sc: Scenario, closed: set[int]) -> None:
    """Once their last job ended, the workers kept for ``closed`` cards stop for good (rig up's
    Stack.retire_drained) and are not restarted."""
    names = {f"card{c}" for c in closed}

    def gone() -> bool:
        return sc.node.stack is not None and not names & {c.name for c in sc.node.stack.children}

    try:
        _wait(gone, 30, "the closed cards' workers to stop")
    except TimeoutError:
        sc.result.problems.append(f"workers of closed cards {sorted(closed)} still run after their last job ended")
        return
    sc.result.notes.append(f"workers of closed cards {sorted(closed)} stopped after their last job ended")


def card_leaves_whitelist(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "a card leaves gpu_whitelist mid-job", "rig up again with gpu_whitelist = [0, 1]",
                  fake_gpus="4x24G", health={"check_interval": 1.0, "timeout": HEALTH_TIMEOUT})
    try:
        where = _start(sc)
        _restart(sc, gpu_whitelist=[0, 1], end_meanwhile=2)
        closed = {2, 3}
        ended = next(jid for jid, card in where.items() if card == 2)
        # Concluded from its exit file by card 2's worker, its memory given back.
        try:
            sc.node.wait_for_state(ended, {JobState.SUCCEEDED, JobState.FAILED}, timeout=30)
        except TimeoutError as exc:
            sc.result.problems.append(f"the job that ended while rig was down was not concluded: {exc}")
        if sc.node.client.ledger.card(sc.node.name, 2).reserved:
            sc.result.problems.append("card 2 still holds the memory of the job that ended while rig was down")
        _watch_closed(sc, {jid: card for jid, card in where.items() if jid != ended}, closed)
        _status_says(sc, 3, "not in whitelist; its 1 running job(s) are watched until they end")
        late = _late_job(sc)
        finals = sc.finish()
        _check_results(sc, finals, where, late, closed)
        _closed_cards_empty(sc, closed)
        _status_says(sc, 2, "not in whitelist")
        _workers_retired(sc, closed)
        return sc.result
    finally:
        sc.close()


def card_leaves_node(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "the node has fewer cards mid-job", "rig up again with 2x24G after 4x24G",
                  fake_gpus="4x24G", health={"check_interval": 1.0, "timeout": HEALTH_TIMEOUT})
    try:
        where = _start(sc)
        _restart(sc, fake_gpus="2x24G")
        closed = {2, 3}
        _watch_closed(sc, where, closed)
        _status_says(sc, 3, "not on the node any more; its 1 running job(s) are watched until they end")
        late = _late_job(sc)
        finals = sc.finish()
        _check_results(sc, finals, where, late, closed)
        _closed_cards_empty(sc, closed)
        lost = [jid for jid, job in finals.items() if any(a.get("outcome") == "lost" for a in job.attempts)]
        if lost:
            sc.result.problems.append(f"jobs marked lost (\"worker dead\"): {lost}")
        return sc.result
    finally:
        sc.close()


def card_leaves_pool(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "a card leaves its pool mid-job", "rig up again with card 3 out of pool p",
                  fake_gpus="4x24G", health={"check_interval": 1.0, "timeout": HEALTH_TIMEOUT},
                  pools={"p": ["testnode"]})
    try:
        where = _start(sc, pool="p")
        _restart(sc, pools={"p": ["testnode:0-2"]})
        _watch_closed(sc, where, set())
        late = _late_job(sc, pool="p")
        finals = sc.finish()
        _check_results(sc, finals, where, late, {3})
        return sc.result
    finally:
        sc.close()


def kill_on_closed_card(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "rig kill of a job on a card out of the whitelist", "gpu_whitelist = [0, 1]; "
                  "rig kill JOB 987654", fake_gpus="4x24G", health={"check_interval": 1.0, "timeout": HEALTH_TIMEOUT})
    try:
        where = _start(sc)
        _restart(sc, gpu_whitelist=[0, 1])
        victim = next(jid for jid, card in where.items() if card == 2)
        result = _cli(sc, "kill", str(victim), "987654")
        said = (result.stdout + result.stderr).strip().splitlines()
        sc.result.notes += said
        if result.returncode != 4 or "Traceback" in result.stderr or len(said) != 2 \
                or f"job {victim} cancelled" not in result.stdout or "no job with id 987654" not in result.stderr:
            sc.result.problems.append(f"rig kill said (exit {result.returncode}): {said}")
        job = sc.node.client.get(victim)
        if job.state is not JobState.CANCELLED:
            sc.result.problems.append(f"the killed job is {job.state.value}")
        if victim in {jid for jid, _a in sc.node.job_processes().values()}:
            sc.result.problems.append("the killed job's process still runs")
        if sc.node.client.ledger.card(sc.node.name, 2).reserved:
            sc.result.problems.append("card 2 still holds the killed job's memory")
        late = _late_job(sc)
        finals = sc.finish()
        _check_results(sc, finals, where, late, {2, 3}, killed=victim)
        _closed_cards_empty(sc, {2, 3})
        return sc.result
    finally:
        sc.close()


def whitelist_narrowed_keeps_queue(workdir: Path) -> ScenarioResult:
    """A maintenance narrowing (gpu_whitelist = [0] on two cards) must not destroy the queue: a
    2-card job waits, saying that only a card outside the whitelist could take it, and runs once
    the whitelist is widened again (it was FAILED at once as "unschedulable")."""
    sc = Scenario(workdir, "gpu_whitelist narrowed below a waiting job", "rig up with gpu_whitelist = [0] on 2x24G, "
                  "then without it", fake_gpus="2x24G", gpu_whitelist=[0],
                  health={"check_interval": 1.0, "timeout": HEALTH_TIMEOUT})
    try:
        from rig.waiting import why_waiting

        sc.node.up()
        jid = sc.submit(body=f"{GATE}; exit 0", gpu_memory="4G", gpus=2, retries=0)
        want = f"only cards outside gpu_whitelist could take it: {sc.node.name}/1"
        said: list[str] = []

        def explained() -> bool:
            job = sc.node.client.get(jid)
            said[:] = [job.state.value, job.reason or "", why_waiting(sc.node.client, job)]
            return job.state is not JobState.PENDING or want in said[2]

        try:
            _wait(explained, 30, "the wait reason")
        except TimeoutError:
            pass
        if said[0] != JobState.PENDING.value or want not in said[2]:
            sc.result.problems.append(f"the 2-card job is {said[0]} ({said[1]}); its wait reads {said[2]!r}")
        else:
            sc.result.notes.append(f"rig show: {said[2]}")
        sc.node.down()
        sc.node.settings = sc.node.settings.model_copy(update={"gpu_whitelist": None})
        sc.node.up()
        finals = sc.finish()
        job = finals.get(jid)
        if job is not None and (job.state is not JobState.SUCCEEDED or job.attempt != 1):
            sc.result.problems.append(f"after widening: {job.state.value}, attempt {job.attempt}: {job.reason}")
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("card-leaves-whitelist", card_leaves_whitelist),
    ("card-leaves-node", card_leaves_node),
    ("card-leaves-pool", card_leaves_pool),
    ("kill-on-closed-card", kill_on_closed_card),
    ("whitelist-narrowed-keeps-queue", whitelist_narrowed_keeps_queue),
]
