"""Submission templates (M3): presets fill what the submitter did not say."""

from __future__ import annotations

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput, Unschedulable
from rig.gpus.base import GpuReading
from rig.ledger import Ledger
from rig.memory import GIB
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


@pytest.fixture
def client(real_redis, key_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rig.toml").write_text(
        '[templates.nightly]\ngpu_memory = "16G"\npriority = "low"\ntime_limit = "6h"\n'
        '[templates.finetune]\nmargin = 1.5\npriority = "high"\n')
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home")
    return Client(settings, redis_client=real_redis)


def test_template_fills_unsaid_options_and_flags_win(client):
    job = client.submit("python ft.py", gpu_memory="10G", template="finetune").record
    assert job.gpu_memory == 15 * GIB  # 10 GiB x the config's margin 1.5
    assert job.priority.value == "high" and job.template == "finetune"
    # The config's finetune replaces the shipped one as a whole: unsaid values are the defaults.
    assert job.max_retries == 2 and job.time_limit is None and not job.oom_retry_grow
    explicit = client.submit("python ft.py", gpu_memory="10G", template="finetune", priority="low",
                             retries=0).record
    assert explicit.priority.value == "low" and explicit.max_retries == 0


def test_template_with_its_own_memory_and_shipped_ones_remain(client):
    job = client.submit("python eval.py", template="nightly").record
    assert job.gpu_memory == 16 * GIB and job.priority.value == "low" and job.time_limit == 6 * 3600
    assert {"finetune", "inference", "test", "nightly"} <= set(client.templates())
    smoke = client.submit("pytest -x", template="test").record
    assert smoke.gpu_memory == 2 * GIB and smoke.max_retries == 0


def test_a_refusal_says_the_size_it_quotes_is_the_templates_margin_on_what_was_typed(client):
    """`rig-submit -t finetune -m 20G` on 24 GB cards said "needs 30.0 GiB per card ...; ask for
    less memory", a size nobody typed: the refusal names the margin that made it."""
    Ledger(client.r, client.keys).register_card(
        "n1", GpuReading(index=0, uuid="u0", model="m", total=24 * GIB),
        max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    with pytest.raises(Unschedulable, match=r"^job can never run: needs 30\.0 GiB per card but the largest card "
                                            r"offers 24\.0 GiB .*; ask for less memory \(30\.0 GiB per card is "
                                            r"20G x margin 1\.5 of template 'finetune'\)$"):
        client.submit("python ft.py", gpu_memory="20G", template="finetune")
    # Without a margin the size is the one typed, and nothing is added.
    with pytest.raises(Unschedulable, match=r"ask for less memory$"):
        client.submit("python ft.py", gpu_memory="30G")


def test_an_empty_name_is_refused_not_replaced_by_the_programs(client):
    """`--name "$NAME"` with NAME unset ran under the program's name in silence (a name of
    spaces was refused); left out, the name is still the program's."""
    with pytest.raises(InvalidInput, match="name is empty"):
        client.submit(["python", "ft.py"], gpu_memory="1G", name="")
    assert client.submit(["python", "ft.py"], gpu_memory="1G").record.name == "ft.py"


def test_unknown_template_and_missing_memory(client):
    with pytest.raises(InvalidInput, match="unknown template 'huge'; known: finetune"):
        client.submit("x", gpu_memory="1G", template="huge")
    with pytest.raises(InvalidInput, match="gpu_memory is required"):
        client.submit("x", template="finetune")


def test_a_template_margin_that_makes_a_size_no_card_has_is_one_line_naming_the_template(client):
    """`rig-submit --template finetune --gpu-memory 999...9G` (a size no card has) ended in an
    OverflowError traceback (the size x the margin was multiplied before it was checked); a
    margin of 1e9 on 1G said "--gpu-memory 976562.5 TiB", a size the submitter never wrote."""
    huge = "14" + "0" * 298 + "G"  # 1.5e308 bytes, a float; x 1.5 is inf
    with pytest.raises(InvalidInput, match=r"^gpu_memory .* more than any card has; give at most 16\.0 TiB$"):
        client.submit("x", gpu_memory=huge, template="finetune")
    with pytest.raises(InvalidInput, match=r"^gpu_memory: '9+G' is too large to be a size"):
        client.submit("x", gpu_memory="9" * 330 + "G")  # float() reads it as inf
    with pytest.raises(InvalidInput, match=r"^template 'finetune': 12T x margin 1\.5 = 18\.0 TiB is more than "
                                           r"any card has; give at most 16\.0 TiB$"):
        client.submit("x", gpu_memory="12T", template="finetune")


def test_a_margin_beyond_100_is_refused_where_it_is_written(tmp_path, monkeypatch):
    from rig.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rig.toml").write_text("[templates.x]\nmargin = 1e300\n")
    with pytest.raises(ConfigError, match=r"\[templates\.x\] margin: Input should be less than or equal to 100"):
        load_settings(home=tmp_path / "home")
    (tmp_path / "rig.toml").write_text("auto_memory_margin = 1e9\n")
    with pytest.raises(ConfigError, match="auto_memory_margin"):
        load_settings(home=tmp_path / "home")


def test_submit_stores_the_callers_own_run_times_by_command_then_name(client):
    """rig.estimates through submit(): the median and the 80th percentile of the caller's runs of
    the same command are stored on the record; a new command of the same script's name needs 3
    runs of that name; another command and name nothing (the dispatcher then uses runs of its
    size)."""
    from rig import estimates
    from rig.client import current_identity

    me = current_identity().name
    first = client.submit("python train.py --epochs 1", gpu_memory="1G").record
    pipe = client.r.pipeline()
    for seconds in (10.0, 10.0, 10.0, 100.0):  # the 80th percentile of 4 runs is the 4th
        estimates.record_run(pipe, client.keys, user=me, name=first.name, template=None,
                             command=first.command, nbytes=GIB, gpus=1, seconds=seconds)
    pipe.execute()
    again = client.submit("python train.py --epochs 1", gpu_memory="1G").record
    assert (again.expected_seconds, again.cautious_seconds) == (10.0, 100.0)
    limited = client.submit("python train.py --epochs 1", gpu_memory="1G", time_limit="30s").record
    assert (limited.expected_seconds, limited.cautious_seconds) == (10.0, 30.0)
    # The same name (4 runs of it) with other arguments: the name's runs.
    other_args = client.submit("python train.py --epochs 100", gpu_memory="1G", name=first.name).record
    assert other_args.expected_seconds == 10.0
    fresh = client.submit("python eval.py", gpu_memory="1G").record
    assert fresh.expected_seconds is None and fresh.cautious_seconds is None


def test_rig_submit_can_say_no_to_a_templates_oom_retry_grow(cli_env, real_redis):
    """finetune sets oom_retry_grow = true and `rig templates` says explicit flags win, but
    rig-submit had only --oom-retry-grow: no flag could turn it off for one job."""
    from click.testing import CliRunner

    from rig.cli.submit import main as submit_main

    def submitted(*flags: str) -> bool:
        result = CliRunner().invoke(submit_main, ["-t", "finetune", "-m", "1G", *flags, "--", "true"])
        assert result.exit_code == 0, result.output
        job_id = int(result.output.splitlines()[0])
        return Client(load_settings(), redis_client=real_redis).get(job_id).oom_retry_grow

    assert submitted() is True  # the template's
    assert submitted("--no-oom-retry-grow") is False
    assert submitted("--oom-retry-grow") is True


def test_time_limit_none_lifts_a_templates_limit(client):
    """`rig-submit -t nightly --time-limit " "` said "leave --time-limit out for no limit", and
    left out the template's 6h applied: no value lifted it. `none` does; empty is still refused."""
    assert client.submit("x", template="nightly").record.time_limit == 6 * 3600
    assert client.submit("x", template="nightly", time_limit="none").record.time_limit is None
    assert client.submit("x", template="nightly", time_limit="None").record.time_limit is None
    with pytest.raises(InvalidInput, match=r"time_limit is empty .*or none for no limit$"):
        client.submit("x", template="nightly", time_limit=" ")


def test_rig_submit_says_a_multi_card_jobs_memory_is_per_card(cli_env, real_redis):
    """`rig-submit -m 20G --gpus 2` said "20.0 GiB on 2 cards", read as 20 GiB in all."""
    from click.testing import CliRunner

    from rig.cli.submit import main as submit_main

    result = CliRunner().invoke(submit_main, ["-n", "ddp", "-m", "20G", "--gpus", "2", "--", "true"])
    assert result.exit_code == 0, result.output
    assert "'ddp': 20.0 GiB on each of 2 cards, medium priority" in result.output, result.output
