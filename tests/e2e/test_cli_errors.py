"""Bad input and faults at the command line: one line, a non-zero exit, nothing written."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.cli.submit import main as submit_main


@pytest.fixture
def env(cli_env):
    return cli_env


def one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rig: error: "), result.output
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--gpu-memory", "12Q", "--", "true"], 2, "unknown unit 'Q'"),
        (["--gpu-memory", "0", "--", "true"], 2, "must be more than 0"),
        (["--gpu-memory", "0G", "--", "true"], 2, "more than 0"),
        (["--gpu-memory", "-3G", "--", "true"], 2, "more than 0"),
        (["--gpu-memory", "1G", "--priority", "urgent", "--", "true"], 2, "unknown priority 'urgent'"),
        # `--priority "$PRIO"` with PRIO unset: was queued at the default priority in silence
        (["--gpu-memory", "1G", "--priority", "", "--", "true"], 2, "unknown priority ''; choose high"),
        (["--gpu-memory", "1G", "--template", "test", "--priority", " ", "--", "true"], 2, "unknown priority ' '"),
        # `--time-limit "$LIMIT"` with LIMIT unset: was queued with no limit in silence (over a
        # template's too), where `--priority ""` is refused
        (["--gpu-memory", "1G", "--time-limit", "", "--", "true"], 2, "--time-limit is empty (an unset variable?)"),
        (["--gpu-memory", "1G", "--template", "finetune", "--time-limit", "", "--", "true"], 2,
         "--time-limit is empty (an unset variable?)"),
        (["--gpu-memory", "1G"], 2, "the command is empty"),
        (["--gpu-memory", "1G", "--cmd", "   "], 2, "the command is empty"),
        (["--gpu-memory", "1G", "--cmd", "x", "--", "y"], 2, "not both"),
        # `--cmd "$CMD" -- y` with CMD unset ran y, where --cmd x was refused
        (["--gpu-memory", "1G", "--cmd", "", "--", "y"], 2, "not both"),
        (["--", "true"], 2, "--gpu-memory is required"),
        (["--gpu-memory", "1G", "--gpus", "0", "--", "true"], 2, "--gpus"),
        (["--gpu-memory", "1G", "--workdir", "/nonexistent/dir", "--", "true"], 2, "not a directory"),
        # `--workdir "$RUN_DIR"` with RUN_DIR unset: the job ran in the submitter's folder
        (["--gpu-memory", "1G", "--workdir", "", "--", "true"], 2, "--workdir is empty"),
        (["--gpu-memory", "1G", "--pool", "a100", "--", "true"], 2, "unknown pool 'a100'"),
        # `--time-limit "$LIMIT"` / `--workdir "$DIR"` with the variable unset: the job ran with
        # no limit at all (a template's dropped too) / in the current folder, in silence
        (["--gpu-memory", "1G", "--time-limit", "", "--", "true"], 2, "--time-limit is empty"),
        (["--gpu-memory", "1G", "--template", "test", "--time-limit", " ", "--", "true"], 2,
         "or none for no limit"),
        (["--gpu-memory", "1G", "--workdir", "", "--", "true"], 2, "--workdir is empty"),
    ],
)
@pytest.mark.redis
def test_submit_bad_input(env, real_redis, args, code, needle):
    result = CliRunner().invoke(submit_main, args)
    one_line_error(result, code, needle)
    assert not real_redis.exists(f"{env}job:next_id")  # nothing written


@pytest.mark.redis
def test_more_memory_than_any_card_is_refused(env, real_redis):
    from rig.gpus.base import GpuReading
    from rig.keys import Keys
    from rig.ledger import Ledger
    from rig.memory import GIB

    Ledger(real_redis, Keys(env)).register_card(
        "n", GpuReading(index=0, uuid="u", model="m", total=24 * GIB),
        max_jobs=2, reserve_fraction=0.05, allowed=True, fake=True)
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "40G", "--", "python", "train.py"])
    one_line_error(result, 3, "largest card offers 22.8 GiB")
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--gpus", "2", "--", "true"])
    one_line_error(result, 3, "needs 2 cards")
    ok = CliRunner().invoke(submit_main, ["--name", "bert", "--gpu-memory", "12G", "--priority", "high",
                                          "--", "python", "train.py", "--config", "c.yaml"])
    assert ok.exit_code == 0
    job_id = ok.stdout.strip().splitlines()[0]
    assert job_id.isdigit()
    shown = CliRunner().invoke(cli, ["show", job_id])
    assert "bert" in shown.output and "python train.py --config c.yaml" in shown.output
    assert "waiting because" in shown.output


@pytest.mark.redis
@pytest.mark.parametrize("command", [["show", "4242"], ["log", "4242"], ["kill", "4242"]])
def test_unknown_job_id(env, real_redis, command):
    result = CliRunner().invoke(cli, command)
    one_line_error(result, 4, "no job with id")


@pytest.mark.redis
@pytest.mark.parametrize("command", [["show", "abc"], ["metrics", "1x"], ["retry", "x3"], ["errors", "--clear", "0"]])
def test_a_malformed_job_id_is_bad_input(env, real_redis, command):
    result = CliRunner().invoke(cli, command)
    one_line_error(result, 2, "is not a job id")


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["show", "1"], ["kill", "1"], ["log", "1"]])
def test_redis_down_names_the_url(env, monkeypatch, command):
    url = "redis://127.0.0.1:1/0"
    monkeypatch.setenv("RIG_REDIS_URL", url)
    result = CliRunner().invoke(cli, command)
    one_line_error(result, 5, f"cannot reach Redis at {url}")


def test_submit_with_redis_down(env, monkeypatch):
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:1/0")
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--", "true"])
    one_line_error(result, 5, "cannot reach Redis at redis://127.0.0.1:1/0")


@pytest.mark.redis
def test_jobs_unknown_state(env, real_redis):
    result = CliRunner().invoke(cli, ["jobs", "--state", "sleeping"])
    one_line_error(result, 2, "unknown state 'sleeping'")


@pytest.mark.redis
def test_forget_node_refusals_are_one_line(env, real_redis, monkeypatch):
    from rig.client import Identity
    from rig.gpus.base import GpuReading
    from rig.keys import Keys
    from rig.ledger import Ledger
    from rig.nodes import NodeRegistry

    keys = Keys(env)
    Ledger(real_redis, keys).register_card("gone", GpuReading(index=0, uuid="u", model="m", total=1 << 34),
                                           max_jobs=2, reserve_fraction=0.0, allowed=True, fake=True)
    NodeRegistry(real_redis, keys).register("gone", ttl=30, backend="fake", cards=1)
    one_line_error(CliRunner().invoke(cli, ["forget-node", "gone"]), 10, "node gone is up;", "rig down --node gone")
    one_line_error(CliRunner().invoke(cli, ["forget-node", "nope"]), 2, "no node named 'nope'")
    real_redis.delete(keys.node_alive("gone"))  # gone for good
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("bob", 1002))
    one_line_error(CliRunner().invoke(cli, ["forget-node", "gone"]), 8, "only an admin may forget a node")
    monkeypatch.setenv("RIG_ADMINS", "bob")
    result = CliRunner().invoke(cli, ["forget-node", "gone"])
    assert result.exit_code == 0 and result.output == "node gone forgotten with its 1 card(s) (gone/0)\n"
    assert not real_redis.exists(keys.node("gone")) and not real_redis.smembers(keys.cards)


@pytest.mark.redis
def test_ctrl_c_after_the_submission_is_stored_still_gives_the_id(env, real_redis, monkeypatch):
    """Ctrl-C after the job was stored (then: while its Flower message went out; now: while a
    replica is awaited, the one step left after the store) used to end rig-submit with exit 130
    and no word: the job ran, its id unknown."""
    from rig.client import Client

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "_confirm_replicated", interrupted)
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--", "true"])
    assert result.exit_code == 130
    job_id = result.stdout.strip()
    assert job_id.isdigit()
    assert f"job {job_id} was submitted before the interrupt and will run; `rig kill {job_id}` stops it" \
        in result.stderr


@pytest.mark.redis
def test_a_deleted_working_folder_is_one_line(env, real_redis, tmp_path, monkeypatch):
    """A shell left in a removed folder: every rig command died in a traceback (os.getcwd, for
    ./rig.toml and for PYTHONPATH's entries); now they read the other places, and a submission
    that would run there says so in one line."""
    from rig.cli.entry import _working_folder_last

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("PYTHONPATH", raising=False)
    _working_folder_last()  # raised FileNotFoundError
    monkeypatch.setenv("PYTHONPATH", ":/x")
    _working_folder_last()
    assert CliRunner().invoke(cli, ["status"]).exit_code == 0
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--", "true"])
    one_line_error(result, 2, "the current folder no longer exists", "give --workdir")
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--workdir", "rel", "--", "true"])
    one_line_error(result, 2, "--workdir rel: ")
    assert not real_redis.exists(f"{env}job:next_id")
    ok = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--workdir", str(tmp_path), "--", "true"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.redis
def test_a_command_workdir_that_is_no_folder_is_named_as_the_setting(env, real_redis, tmp_path, monkeypatch):
    """It said `--workdir /x is not a directory` to someone who gave no --workdir."""
    monkeypatch.setenv("RIG_COMMAND_WORKDIR", str(tmp_path / "nope"))
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "1G", "--", "true"])
    one_line_error(result, 2, f"command_workdir {tmp_path / 'nope'} is not a directory", "rig config")
