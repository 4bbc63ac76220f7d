"""Job and card records read from Redis: every field checked, bad records named, never a crash."""

from __future__ import annotations

import json
import time

import pytest

from rig import records as R
from rig.errors import InvalidRecord
from rig.models import CardState, Job, JobState, Priority


def good_job(**overrides) -> Job:
    values = dict(id=7, name="train", user="alice", uid=1000, command=["python", "train.py"],
                  gpu_memory=2**30, gpus=1, priority=Priority.HIGH, state=JobState.PENDING,
                  workdir="/data/exp", created_at=time.time(), env={"A": "1"})
    values.update(overrides)
    return Job(**values)


def raw_of(job: Job, **fields: str) -> dict[str, str]:
    raw = job.to_redis()
    raw.update(fields)
    return raw


def test_a_valid_record_round_trips_without_problems():
    job = good_job(node="n1", cards=[3], attempt=2, pid=1234, exit_code=-9, time_limit=60.0,
                   attempts=[{"attempt": 1, "cards": [3], "summary": "x", "evidence": ["e"]}])
    back = Job.from_redis(job.to_redis(), strict=True)
    assert back == job and back.problems == [] and back.invalid_reason is None
    assert "problems" not in job.to_redis()


def test_bytes_from_a_client_without_decoding_are_read_too():
    raw = {k.encode(): v.encode() for k, v in good_job().to_redis().items()}
    assert Job.from_redis(raw, strict=True).name == "train"


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("gpus", "x", "field gpus: expected a whole number of cards from 1 to 256, got 'x'"),
    ("gpus", "0", "field gpus: expected a whole number of cards from 1 to 256"),
    ("gpus", "1e400", "field gpus: expected"),
    ("gpu_memory", str(10**30), "field gpu_memory: expected a size in bytes"),
    ("gpu_memory", "-5", "field gpu_memory"),
    ("gpu_memory", "nan", "field gpu_memory"),
    ("id", "9" * 5000, "field id"),
    ("priority", "urgent", "field priority: expected one of high, medium, low, got 'urgent'"),
    ("state", "HACKED", "field state: expected one of PENDING"),
    ("command", "rm -rf /", "field command: expected JSON"),
    ("command", '"rm -rf /"', "field command: expected a non-empty JSON list of strings"),
    ("command", "[]", "field command: expected a non-empty JSON list"),
    ("command", '["echo", 1]', "field command: argument 1: expected a string, got 1"),
    ("command", json.dumps(["echo", "a\x00b"]), "field command: argument 1 contains a NUL"),
    ("command", json.dumps(["", "x"]), "field command: the program (argument 0) is empty"),
    ("command", json.dumps(["x" * (R.MAX_ARG_BYTES + 1)]), "field command: argument 0 is longer than"),
    ("command", "[" * 100_000 + "]" * 100_000, "field command: nested too deeply"),
    ("command", json.dumps(["x"] * (R.MAX_ARGS + 1)), "field command: more than 4096 arguments"),
    ("shell", "yes", "field shell: expected 1 or 0, got 'yes'"),
    ("env", '{"A": 1}', "field env: variable A: expected a string, got 1"),
    ("env", '{"A=B": "1"}', "field env: bad variable name 'A=B'"),
    ("env", json.dumps({"A": "x\x00y"}), "field env: variable A contains a NUL"),
    ("env", '["A"]', "field env: expected a JSON object of strings"),
    ("workdir", "relative/dir", "field workdir: expected an absolute path, got 'relative/dir'"),
    ("workdir", "/a\x00b", "field workdir: contains a NUL"),
    ("name", "x\x1b[2Jy", "field name: expected printable text"),
    ("name", "n" * 129, "field name: longer than 128 characters"),
    ("user", "alice; rm -rf /", "field user: expected a login name"),
    ("user", "a:b", "field user: expected a login name"),
    ("uid", "-1", "field uid: expected a uid"),
    ("umask", "512", "field umask: expected a umask"),
    ("cards", "[0, 0]", "field cards: a card is listed twice"),
    ("cards", '[0, "1"]', "field cards: expected card indexes"),
    ("pid", "1", "field pid: expected a process id from 2"),
    ("created_at", "inf", "field created_at: expected a time"),
    ("time_limit", "0", "field time_limit: expected a duration"),
    ("kind", "evil", "field kind: expected one of command, python"),
    ("attempts", '[{"cards": 5}]', "field attempts: attempt record 0: cards"),
    ("attempts", '[{"started_at": "yesterday"}]', "field attempts: attempt record 0: started_at"),
    ("log_paths", '["relative.log"]', "field log_paths: an item: expected an absolute path"),
    ("reason", "r" * (R.MAX_TEXT_CHARS + 1), "field reason: longer than"),
    ("name", "\udcff\udcfe", "field name: not valid UTF-8"),
    ("env", json.dumps({"WEIRD": "caf\udce9"}), "field env: variable WEIRD is not valid UTF-8"),
])
def test_a_bad_field_is_named_and_replaced(field, value, expected):
    raw = raw_of(good_job(), **{field: value})
    job = Job.from_redis(raw)  # lenient: never raises
    assert job.problems and job.problems[0].startswith(expected), job.problems
    assert job.invalid_reason.startswith(f"invalid record: {expected}")
    assert not job.field_valid(field)
    with pytest.raises(InvalidRecord) as err:
        Job.from_redis(raw, strict=True)
    assert err.value.field == field and err.value.exit_code == 9
    assert f"invalid record: field {field}: " in str(err.value)


def test_missing_required_fields_take_neutral_values():
    job = Job.from_redis({"id": "5", "reason": "kept"})
    assert {p.split(":")[0] for p in job.problems} >= {
        "field name", "field user", "field command", "field gpu_memory", "field gpus", "field priority",
        "field state", "field workdir", "field created_at"}
    assert job.id == 5 and job.command == [] and job.user == "?" and job.state is JobState.FAILED
    assert job.reason == "kept" and job.display_command == ""
    assert Job.from_redis({}).id == 0


def test_optional_fields_that_are_empty_are_unset():
    raw = raw_of(good_job(), node="", exit_code="", cancel_requested="", pid="")
    job = Job.from_redis(raw, strict=True)
    assert job.node is None and job.exit_code is None and job.pid is None and not job.cancel_requested


def test_a_shell_flag_must_match_the_command_that_runs():
    # shell=1 only changes what is shown; a record showing "true" while running rm is refused.
    raw = raw_of(good_job(), shell="1", command=json.dumps(["/bin/rm", "-rf", "true"]))
    job = Job.from_redis(raw)
    assert job.problems == ["field command: a shell job's command must be ['/bin/sh', '-c', TEXT], "
                            "got ['/bin/rm', '-rf', 'true']"]
    ok = Job.from_redis(raw_of(good_job(), shell="1", command=json.dumps(["/bin/sh", "-c", "a | b"])))
    assert ok.problems == [] and ok.display_command == "a | b"


def test_cards_must_match_gpus():
    job = Job.from_redis(raw_of(good_job(gpus=2), node="n1", cards="[1]"))
    assert job.problems == ["field cards: the job asks for 2 card(s) but holds 1"]


def test_a_bad_name_is_shown_printable_and_unknown_fields_are_ignored():
    job = Job.from_redis(raw_of(good_job(), name="a\x07b", payload="xyz", pool="gpu-a"))
    assert job.name == "a?b" and len(job.problems) == 1


def test_injection_attempts_in_text_are_just_text():
    name = "x; touch /tmp/pwned $(reboot) `id`"
    job = Job.from_redis(raw_of(good_job(name=name, command=["echo", "$(touch /tmp/pwned)"])), strict=True)
    assert job.name == name and job.command == ["echo", "$(touch /tmp/pwned)"]


def test_many_problems_are_summarised():
    job = Job.from_redis(raw_of(good_job(), gpus="x", priority="y", state="z", workdir="w", shell="q"))
    assert len(job.problems) == 5 and job.invalid_reason.endswith("(and 2 more)")


# -- records checks used at submit --------------------------------------------------------------
def test_checks_accept_what_submit_writes():
    assert R.as_argv(["python", "-c", "print('$(x)')"]) == ["python", "-c", "print('$(x)')"]
    assert R.as_env({"PATH": "/usr/bin", "_X1": ""}) == {"PATH": "/usr/bin", "_X1": ""}
    assert R.as_int("12.0", 0, 20) == 12
    with pytest.raises(R.BadField, match="expected a whole number from 0 to 20, got '12.5'"):
        R.as_int("12.5", 0, 20)
    with pytest.raises(R.BadField, match="longer than"):
        R.as_env({"A": "x" * (R.MAX_ENV_BYTES + 1)})


# -- cards ----------------------------------------------------------------------------------
def card_raw(**fields: str) -> dict[str, str]:
    raw = {"node": "n1", "index": "0", "total": str(80 * 2**30), "usable": str(76 * 2**30),
           "reserved": "0", "jobs": "0", "max_jobs": "4", "allowed": "1", "healthy": "1",
           "model": "m", "uuid": "u", "used": "", "utilization": "", "temperature": "40"}
    raw.update(fields)
    return raw


def test_a_valid_card_parses():
    card = CardState.from_redis(card_raw())
    assert card.healthy and card.eligible and card.temperature == 40 and card.used is None


@pytest.mark.parametrize(("field", "value"), [
    ("usable", "lots"), ("total", str(2**80)), ("index", "-3"), ("max_jobs", "0"), ("allowed", "maybe"),
    ("temperature", "hot"), ("node", "two words"), ("reserved", "1.5"),
])
def test_a_bad_card_record_makes_an_unhealthy_card_not_a_crash(field, value):
    card = CardState.from_redis(card_raw(**{field: value}))
    assert not card.healthy and not card.eligible
    assert card.health_reason.startswith(f"invalid record: field {field}: ")


def test_a_card_record_without_its_identity():
    card = CardState.from_redis({"reserved": "0"})
    assert (card.node, card.index, card.usable, card.free) == ("?", -1, 0, 0) and not card.eligible


def test_job_id_zero_is_refused_saying_ids_start_at_1():
    # Breaker: `rig show 0` said "'0' is not a job id: job ids are whole numbers like 12";
    # 0 is a whole number.
    from rig.errors import InvalidInput

    with pytest.raises(InvalidInput, match="whole numbers from 1"):
        R.parse_job_id("0")
    assert R.parse_job_id("12") == 12


# Values a card record's fields may take: valid ones, bad ones, and gone (None).
_CARD_VALUES = {
    "node": ["n1", "n2", "two words", None], "index": ["0", "3", "-3", None],
    "total": [str(80 * 2**30), "lots", None], "usable": [str(76 * 2**30), str(40 * 2**30), "1.5", None],
    "reserved": ["0", str(12 * 2**30), str(-2 * 2**30), "1.5", "", None], "jobs": ["0", "1", "4", "x", None],
    "max_jobs": ["4", "5", "0", None], "allowed": ["1", "0", "maybe", None], "healthy": ["1", "0", None],
    "model": ["m", "x" * 300, None], "used": ["", "5", None], "utilization": ["", "50", "101"],
    "temperature": ["40", "hot", None], "updated_at": ["1900000000.5", "soon", None], "fake": ["1", "0"],
    "health_reason": ["", "hot"], "foreign": ["0", str(2**30), None], "gone": ["0", "1", "yes"],
    "version": ["7", "8", None],
}


@pytest.mark.parametrize("seed", range(40))
def test_a_card_read_again_with_some_fields_changed_parses_as_the_whole_record(seed):
    """CardState.with_fields (the dispatcher's _reparsed: only the values that changed checked
    again) gives what from_redis gives for the new record, or None (then the whole is parsed)."""
    import random

    from workers.dispatcher import _reparsed

    rng = random.Random(seed)
    good = {**card_raw(), "version": "1", "updated_at": "1900000000.5", "foreign": "0", "gone": "0"}
    raw, reparsed = good, 0
    for _step in range(60):
        if rng.random() < 0.5:
            raw = good
        new = dict(raw)
        for name in rng.sample(sorted(_CARD_VALUES), rng.choice([1, 1, 2, 3])):
            value = rng.choice(_CARD_VALUES[name])
            if value is None:
                new.pop(name, None)
            else:
                new[name] = value
        before = CardState.from_redis(raw)
        whole = CardState.from_redis(new)
        record = tuple(x for kv in raw.items() for x in kv)
        changed = tuple(x for kv in {**raw, **new}.items() if kv[0] in new for x in kv)  # raw's order
        got = _reparsed(before, record, changed)
        if got is not None:
            reparsed += 1
            assert got == whole and not got.problems and not whole.problems
            assert (got.healthy, got.health_reason) == (whole.healthy, whole.health_reason)
        else:
            assert before.problems or whole.problems or record[::2] != changed[::2]
        raw = new
    assert reparsed > 5
