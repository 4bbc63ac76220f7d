"""The Celery configuration rig builds: beat's Redis client is configured by rig itself (no
fallback to the broker's options), and beat sends only cluster-wide duties. No Redis needed:
the clients are built, never connected."""

from __future__ import annotations

import logging
import warnings

from redbeat.schedulers import RedBeatConfig, RetryingConnection, get_redis

from rig.celery_config import (
    REDIS_CLIENT_OPTIONS,
    TASK_ALERTS,
    TASK_ARCHIVE,
    TASK_HEALTH,
    TASK_TICK,
    make_celery,
)
from rig.config import load_settings


def test_redbeat_gets_its_own_redis_options_and_the_url_with_the_password(tmp_path, caplog):
    settings = load_settings(key_prefix="cfgtest:", redis_url="redis://10.1.2.3:6379/0",
                             redis_password="s3cret", home=tmp_path)
    app = make_celery(settings)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, "celery.beat"):
        warnings.simplefilter("always")
        conf = RedBeatConfig(app)
    assert not [w for w in caught if "redbeat" in str(w.message).lower()], [str(w.message) for w in caught]
    assert "falling back" not in caplog.text
    assert conf.redis_url == settings.redis_url

    client = get_redis(app)  # built from redbeat_redis_options; connects on first use only
    assert isinstance(client, RetryingConnection)  # retries through a Redis restart
    kwargs = client.wrapped_connection.connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cret" and kwargs["host"] == "10.1.2.3"
    broker = app.conf.broker_transport_options
    for name, value in REDIS_CLIENT_OPTIONS.items():
        assert kwargs[name] == value == broker[name]  # the broker's socket options
    assert kwargs["socket_timeout"] and kwargs["socket_timeout"] > 0
    # The broker's queue options are not the client's business (Redis.from_url would refuse them).
    assert "visibility_timeout" not in app.conf.redbeat_redis_options


def test_beat_sends_only_cluster_wide_duties():
    app = make_celery(load_settings(key_prefix="cfgtest:"))
    tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
    # Log sweeps are per node (each control worker sweeps its own logs): not beat's.
    assert tasks == {TASK_TICK, TASK_HEALTH, TASK_ALERTS, TASK_ARCHIVE}


def test_celerys_url_variables_in_rig_ups_shell_never_reach_its_workers(tmp_path, monkeypatch):
    """CELERY_BROKER_URL left in the operator's shell at `rig up` beat rig's broker_url in
    every worker (Celery reads it first): they connected to that URL, none
    came alive and no job ran, with nothing said. rig up's children never get it; rig up says
    it is ignored."""
    from rig.stack import Stack, UpOptions

    monkeypatch.setenv("RIG_HOME", str(tmp_path))
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://elsewhere:6379/0")
    monkeypatch.setenv("CELERY_RESULT_BACKEND", "redis://elsewhere:6379/1")
    child = Stack(load_settings(fake_gpus="1x24G"), UpOptions())._child_env()
    assert "CELERY_BROKER_URL" not in child and "CELERY_RESULT_BACKEND" not in child
    monkeypatch.setattr("os.environ", child)
    assert "elsewhere" not in make_celery(load_settings()).conf.broker_url  # what a worker then uses
    from rig.celery_config import celery_variables_note

    note = celery_variables_note({"CELERY_BROKER_URL": "redis://elsewhere:6379/0", "PATH": "/bin"})
    assert note is not None and note.startswith("note: $CELERY_BROKER_URL (in the environment) is not passed")


def test_a_direct_client_with_celerys_url_variables_still_uses_rigs_broker(tmp_path, monkeypatch):
    """Root's rig-submit with CELERY_BROKER_URL in its shell published its wake-ups to that
    URL: the app make_celery builds never takes the broker or the result
    backend from the environment."""
    monkeypatch.setenv("RIG_HOME", str(tmp_path))
    for name in ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL", "CELERY_RESULT_BACKEND"):
        monkeypatch.setenv(name, "redis://elsewhere:6379/0")
    settings = load_settings(redis_url="redis://127.0.0.1:16999/0")
    conf = make_celery(settings).conf
    assert all("elsewhere" not in (url or "") for url in (conf.broker_url, conf.broker_read_url,
                                                         conf.broker_write_url, conf.result_backend))
    assert "16999" in conf.broker_url and conf.broker_read_url == conf.broker_write_url == conf.broker_url
