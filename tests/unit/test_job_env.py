"""What a job's environment holds (rig/job_env.py): the rule in one place."""

from __future__ import annotations

import pytest

from rig import job_env


def test_the_submitters_search_paths_travel_not_their_secrets_or_the_shell():
    got = job_env.from_submitter({"PATH": "/env/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64",
                                  "CUDA_HOME": "/opt/cuda", "HF_HOME": "/data/hf", "CONDA_PREFIX": "/c",
                                  "LC_ALL": "C", "MY_TOKEN": "secret", "ADMIN_SECRET": "x", "PS1": "$ ",
                                  "RIG_REDIS_PASSWORD": "pw", "CUDA_VISIBLE_DEVICES": "7"})
    assert got == {"PATH": "/env/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "CUDA_HOME": "/opt/cuda",
                   "HF_HOME": "/data/hf", "CONDA_PREFIX": "/c", "LC_ALL": "C"}


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RIG_JOB_ID", "RIG_ANYTHING",
                                  "USER", "LOGNAME"])
def test_rig_owned_variables_are_refused_with_one_line(name):
    reason = job_env.refuse_rig_owned({name: "3", "FINE": "1"})
    assert reason is not None and reason.startswith(f"--env {name}") and "\n" not in reason
    assert job_env.refuse_rig_owned({"HOME": "/scratch", "FINE": "1"}) is None


def test_env_name_alone_takes_the_submitters_value():
    assert job_env.resolve_names({"MY_TOKEN": None, "A": "b"}, {"MY_TOKEN": "t"}) == {"MY_TOKEN": "t", "A": "b"}
    with pytest.raises(ValueError, match="MISSING: not set in your environment"):
        job_env.resolve_names({"MISSING": None}, {})


def test_compose_layers_base_record_then_rig():
    env = job_env.compose({"HOME": "/scratch/a", "USER": "mallory", "RIG_JOB_ID": "99", "X": "1"},
                          identity=job_env.base("alice", "/home/alice", "/bin/bash"),
                          rig_vars={"RIG_JOB_ID": "3", "CUDA_VISIBLE_DEVICES": "0"})
    assert env == {"PATH": job_env.DEFAULT_PATH, "LANG": "C.UTF-8", "USER": "alice", "LOGNAME": "alice",
                   "HOME": "/scratch/a", "SHELL": "/bin/bash", "X": "1", "RIG_JOB_ID": "3",
                   "CUDA_VISIBLE_DEVICES": "0"}


def test_submit_refuses_a_rig_owned_variable(tmp_path, monkeypatch):
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import InvalidInput

    settings = load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0")
    client = Client(settings, redis_client=fakeredis.FakeRedis(decode_responses=True))
    with pytest.raises(InvalidInput, match="^env CUDA_VISIBLE_DEVICES: rig sets it"):
        client.submit(["true"], gpu_memory="1G", env={"CUDA_VISIBLE_DEVICES": "3"})
    monkeypatch.delenv("NOT_THERE", raising=False)
    with pytest.raises(InvalidInput, match="^env NOT_THERE: not set"):
        client.submit(["true"], gpu_memory="1G", env={"NOT_THERE": None})


def test_a_multiline_script_gets_a_printable_default_name():
    """Breaker: `python3 -c $'import os\\nprint(1)'` without --name was refused about --name."""
    from rig.client import _default_name

    assert _default_name(["python3", "-c", "import os\nprint(1)"], False) == "python3"  # never the script
    assert _default_name(["/bin/sh", "-c", "echo one\necho two"], True) == "echo"
    assert "\x1b" not in _default_name(["\x1b]0;x"], False)


def test_env_refusals_come_first_and_bad_types_are_one_line(tmp_path):
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import InvalidInput

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    with pytest.raises(InvalidInput, match="^env CUDA_VISIBLE_DEVICES: rig sets it"):
        client.submit(["true"], gpu_memory="1G", env={"CUDA_VISIBLE_DEVICES": None})  # unset, still rig's
    with pytest.raises(InvalidInput, match="env must be a mapping"):
        client.submit(["true"], gpu_memory="1G", env=["A=1"])


SHELL_ENV = {"PATH": "/env/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "WANDB_API_KEY": "k", "HF_TOKEN": "t",
             "CONDA_PREFIX": "/c", "HOME": "/home/a", "SHELL": "/bin/zsh", "PWD": "/w", "SSH_AUTH_SOCK": "/tmp/s",
             "RIG_REDIS_URL": "redis://x", "CUDA_VISIBLE_DEVICES": "7", "USER": "a", "SUDO_USER": "b",
             "BASH_FUNC_f%%": "() { :; }", "LD_PRELOAD": "/tmp/evil.so", "TERM": "xterm"}


def test_export_all_passes_everything_but_rigs_own_and_the_login_session():
    assert job_env.exported(SHELL_ENV) == job_env.exported(SHELL_ENV, "all") == {
        "PATH": "/env/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "WANDB_API_KEY": "k", "HF_TOKEN": "t",
        "CONDA_PREFIX": "/c"}


def test_export_none_and_names():
    assert job_env.exported(SHELL_ENV, "NONE") == {}
    assert job_env.exported(SHELL_ENV, "HF_TOKEN, PATH,NOT_SET") == {"HF_TOKEN": "t", "PATH": "/env/bin"}


@pytest.mark.parametrize("mode, words", [("HOME", "never travels"), ("CUDA_VISIBLE_DEVICES", "never travels"),
                                         ("A-B", "not a variable name"), (",", "ALL, NONE")])
def test_a_bad_export_is_one_line(mode, words):
    with pytest.raises(ValueError, match=words) as caught:
        job_env.parse_export(mode)
    assert "\n" not in str(caught.value)


def test_export_from_python_takes_a_list_of_names_and_refuses_other_types_in_one_line(tmp_path):
    """Reviewer (review3): ``rig.submit(..., export=["HF_TOKEN"])`` and
    ``@rig.task(export=("HF_TOKEN",))`` raised AttributeError ('list' object has no attribute
    'strip'), at the decorator since 5b82835. A list or tuple of names is the comma list; a
    name in it is checked as one there (a tuple was taken unchecked at submit)."""
    import fakeredis

    import rig
    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import InvalidInput

    assert job_env.parse_export(["HF_TOKEN", "PATH"]) == job_env.parse_export("HF_TOKEN,PATH") == ("HF_TOKEN", "PATH")
    assert job_env.exported(SHELL_ENV, ["HF_TOKEN", "NOT_SET"]) == {"HF_TOKEN": "t"}
    for bad, words in [(["HOME"], "never travels"), ([], "empty list"), (5, "got 5"), ([1], r"got \[1\]")]:
        with pytest.raises(ValueError, match=words) as caught:
            job_env.parse_export(bad)
        assert "\n" not in str(caught.value)
    rig.task(gpu_memory="1G", export=("HF_TOKEN",))
    with pytest.raises(InvalidInput, match="^export: HOME never travels"):
        rig.task(gpu_memory="1G", export=["HOME"])
    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    client.submit("echo hi", gpu_memory="1G", export=["PATH"])
    with pytest.raises(InvalidInput, match="HOME never travels"):
        client.submit("echo hi", gpu_memory="1G", export=["HOME"])


def test_an_environment_too_large_from_your_shell_names_the_shell_not_env(tmp_path, monkeypatch):
    """Breaker: nine exported 120 KB variables and no --env were refused as '--env: longer
    than 1048576 bytes in all', naming an option the user never gave."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import InvalidInput

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    for i in range(9):
        monkeypatch.setenv(f"BIG{i}", "x" * 120_000)
    with pytest.raises(InvalidInput) as err:
        client.submit(["true"], gpu_memory="1G")
    assert str(err.value).startswith("the job's environment (your variables") and 'export="NONE"' in str(err.value)
    with pytest.raises(InvalidInput, match="^env: bad variable name"):
        client.submit(["true"], gpu_memory="1G", env={"1A": "x"})


def test_a_process_umask_is_read_from_proc():
    import os

    old = os.umask(0o027)
    try:
        assert job_env.umask_of() == 0o027
        assert job_env.umask_of(os.getpid()) == 0o027
    finally:
        os.umask(old)
    assert job_env.umask_of(2**22 + 12345) is None  # no such process: unknown, never a guess
