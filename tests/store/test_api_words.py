"""A refused request names what its caller typed: the Python API's keyword arguments
(``gpus``, ``gpu_memory``) from rig.submit / submit_many / @rig.task, rig-submit's options
(``--gpus``) from the command line (rig.argnames)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from rig.argnames import python_words
from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput, Unschedulable
from tests.store.test_gateway import gateway  # noqa: F401 - the fixture
from tests.unit.test_pytask import _numpy_int


@pytest.fixture
def gateway_client(gateway):  # noqa: F811 - the fixture imported above
    """A client that reaches rig through a gateway (tests.store.test_gateway's)."""
    from rig.gateway.client import GatewayClient

    served, path = gateway
    return GatewayClient(served.settings, path)


@pytest.fixture
def client(real_redis, key_prefix, tmp_path):
    api = Client(load_settings(key_prefix=key_prefix, home=tmp_path), redis_client=real_redis)
    yield api
    api.flush(10)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"gpu_memory": "4G", "gpus": 0}, "gpus must be a whole number of cards from 1 to 256; got 0"),
    ({"gpu_memory": "lots"}, "gpu_memory: cannot read 'lots' as a size"),
    ({}, "gpu_memory is required"),
    ({"gpu_memory": "4G", "retries": -1}, "retries must be a whole number from 0 to 100; got -1"),
    ({"gpu_memory": "4G", "time_limit": "forever"}, "time_limit: cannot read 'forever'"),
    ({"gpu_memory": "4G", "time_limit": ""}, "time_limit is empty (an unset variable?)"),  # not "no limit"
    ({"gpu_memory": "4G", "env": {"CUDA_VISIBLE_DEVICES": "0"}},
     "env CUDA_VISIBLE_DEVICES: rig sets it to the cards it gives the job; ask for cards with gpus (and pool)"),
    ({"gpu_memory": "4G", "export": "!!"}, "export: '!!' is not a variable name"),
    ({"gpu_memory": "4G", "name": ""}, "name is empty (an unset variable?): give a name, or leave name out"),
])
def test_python_callers_are_told_the_keyword_arguments(client, kwargs, said):
    with pytest.raises(InvalidInput) as refused:
        client.submit(["true"], **kwargs)
    assert said in str(refused.value)
    assert "--" not in str(refused.value)


def test_submit_many_and_bad_commands_speak_python(client):
    with pytest.raises(InvalidInput, match=r"^request 1: gpus must be a whole number"):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G"},
                            {"command": ["true"], "gpu_memory": "1G", "gpus": 0}])
    with pytest.raises(InvalidInput, match=r"^the command is empty; pass a string \(run by /bin/sh\) or a list"):
        client.submit("", gpu_memory="1G")
    with pytest.raises(InvalidInput, match=r"^the command must be a string or a list of strings, got int$"):
        client.submit(5, gpu_memory="1G")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=r"^submit_many takes a list of dicts .*, got str$"):
        client.submit_many("true")  # type: ignore[arg-type]


def test_a_jobs_own_options_in_a_message_are_left_alone():
    assert python_words("--gpus 0; `rig templates`; python t.py --gpus-per-node 2 --cmd x") == \
        "gpus 0; `rig templates`; python t.py --gpus-per-node 2 --cmd x"


def test_the_command_line_keeps_its_options(cli_env):
    from rig.cli.submit import main

    result = CliRunner().invoke(main, ["--gpu-memory", "1G", "--gpus", "0", "--", "true"])
    assert result.exit_code == 2, result.output
    assert "rig: error: --gpus must be a whole number of cards from 1 to 256; got 0" in result.output
    result = CliRunner().invoke(main, ["--gpu-memory", "1G", "--cmd", ""])
    assert result.exit_code == 2, result.output
    assert "give it after `--` or with --cmd" in result.output
    # Breaker (pyapi): `--name "$RUN"` with RUN unset named the job after its command in silence.
    result = CliRunner().invoke(main, ["--gpu-memory", "1G", "--name", "", "--", "true"])
    assert result.exit_code == 2, result.output
    assert "rig: error: --name is empty (an unset variable?): give a name, or leave --name out" in result.output


def test_a_submit_many_key_that_is_no_option_names_the_closest(client):
    """Breaker (pyapi): ``rig.submit_many([{..., "gpu_mem": "2G"}])`` said 'request 0:
    Client.submit() got an unexpected keyword argument 'gpu_mem'' (a function the caller never
    called); .apply_async() already named the closest option."""
    with pytest.raises(InvalidInput, match=r"^request 1: no option 'gpu_mem' \(did you mean gpu_memory\?\)$"):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G"},
                            {"command": ["true"], "gpu_mem": "1G"}])
    with pytest.raises(InvalidInput, match=r"^request 0: no option '_batch' \(the keys are command, gpu_memory, "):
        client.submit_many([{"command": ["true"], "gpu_memory": "1G", "_batch": {}}])
    assert client.store.list() == []


def test_rig_submit_with_a_keyword_that_is_no_option_names_the_closest(monkeypatch):
    """Breaker (pyapi): ``rig.submit("true", gpu_mem="1G")`` raised TypeError 'Client.submit() got
    an unexpected keyword argument 'gpu_mem'', naming a method the caller never called."""
    import rig.client

    monkeypatch.setattr(rig.client, "default_client", lambda: pytest.fail("nothing to submit"))
    with pytest.raises(InvalidInput, match=r"^no option 'gpu_mem' \(did you mean gpu_memory\?\)$"):
        rig.client.submit("true", gpu_mem="1G")


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"template": ["test"]}, "template must be text; got list ['test']"),
    ({"pool": {"a": 1}}, "pool must be text; got dict {'a': 1}"),
    ({"name": 3}, "name must be text; got int 3"),
    ({"workdir": ["/tmp"]}, "workdir must be a folder (text or a path object); got list ['/tmp']"),
])
def test_a_word_option_of_another_type_is_one_line(client, kwargs, said):
    """Breaker (pyapi): ``template=["test"]`` / ``pool=[...]`` / ``workdir=[...]`` raised TypeError
    (unhashable type: 'list'), ``name=3`` AttributeError ('int' object has no attribute 'strip'),
    from rig.submit; @rig.task took them until its first .delay(). Both refuse them in one line."""
    import rig

    with pytest.raises(InvalidInput) as refused:
        client.submit(["true"], gpu_memory="1G", **kwargs)
    assert str(refused.value) == said
    with pytest.raises(InvalidInput) as refused:
        rig.task(gpu_memory="1G", **kwargs)
    assert str(refused.value) == said
    assert client.store.list() == []


def test_a_templates_margin_is_named_where_the_size_it_made_never_fits(client, real_redis, key_prefix, tmp_path):
    """Breaker (pyapi): ``rig.submit(..., template="inference", gpu_memory="70G")`` on 80 GiB cards
    was refused 'needs 77.0 GiB per card but the largest card offers 76.0 GiB usable ...; ask for
    less memory', though 70G was asked: the template's margin (x 1.1) made 77. And a template that
    sets no memory was refused 'gpu_memory is required' without saying the template sets none."""
    from rig.gpus.fake import FakeGpuBackend
    from rig.registration import register_node

    node = load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="1x80G", home=tmp_path / "node")
    register_node(node, real_redis, FakeGpuBackend("1x80G"))
    with pytest.raises(Unschedulable, match=r"; ask for less memory \(77.0 GiB per card is 70G x margin 1.1 of "
                                            r"template 'inference'\)$"):
        client.submit(["true"], template="inference", gpu_memory="70G")
    with pytest.raises(InvalidInput, match=r"^gpu_memory is required \(template 'finetune' sets none\): "):
        client.submit(["true"], template="finetune")


@pytest.mark.parametrize("limit", [0, -1, "5", None, 1.5, True, 10**20])
def test_client_jobs_refuses_a_limit_that_is_no_count_in_one_line(client, gateway_client, limit):
    """Breaker (pyapi): ``Client().jobs(limit=-1)`` listed every job (the CLI refuses it), "5" and
    None were TypeErrors, 1.5 and 10**20 a Redis ResponseError, ``limit=np.int64(5)`` a redis
    DataError; ``state=3`` an AttributeError. The CLI's rule (check_limit), in Python's words,
    directly and through the gateway (whose server said 'limit must be a positive whole number')."""
    for api in (client, gateway_client):
        with pytest.raises(InvalidInput, match=rf"^limit must be 1 or more, at most 1,000,000,000 \(how many "
                                               rf"jobs to list\), got {re.escape(repr(limit))}$"):
            api.jobs(limit=limit)
        with pytest.raises(InvalidInput, match=r"^state must be a JobState or its name"):
            api.jobs(state=3)  # type: ignore[arg-type]
    assert client.jobs(limit=_numpy_int(5)) == []
    assert gateway_client.jobs("pending", limit=_numpy_int(5)) == []



def test_wait_takes_numpys_whole_number_of_seconds(client):
    """Breaker (pyapi): ``handle.wait(np.int64(30))`` was refused 'timeout must be a number of
    seconds, 0 or more'; numpy's float64 was taken."""
    handle = client.submit(["true"], gpu_memory="1G")
    with pytest.raises(TimeoutError):
        handle.wait(_numpy_int(0))


@pytest.mark.parametrize(("value", "kind"), [(b"x", "bytes b'x'"), (True, "bool True"), (["x"], "list ['x']")])
def test_an_env_value_that_is_no_text_number_or_path_is_refused(client, value, kind):
    """Breaker (pyapi): ``env={"A": b"x"}`` ran the job with A="b'x'" (str() of the bytes), and
    ``{"A": True}`` with A="True"; a path or a number is still written as text."""
    with pytest.raises(InvalidInput) as refused:
        client.submit(["true"], gpu_memory="1G", env={"A": value})
    assert str(refused.value) == (f"env A: give its value as text (a number or a path is written as text), "
                                  f"or None for your own; got {kind}")
    with pytest.raises(InvalidInput, match="^env A: give its value as text"):
        import rig

        rig.task(gpu_memory="1G", env={"A": value})
    from pathlib import Path

    job = client.submit(["true"], gpu_memory="1G", env={"A": Path("/tmp/x"), "B": 1.5, "C": _numpy_int(3)}).record
    assert (job.env["A"], job.env["B"], job.env["C"]) == ("/tmp/x", "1.5", "3")


def test_a_command_lists_items_are_text_numbers_or_paths(client, gateway_client):
    """Breaker (pyapi): ``rig.submit(["python", b"t.py"])`` ran ``python "b't.py'"`` (str() of the
    bytes), ``[..., True]`` passed "True"; ``rig.submit(Path("/bin/true"))`` was refused though a
    list of paths was taken. Directly and through the gateway."""
    from pathlib import Path

    for api in (client, gateway_client):
        for item, kind in ((b"t.py", "bytes b't.py'"), (True, "bool True"), (None, "NoneType None")):
            with pytest.raises(InvalidInput) as refused:
                api.submit(["python", item], gpu_memory="1G")
            assert str(refused.value) == (f"the command's item 1 must be text (a number or a path is written "
                                          f"as text); got {kind}")
        job = api.get(api.submit(["echo", Path("/tmp/a"), 3e-4, _numpy_int(2)], gpu_memory="1G").id)
        assert job.command == ["echo", "/tmp/a", "0.0003", "2"]
        assert api.get(api.submit(Path("/bin/true"), gpu_memory="1G").id).command == ["/bin/true"]
        many = api.submit_many([{"command": ("echo", Path("/x")), "gpu_memory": "1G"}])
        assert api.get(many[0].id).command == ["echo", "/x"]


def test_a_handle_pickles_as_its_job_and_equals_another_handle_of_it(client, monkeypatch):
    """Breaker (pyapi): a JobHandle given to multiprocessing raised AttributeError "Can't pickle
    local object 'on_connect.<locals>.connect_func'" (its client's Redis connection), and two
    handles of one job were unequal. Unpickled, it reads through that process's default client."""
    import pickle

    import rig.client

    monkeypatch.setattr(rig.client, "default_client", lambda: client)
    handle = client.submit(["true"], gpu_memory="1G")
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle == client.job(handle.id) and len({copy, handle}) == 1
    assert copy.instance == handle.instance and copy.state is handle.state
    assert handle != client.submit(["true"], gpu_memory="1G")
