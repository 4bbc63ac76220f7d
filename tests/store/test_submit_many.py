"""Client.submit_many: several jobs in one transaction, all checked before anything is written."""

from __future__ import annotations

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput
from rig.memory import GIB
from rig.models import JobState


@pytest.fixture
def client(real_redis, key_prefix, tmp_path):
    api = Client(load_settings(key_prefix=key_prefix, home=tmp_path), redis_client=real_redis)
    yield api
    api.flush(10)  # the background Celery messages go out before the prefix is deleted


def test_submit_many_stores_every_job_in_order_with_consecutive_ids(client, real_redis):
    handles = client.submit_many([
        {"command": ["python", "sweep.py", f"--lr={lr}"], "gpu_memory": "4G", "name": "sweep", "priority": "low"}
        for lr in (1e-4, 3e-4, 1e-3)
    ] + [{"command": "echo hi", "gpu_memory": 2 * GIB, "gpus": 2}])
    ids = [h.id for h in handles]
    assert ids == list(range(ids[0], ids[0] + 4))
    jobs = [client.get(i) for i in ids]
    assert [j.command[-1] for j in jobs[:3]] == ["--lr=0.0001", "--lr=0.0003", "--lr=0.001"]
    assert all(j.state is JobState.PENDING and not j.problems for j in jobs)
    assert jobs[3].shell and jobs[3].gpus == 2
    assert [int(i) for i in real_redis.zrange(client.keys.pending, 0, -1)] == [ids[3], *ids[:3]]
    assert real_redis.zcard(client.keys.pending_user(jobs[0].user)) == 4


def test_one_bad_request_writes_nothing(client, real_redis):
    with pytest.raises(InvalidInput, match="request 1: .*unknown unit 'Q'"):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G"}, {"command": ["true"], "gpu_memory": "12Q"}])
    with pytest.raises(InvalidInput, match="request 0: no command"):
        client.submit_many([{"gpu_memory": "1G"}])
    with pytest.raises(InvalidInput, match="request 0: no option 'colour' \\(the keys are command, "):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G", "colour": "red"}])
    assert not real_redis.exists(client.keys.pending)
    assert client.submit_many([]) == []


def test_submit_refuses_what_the_user_limit_or_the_record_checks_never_allow(real_redis, key_prefix, tmp_path):
    from rig.errors import Unschedulable

    api = Client(load_settings(key_prefix=key_prefix, home=tmp_path, max_gpu_memory_per_user="20G"),
                 redis_client=real_redis)
    with pytest.raises(Unschedulable, match="may hold at most 20.0 GiB"):
        api.submit(["true"], gpu_memory="15G", gpus=2)
    for bad in ("0.0001s", "nan"):
        with pytest.raises(InvalidInput):
            api.submit(["true"], gpu_memory="1G", time_limit=bad)
    assert not real_redis.exists(api.keys.pending)
