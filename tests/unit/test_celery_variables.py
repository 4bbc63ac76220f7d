"""Celery's own variables left in the operator's shell by another Celery project never reach
rig's workers, beat and Flower: CELERY_BROKER_URL beats an app's broker_url, and the `celery`
command line takes BROKER_URL for -b. A breaker's `CELERY_BROKER_URL=redis://127.0.0.1:1/0 rig up
--daemon` said "rig is up" while no worker ever came up (each consumed from the dead broker, was
killed as hung every 30 s and started again) and jobs waited for ever, "queued: first in line"."""

from __future__ import annotations

import json
import subprocess
import sys

from rig.celery_config import celery_variables, celery_variables_note
from rig.config import load_settings
from rig.stack import Stack, UpOptions

LEFT_IN_THE_SHELL = {"CELERY_BROKER_URL": "redis://127.0.0.1:1/0", "BROKER_URL": "redis://127.0.0.1:1/1",
                     "CELERY_RESULT_BACKEND": "redis://127.0.0.1:1/2", "LOADER": "nowhere.Loader"}


def test_rig_ups_children_get_none_of_celerys_variables(tmp_path, monkeypatch):
    for name, value in LEFT_IN_THE_SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BROKER", "kept")  # not Celery's
    settings = load_settings(home=tmp_path / "home", node_name="n1", fake_gpus="1x8G",
                             redis_url="redis://127.0.0.1:6390/3")
    env = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=print)._child_env()
    assert not set(LEFT_IN_THE_SHELL) & set(env)
    assert env["BROKER"] == "kept"
    # what a worker's Celery app then talks to: rig's Redis, not the variable's
    code = ("import json; from rig.config import load_settings; from rig.celery_config import make_celery; "
            "c = make_celery(load_settings()).conf; print(json.dumps([c.broker_url, c.broker_read_url, "
            "c.result_backend]))")
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True, cwd=tmp_path)
    broker, read, backend = json.loads(out.stdout)
    assert broker.startswith("redis://") and broker.endswith("127.0.0.1:6390/3"), broker
    assert read == broker and backend is None


def test_rig_up_names_them_in_one_line():
    assert celery_variables({"PATH": "/bin", "RIG_HOME": "/x", "CELERYD": "1"}) == []
    assert celery_variables_note({"PATH": "/bin"}) is None
    note = celery_variables_note({"CELERY_BROKER_URL": "redis://x", "BROKER_URL": "redis://y"})
    assert note == ("note: $BROKER_URL, $CELERY_BROKER_URL (in the environment) are not passed to rig's "
                    "workers, beat and Flower: they use rig's Redis (redis_url) only")
