"""@rig.task: what .delay() refuses at once (no Redis needed), and the job's command line."""

from __future__ import annotations

import base64
import functools
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rig
from rig.errors import InvalidInput
from rig.pytask import RigTask, SubmittedWhileImported, call_argv, loading_call


class StubClient:
    """Stands in for rig.client.Client: records what would have been submitted."""

    def __init__(self) -> None:
        self.submitted: list[tuple[list[str], dict]] = []

    def submit(self, command, **kwargs):  # noqa: ANN001, ANN201
        self.submitted.append((command, kwargs))
        return "handle"


@rig.task(gpu_memory="1G")
def top_level(x: int) -> int:
    return x + 1


def test_a_top_level_function_is_submitted_with_the_safe_command_line():
    client = StubClient()
    assert top_level.apply_async((1,), client=client) == "handle"
    command, kwargs = client.submitted[0]
    assert command == call_argv() and command[1:] == ["-P", "-m", "rig.call"]
    assert "PYTHONPATH" not in kwargs["env"]  # rig.call adds the function's folder itself


@pytest.mark.parametrize(("args", "kwargs", "said"), [
    ((1,), {"gpus": 2}, r"^top_level\(\) cannot take these arguments \(got an unexpected keyword argument 'gpus'\); "
                        r"nothing was submitted; gpus= is a job option: give it to @rig.task\(...\) or "
                        r"top_level.apply_async\(args, kwargs, gpus=...\)$"),
    ((), {}, r"^top_level\(\) cannot take these arguments \(missing a required argument: 'x'\); nothing was submitted$"),
    ((1, 2), {}, r"too many positional arguments"),
])
def test_a_call_the_function_cannot_take_is_refused_at_delay_not_failed_in_the_job(args, kwargs, said):
    """Breaker: ``train.delay(3e-4, gpus=2)`` was queued, and failed each of its attempts with
    the TypeError, minutes later."""
    client = StubClient()
    with pytest.raises(InvalidInput, match=said):
        top_level.apply_async(args, kwargs, client=client)
    assert client.submitted == []


def test_task_takes_every_job_option_submit_takes():
    """Breaker: ``@rig.task(gpu_memory="1G", oom_retry_grow=True)`` was a TypeError, though
    rig.submit and rig-submit take it (and export)."""
    import inspect

    from rig.client import Client
    from rig.pytask import JOB_OPTIONS

    submit = set(inspect.signature(Client.submit).parameters) - {"self", "command", "shell", "kind", "extra", "_batch"}
    assert submit == JOB_OPTIONS
    assert JOB_OPTIONS <= set(inspect.signature(rig.task).parameters)

    @rig.task(gpu_memory="1G", oom_retry_grow=True, export="NONE")
    def nested() -> None: ...

    assert nested.options["oom_retry_grow"] is True and nested.options["export"] == "NONE"


@rig.task(gpu_memory="1G")
def big_result(n: int) -> bytes:
    return b"x" * n


def test_a_result_too_large_to_store_fails_the_call_as_bad_result_not_retried(monkeypatch, capsys):
    """Breaker: a result over Redis' 512 MB was refused by Redis after the work was done, as
    'Redis unavailable' (exit 75, retried: the whole work again, each time)."""
    from rig import call, pytask
    from rig.failures import CALL_BAD_RESULT_EXIT

    client = StubClient()
    big_result.apply_async((2000,), client=client)
    payload = client.submitted[0][1]["extra"]["payload"]
    monkeypatch.setattr(pytask, "MAX_PAYLOAD_BYTES", 1000)
    assert call.run_call("7", payload) == (CALL_BAD_RESULT_EXIT, None)
    assert "job 7: the function returned a bytes that pickles to 20" in capsys.readouterr().err
    monkeypatch.setattr(pytask, "MAX_PAYLOAD_BYTES", 10_000)
    code, encoded = call.run_call("7", payload)
    assert code == 0 and encoded


@pytest.mark.parametrize(("options", "said"), [
    ({"gpu_memory": "lots"}, "gpu_memory: cannot read 'lots' as a size"),
    ({"gpu_memory": 4}, "gpu_memory 4 is a number of bytes"),
    ({"gpu_memory": "1G", "gpus": 0}, "gpus must be a whole number of cards from 1 to 256; got 0"),
    ({"gpu_memory": "1G", "retries": -1}, "retries must be a whole number from 0 to 100; got -1"),
    ({"gpu_memory": "1G", "time_limit": "soon"}, "time_limit: cannot read 'soon'"),
    ({"gpu_memory": "1G", "time_limit": ""}, "time_limit is empty (an unset variable?)"),
])
def test_a_malformed_option_is_refused_where_the_decorator_is_written(options, said):
    """Breaker: ``@rig.task(gpu_memory="lots")`` was accepted; the first .delay() refused it."""
    with pytest.raises(InvalidInput, match=f"^{re.escape(said)}"):
        rig.task(**options)
    assert rig.task(gpu_memory="auto") and rig.task(template="test")  # the cluster's: at .delay()


def test_a_lambda_is_refused_at_delay_with_what_to_write():
    client = StubClient()
    task = RigTask(lambda: 1, {})
    with pytest.raises(InvalidInput, match=r"cannot queue a lambda.*define it with `def NAME"):
        task.apply_async(client=client)
    assert client.submitted == []


def test_a_nested_function_is_refused_at_delay_not_at_decoration():
    def outer():
        @rig.task(gpu_memory="1G")
        def inner() -> None:
            pass
        return inner

    task = outer()  # decorating is fine: calling it here works
    task()
    with pytest.raises(InvalidInput, match=r"inner\(\) is defined inside .*outer\(\).*move it to the top level"):
        task.apply_async(client=StubClient())


def test_a_function_without_a_source_file_is_refused():
    namespace: dict = {"__name__": "__main__"}
    exec(compile("def typed_in():\n    return 1\n", "<stdin>", "exec"), namespace)  # noqa: S102
    with pytest.raises(InvalidInput, match="interactive session or notebook.*put it in a .py file"):
        RigTask(namespace["typed_in"], {}).apply_async(client=StubClient())


def test_a_name_that_does_not_lead_back_to_the_function_is_refused():
    renamed = RigTask(_helper, {})  # module attribute `_helper` is the plain function, fine
    renamed.apply_async(client=StubClient())
    _helper.__qualname__ = "no_such_name"
    try:
        with pytest.raises(InvalidInput, match="does not name the decorated"):
            renamed.apply_async(client=StubClient())
    finally:
        _helper.__qualname__ = "_helper"


def _helper() -> None:
    pass


def test_a_task_from_before_its_module_was_reloaded_says_so(tmp_path, monkeypatch):
    """Breaker (pyapi): in a notebook, ``importlib.reload(tasks)`` then ``add.delay(1, 1)`` through
    the ``add`` imported before was refused '... does not name the decorated add() (was the name
    reused or the function renamed?)': neither was; the module was run again."""
    import importlib

    (tmp_path / "reloaded_tasks.py").write_text("import rig\n@rig.task(gpu_memory='1G')\ndef add(a, b):\n"
                                                "    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("reloaded_tasks")
    old = module.add
    importlib.reload(module)
    with pytest.raises(InvalidInput, match=r"^reloaded_tasks.add is now another add\(\) \(the module was "
                                           r"reloaded, or defines add twice\) .*import it again after a reload"):
        old.apply_async((1, 1), client=StubClient())
    module.add.apply_async((1, 1), client=StubClient())


def test_a_delay_while_a_call_module_is_imported_in_a_job_raises_instead_of_submitting():
    client = StubClient()
    with loading_call("/x/train.py"), pytest.raises(SubmittedWhileImported, match=r"if __name__ =="):
        top_level.apply_async((1,), client=client)
    assert client.submitted == []
    top_level.apply_async((1,), client=client)  # outside the import: allowed (nested jobs are fine)
    assert len(client.submitted) == 1


SCRIPT = '''
import rig
from tests.unit.test_pytask import StubClient

@rig.task(gpu_memory="1G")
def train(lr):
    return lr

def submit():
    try:
        train.apply_async((0.1,), client=StubClient())
        print("SUBMITTED")
    except rig.errors.InvalidInput as exc:
        print("REFUSED:", exc)
'''


@pytest.mark.parametrize(("tail", "expected"), [
    ("submit()\n", "REFUSED: script.py line 15 submits train() outside `if __name__ == \"__main__\":`"),
    ("if True:\n    submit()\n", "REFUSED: script.py line 16 submits train()"),
    ("if __name__ == \"__main__\":\n    submit()\n", "SUBMITTED"),
    ("if '__main__' == __name__:\n    x = 1\n    submit()\n", "SUBMITTED"),
    ("import sys\nif __name__ == \"__main__\" and sys.argv[-1].endswith('.py'):  submit()\n", "SUBMITTED"),
    ("import sys\nif (\"__main__\" == __name__) and (len(sys.argv) > 0 and True):\n    submit()\n", "SUBMITTED"),
    ("if __name__ == '__main__' and False:\n    pass\nelif __name__ == '__main__':\n    submit()\n", "SUBMITTED"),
    ("if __name__ == '__main__':\n    for i in range(1):\n        if True:\n            submit()\n", "SUBMITTED"),
    ("if False:\n    pass\nelse:\n    if __name__ == '__main__':\n        submit()\n", "SUBMITTED"),
    ("if __name__ == '__main__' and False:\n    pass\nelse:\n    submit()\n", "REFUSED: script.py line 18"),
    ("if __name__ == '__main__' and False:\n    pass\nelif True:\n    submit()\n", "REFUSED: script.py line 18"),
    ("if __name__ != '__main__' or True:\n    submit()\n", "REFUSED: script.py line 16"),
    ("if __name__ == '__main__' or True:\n    submit()\n", "REFUSED: script.py line 16"),
    # Breaker (pyapi): a thread the unguarded top level starts and joins was not refused; the job's
    # import started it again, which failed the job (bad_call) after it held a card.
    ("import threading\nt = threading.Thread(target=submit)\nt.start(); t.join()\n",
     "REFUSED: script.py line 17 submits train() (from a thread it started there) outside"),
    ("import threading\nif __name__ == '__main__':\n    t = threading.Thread(target=submit)\n"
     "    t.start(); t.join()\n", "SUBMITTED"),
], ids=["top-level", "other-block", "guarded", "guarded-reversed", "and-same-line", "and-parenthesised",
        "elif-guard", "nested-in-guard", "guard-in-else", "else-of-guard", "elif-not-guard", "not-equal-or",
        "or", "thread-of-top-level", "thread-under-guard"])
def test_a_script_that_submits_from_its_unguarded_top_level_is_refused(tmp_path, tail, expected):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT + tail)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(expected), done.stdout
    if expected.startswith("REFUSED"):
        assert "put the code that submits under that guard" in done.stdout


def test_the_job_command_line_imports_rig_from_the_installation_not_a_rig_folder(tmp_path):
    """A folder named `rig` in the job's working folder (and a PYTHONPATH naming it, as the
    submitter's may) must not shadow rig: `python -P -m rig.call` finds the installed rig."""
    hostile = tmp_path / "rig"
    hostile.mkdir()
    (hostile / "__init__.py").write_text("raise SystemExit('the hostile rig folder was imported')\n")
    (hostile / "call.py").write_text("raise SystemExit('the hostile rig.call was imported')\n")
    done = subprocess.run(call_argv(), capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    # The real rig.call: no RIG_JOB_ID here, so it says so and exits 2.
    assert done.returncode == 2, done.stderr
    assert "rig.call: RIG_JOB_ID is not set" in done.stderr


def test_the_old_command_line_was_shadowed(tmp_path):
    """The bug this guards against: plain `python -m rig.call` in that folder runs its rig."""
    (tmp_path / "rig").mkdir()
    (tmp_path / "rig" / "__init__.py").write_text("raise SystemExit('hostile')\n")
    done = subprocess.run([sys.executable, "-m", "rig.call"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert "hostile" in done.stderr


def _run_script(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


#: Runs a call as the job does (rig.call.run_call, in `python -P`): the payload on stdin; prints
#: the exit code and the base64 result.
RUN_AS_JOB = ("import sys; from rig.call import run_call; code, out = run_call('7', sys.stdin.read()); "
              "print('CODE', code); print('RESULT', out)")

DEF_IN_GUARD = '''
import rig
from tests.unit.test_pytask import StubClient

def submit(task):
    try:
        task.apply_async(client=StubClient())
        print("SUBMITTED")
    except rig.errors.InvalidInput as exc:
        print("REFUSED:", exc)

{body}
'''


@pytest.mark.parametrize(("body", "expected"), [
    ("if __name__ == '__main__':\n    @rig.task\n    def inner():\n        return 1\n    submit(inner)\n",
     "REFUSED: inner() is defined inside `if __name__ == \"__main__\":` in script.py, which the job does not "
     "run when it imports script.py: define inner at the module's top level, outside the guard"),
    ("import sys\nif __name__ == '__main__' and sys.argv:\n    if True:\n        @rig.task\n        def inner():\n"
     "            return 1\n        submit(inner)\n", "REFUSED: inner() is defined inside"),
    ("try:\n    @rig.task\n    def inner():\n        return 1\nexcept ImportError:\n    pass\n"
     "if __name__ == '__main__':\n    submit(inner)\n", "SUBMITTED"),
    ("from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    @rig.task\n    def inner():\n        return 1\n"
     "if __name__ == '__main__':\n    submit(inner)\n", "SUBMITTED"),
    ("@rig.task\ndef inner():\n    return 1\nif __name__ == '__main__':\n    @rig.task\n    def inner():\n"
     "        return 2\n    submit(inner)\n", "SUBMITTED"),  # the job finds the top-level inner
], ids=["in-guard", "nested-in-guard", "in-try", "in-other-if", "also-at-top-level"])
def test_a_function_defined_inside_the_main_guard_is_refused_at_delay(tmp_path, body, expected):
    script = tmp_path / "script.py"
    script.write_text(DEF_IN_GUARD.format(body=body))
    done = _run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(expected), done.stdout


CLASSES = '''
import base64, pickle, subprocess, sys
import rig
from tests.unit.test_pytask import RUN_AS_JOB, StubClient

class Point:
    def __init__(self, x):
        self.x = x
    def __repr__(self):
        return f"Point({{self.x}})"

@rig.task
def move(p, by=1):
    return [Point(p.x + by)]

if __name__ == "__main__":
    class Local:
        pass
    client = StubClient()
    try:
        move.apply_async({args}, client=client)
    except rig.errors.InvalidInput as exc:
        print("REFUSED:", exc)
        sys.exit(0)
    payload = client.submitted[0][1]["extra"]["payload"]
    job = subprocess.run([sys.executable, "-P", "-c", RUN_AS_JOB], input=payload, capture_output=True,
                         text=True, cwd="/")
    print(job.stderr, file=sys.stderr)
    code, result = job.stdout.split()[1::2]
    if code != "0":
        print("JOB FAILED", code, job.stderr)
        sys.exit(0)
    value = pickle.loads(base64.b64decode(result))  # as rig.client's JobHandle.get does
    print("RESULT", value, type(value[0]) is Point)
'''


@pytest.mark.parametrize(("args", "expected"), [
    ("(Point(1),), {{'by': Point(2).x}}", "RESULT [Point(3)] True"),
    ("(Point(1),), {{'by': 1}}", "RESULT [Point(2)] True"),
    ("(Local(),)", "REFUSED: the class Local (passed to move()) is defined inside `if __name__ == \"__main__\":` "
     "in script.py, which the job does not run when it imports script.py: define Local at the module's top "
     "level, outside the guard"),
], ids=["class-argument-and-result", "kwargs", "class-in-guard"])
def test_classes_of_the_script_travel_to_the_job_and_back(tmp_path, args, expected):
    script = tmp_path / "script.py"
    script.write_text(CLASSES.format(args=args.replace("{{", "{").replace("}}", "}")))
    done = _run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(expected), done.stdout + done.stderr


def test_a_script_class_passed_to_a_function_of_another_module_is_refused(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import rig\nfrom tests.unit.test_pytask import StubClient, top_level\n"
                      "class Point:\n    pass\n"
                      "if __name__ == '__main__':\n    try:\n        top_level.apply_async((Point(),), client=StubClient())\n"
                      "    except rig.errors.InvalidInput as exc:\n        print('REFUSED:', exc)\n")
    done = _run_script(script)
    assert done.stdout.strip() == (
        "REFUSED: the arguments of top_level() hold the class Point of the script script.py, which the job "
        "does not import (it imports tests.unit.test_pytask): define Point in a module that both import"), done


def _run_as_job(payload: dict) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    raw = base64.b64encode(pickle.dumps(payload)).decode()
    return subprocess.run([sys.executable, "-P", "-c", RUN_AS_JOB], input=raw, capture_output=True, text=True,
                          timeout=60, cwd="/", env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("top", "said"), [
    ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr', required=True)\n"
     "args = parser.parse_args()\n", "exited (sys.exit(2))"),
    ("import sys\nmode = sys.argv[1]\n", "raised IndexError: list index out of range"),
], ids=["argparse", "argv"])
def test_top_level_code_that_fails_in_the_job_says_to_move_it_under_the_guard(tmp_path, top, said):
    script = tmp_path / "train.py"
    script.write_text(f"import rig\n{top}\n@rig.task\ndef train(lr):\n    return lr\n")
    done = _run_as_job({"module": "__main__", "qualname": "train", "file": str(script), "root": str(tmp_path),
                        "call": pickle.dumps(((0.1,), {}))})
    assert "CODE 2" in done.stdout, done.stdout + done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("rig.call: ")][-1]
    assert line == (f"rig.call: job 7: the job imports train.py to find train, so its top-level code runs in "
                    f"the job too (with no arguments in sys.argv), and that code {said}: move it under "
                    f"`if __name__ == \"__main__\":`")


def test_a_call_payload_of_the_old_shape_still_runs(tmp_path):
    (tmp_path / "mod.py").write_text("def add(a, b):\n    return a + b\n")
    done = _run_as_job({"module": "mod", "qualname": "add", "file": str(tmp_path / "mod.py"), "root": str(tmp_path),
                        "args": (1,), "kwargs": {"b": 2}})
    assert "CODE 0" in done.stdout, done.stderr
    assert pickle.loads(base64.b64decode(done.stdout.split()[3])) == 3


@pytest.mark.parametrize(("options", "said"), [
    ({"gpu_memory": "1G", "priority": "urgent"}, "unknown priority 'urgent'; choose high, medium or low"),
    ({"gpu_memory": "1G", "export": "A-B"}, "export: 'A-B' is not a variable name"),
    ({"gpu_memory": "1G", "env": ["A=1"]}, "env must be a mapping of names to values"),
    ({"gpu_memory": "1G", "env": {"CUDA_VISIBLE_DEVICES": "1"}},
     "env CUDA_VISIBLE_DEVICES: rig sets it to the cards it gives the job; ask for cards with gpus (and pool)"),
    ({"gpu_memory": "1G", "export": []}, "export: an empty list names no variable"),
])
def test_priority_export_and_env_are_refused_where_the_decorator_is_written(options, said):
    """Breaker (brkapi): ``@rig.task(priority="urgent")`` was accepted and only the first
    .delay() refused it, though nothing about a priority depends on the cluster. Breaker
    (pyapi): ``env={"CUDA_VISIBLE_DEVICES": "1"}`` too; and the decorator words its refusals
    through rig.argnames as rig.submit does (it had its own copies: ``what="gpus"``, and a
    replace of ``--export``), so no message of it names an option of rig-submit."""
    with pytest.raises(InvalidInput, match=f"^{re.escape(said)}") as refused:
        rig.task(**options)
    assert "--" not in str(refused.value)
    assert rig.task(gpu_memory="1G", priority="HIGH", export="NONE", env={"A": "1"})


def test_an_unknown_apply_async_option_names_the_closest_job_option():
    """Breaker (brkapi): ``.apply_async((1,), {}, gpu_mem="4G")`` raised Python's TypeError
    'Client.submit() got an unexpected keyword argument', a method the caller never called."""
    client = StubClient()
    with pytest.raises(InvalidInput, match=r"^\.apply_async\(\) takes no job option 'gpu_mem' \(did you mean "
                                           r"gpu_memory\?\); the job options are .*args and kwargs$"):
        top_level.apply_async((1,), {}, gpu_mem="4G", client=client)
    assert client.submitted == []


@pytest.mark.parametrize(("key", "value"), [("oom_retry_grow", "no"), ("oom_retry_grow", 0), ("shell", 0),
                                            ("shell", "false")])
def test_a_yes_no_option_that_is_no_bool_is_refused_not_taken_for_its_truth(key, value, tmp_path):
    """Breaker (brkapi): ``rig.submit([...], oom_retry_grow="no")`` stored oom_retry_grow=True,
    and ``rig.submit("echo hi", shell=0)`` ran through /bin/sh (only ``shell is False`` counted)."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    with pytest.raises(InvalidInput, match=f"^{key} must be True or False; got {re.escape(repr(value))}$"):
        client.submit("echo hi", gpu_memory="1G", **{key: value})
    assert client.store.list() == []
    if key == "oom_retry_grow":
        with pytest.raises(InvalidInput, match="^oom_retry_grow must be True or False"):
            rig.task(gpu_memory="1G", oom_retry_grow=value)


def _numpy_bool(value: bool) -> object:
    """numpy's bool (np.True_, what ``(arr > 0).any()`` gives): numpy itself where it is
    installed, else a stand-in of the same type name and module."""
    try:
        import numpy
    except ImportError:
        kind = type("bool", (), {"__module__": "numpy", "__bool__": lambda self: value,
                                 "__repr__": lambda self: f"np.{value}_"})
        return kind()
    return numpy.bool_(value)


@pytest.mark.parametrize("value", [True, False])
def test_numpy_bool_is_a_yes_no_option_like_a_bool(value, tmp_path):
    """Reviewer (review3): since f1a7bcf, ``oom_retry_grow=(losses > 0).any()`` (np.True_,
    accepted before) was refused 'oom_retry_grow must be True or False; got np.True_', and
    ``shell=np.False_`` ran through /bin/sh. numpy's bool is taken as the bool it is."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    job = client.store.get(client.submit("echo hi", gpu_memory="1G", oom_retry_grow=_numpy_bool(value),
                                         shell=_numpy_bool(value)).id)
    assert job.oom_retry_grow is value
    assert job.command == (["/bin/sh", "-c", "echo hi"] if value else ["echo", "hi"])
    rig.task(gpu_memory="1G", oom_retry_grow=_numpy_bool(value))


def test_the_readmes_python_example_submits_only_under_the_main_guard(tmp_path):
    """Breaker (brkapi): the README's example called ``train.delay(3e-4)`` at the script's top
    level, which .delay() refuses ('ex.py line 16 submits train() outside `if __name__ ==
    "__main__":`'): copied into a file, it failed. Every submission in it is under the guard."""
    from rig.pytask import _main_guard_lines

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("From Python:\n\n```python\n") + len("From Python:\n\n```python\n")
    example = tmp_path / "example.py"
    example.write_text(readme[start:readme.index("```", start)])
    guarded = _main_guard_lines(str(example)) or []
    lines = example.read_text().splitlines()
    submits = [n for n, text in enumerate(lines, 1) if re.search(r"\.delay\(|rig\.submit", text.split("#")[0])]
    assert len(submits) >= 3
    assert [n for n in submits if not any(first <= n <= last for first, last in guarded)] == []


async def _coroutine_function(x):  # noqa: ANN001, ANN202
    return x


def _generator_function(x):  # noqa: ANN001, ANN202
    yield x


@pytest.mark.parametrize(("fn", "said"), [
    (_coroutine_function, r"^_coroutine_function\(\) is an async function, which a job does not await; .*asyncio\.run"),
    (_generator_function, r"^_generator_function\(\) is a generator function: .*return a list"),
])
def test_an_async_or_generator_function_is_refused_where_it_is_decorated(fn, said):
    """Breaker (brkapi): ``@rig.task`` on an ``async def`` was accepted; its job held a card,
    never ran the body (the coroutine was not awaited) and failed as bad_result."""
    with pytest.raises(InvalidInput, match=said):
        rig.task(gpu_memory="1G")(fn)


METHODS = '''
import base64, pickle, subprocess, sys
import rig
from tests.unit.test_pytask import RUN_AS_JOB, StubClient

class Model:
    def __init__(self, scale):
        self.scale = scale

    @rig.task(gpu_memory="1G")
    def fit(self, x):
        return self.scale * x

    @classmethod
    @rig.task(gpu_memory="1G")
    def build(cls, x):
        return (cls.__name__, x)

    @staticmethod
    @rig.task(gpu_memory="1G")
    def plain(x):
        return x + 1

def as_job(handle_maker):
    client = StubClient()
    handle_maker(client)
    payload = client.submitted[0][1]["extra"]["payload"]
    job = subprocess.run([sys.executable, "-P", "-c", RUN_AS_JOB], input=payload, capture_output=True,
                         text=True, cwd="/")
    code, result = job.stdout.split()[1::2]
    assert code == "0", job.stderr
    return pickle.loads(base64.b64decode(result))

if __name__ == "__main__":
    print("HERE", Model(3).fit(2), Model.fit(Model(3), 2))
    print("JOB", as_job(lambda c: Model(3).fit.apply_async((2,), client=c)),
          as_job(lambda c: Model.fit.apply_async((Model(5), 2), client=c)),
          as_job(lambda c: Model.build.apply_async((4,), client=c)),
          as_job(lambda c: Model(1).plain.apply_async((4,), client=c)))
'''


def test_a_method_called_through_an_instance_is_queued_with_the_instance_first(tmp_path):
    """Breaker: ``K().meth.delay(1)`` was refused as ``meth() cannot take these arguments
    (missing a required argument: 'x')`` and ``K().meth(1)`` ran meth(1): the decorator did not
    bind ``self``. A decorated method now binds as a plain one does, here and in the job."""
    script = tmp_path / "script.py"
    script.write_text(METHODS)
    done = _run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["HERE 6 6", "JOB 6 10 ('Model', 4) 5"], done.stdout + done.stderr


UNPICKLABLE_INSTANCE = '''
import threading
import rig
from rig.errors import InvalidInput
from tests.unit.test_pytask import StubClient

class Trainer:
    def __init__(self):
        self.lock = threading.Lock()

    @rig.task(gpu_memory="1G")
    def fit(self, x):
        return x

if __name__ == "__main__":
    try:
        Trainer().fit.apply_async((1,), client=StubClient())
    except InvalidInput as exc:
        print(exc)
'''


def test_an_instance_that_cannot_be_pickled_is_named(tmp_path):
    """Breaker: ``Trainer().fit.delay(1)`` with a lock on the instance said "the arguments of
    Trainer.fit() cannot be pickled ...; pass plain data", though the only argument given was 1:
    the instance, sent as the first argument, is what could not travel."""
    script = tmp_path / "script.py"
    script.write_text(UNPICKLABLE_INSTANCE)
    done = _run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the Trainer instance it is called through (the job gets a pickled copy) "
                                  "or the arguments of Trainer.fit() cannot be pickled (TypeError: "), done.stdout


@pytest.mark.parametrize("wrapper", [staticmethod, classmethod])
def test_rig_task_above_staticmethod_or_classmethod_says_to_swap_them(wrapper):
    def fn(x):  # noqa: ANN001, ANN202
        return x

    with pytest.raises(InvalidInput, match=rf"^@rig.task is written above @{wrapper.__name__}; "
                                           rf"write @{wrapper.__name__} above @rig.task\(...\)"):
        rig.task(gpu_memory="1G")(wrapper(fn))


class _Int64:
    """numpy's np.int64 where numpy is not installed: a whole number that is no int (what
    ``arr.sum()`` or ``np.argmax`` gives), registered as numbers.Integral as numpy's are."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    __int__ = __index__

    def __repr__(self) -> str:
        return f"np.int64({self.value})"


def _numpy_int(value: int) -> object:
    try:
        import numpy
    except ImportError:
        import numbers

        numbers.Integral.register(_Int64)
        return _Int64(value)
    return numpy.int64(value)


def test_numpy_integers_are_whole_numbers_in_job_options(tmp_path):
    """Breaker (pyapi): ``gpus=np.int64(2)`` and ``retries=np.int32(1)`` were refused 'gpus must be
    a whole number of cards from 1 to 256; got np.int64(2)', and ``gpu_memory=np.int64(1 << 30)``
    'has no unit; write it like 1073741824G' (a Python int of bytes is taken, np.float64 too)."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    job = client.store.get(client.submit("true", gpu_memory=_numpy_int(1 << 30), gpus=_numpy_int(2),
                                         retries=_numpy_int(1), time_limit=_numpy_int(60)).id)
    assert (job.gpu_memory, job.gpus, job.max_retries, job.time_limit) == (1 << 30, 2, 1, 60)
    assert type(job.gpus) is int and type(job.max_retries) is int
    assert rig.task(gpu_memory=_numpy_int(1 << 30), gpus=_numpy_int(2), retries=_numpy_int(0))
    with pytest.raises(InvalidInput, match=r"^gpus must be a whole number of cards from 1 to 256; got 0$"):
        rig.task(gpu_memory="1G", gpus=_numpy_int(0))


def test_the_readmes_python_example_runs_another_script_than_itself():
    """Breaker (pyapi): the README's example, saved as train.py (its function is train; its jobs
    ran ``python train.py``), made each job run the example again: it submitted and waited in
    turn until all 32 slots of 8 fake cards held a waiting copy, and each kill let a waiting one
    go on to submit more (1151 jobs in two minutes). The example names its own file, and no job
    of it runs that file or the function's name as a script."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("From Python:\n\n```python\n") + len("From Python:\n\n```python\n")
    example = readme[start:readme.index("```", start)]
    own = re.match(r"# (\w+\.py):", example)
    assert own, "the example's first line names its file: # NAME.py: ..."
    commands = re.findall(r"rig\.submit\((.*)", example) + re.findall(r'"command": \[(.*?)\]', example)
    assert len(commands) == 2, commands
    for command in commands:
        assert own[1] not in command and "train.py" not in command, command


def test_a_task_of_a_script_run_with_python_m_keeps_its_relative_imports_in_the_job(tmp_path):
    """Breaker (pyapi): ``python -m pkg.runner``, whose runner.py does ``from .helpers import h``
    and submits a task of its own: the job imported runner.py as a lone script and failed
    'attempted relative import with no known parent package', after it had held a card. The
    job imports it as a member of its package, from the folder that holds the package."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def h(x):\n    return x + 100\n")
    (package / "runner.py").write_text(
        "import base64, pickle, subprocess, sys\nimport rig\nfrom .helpers import h\n"
        "from tests.unit.test_pytask import RUN_AS_JOB, StubClient\n\n"
        "@rig.task(gpu_memory='1G')\ndef go(x):\n    return h(x)\n\n"
        "if __name__ == '__main__':\n"
        "    client = StubClient()\n    go.apply_async((1,), client=client)\n"
        "    payload = client.submitted[0][1]['extra']['payload']\n"
        "    job = subprocess.run([sys.executable, '-P', '-c', RUN_AS_JOB], input=payload, capture_output=True,\n"
        "                         text=True, cwd='/')\n"
        "    print(job.stdout, job.stderr)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pkg.runner"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    code, result = done.stdout.split()[1:4:2]
    assert code == "0", done.stdout
    assert pickle.loads(base64.b64decode(result)) == 101


class _CallableObject:
    def __call__(self, x: int) -> int:
        return x

    def method(self, x: int) -> int:
        return x


@pytest.mark.parametrize(("fn", "said"), [
    (functools.partial(pow, 2), r"^@rig.task decorates a function defined with def \(or a class\); got a "
                                r"functools.partial: write a def at the top level of a module that calls it"),
    (_CallableObject(), r"^@rig.task decorates a function defined with def \(or a class\); got a "
                        r"tests.unit.test_pytask._CallableObject: "),
    (_CallableObject().method, r"^@rig.task got the bound method _CallableObject.method; decorate the method "
                               r"where its class defines it"),
], ids=["partial", "callable-object", "bound-method"])
def test_what_has_no_importable_name_is_refused_where_it_is_decorated(fn, said):
    """Breaker (pyapi): ``rig.task(...)(functools.partial(f, 1)).delay(2)`` and a callable object's
    raised AttributeError ('functools.partial' object has no attribute '__qualname__'); a bound
    method's was refused at .delay() as 'was the name reused or the function renamed?'."""
    with pytest.raises(InvalidInput, match=said):
        rig.task(gpu_memory="1G")(fn)


def test_kind_and_extra_are_rigs_own_and_refused_from_a_caller():
    """Breaker (pyapi): rig.submit(..., kind='python') and a `kind` key in submit_many's dicts were
    taken, though a job's kind is rig's to set (@rig.task does, through the gateway too)."""
    from rig.client import check_request_keys

    for key, value in (("kind", "python"), ("extra", {"payload": "x"})):
        with pytest.raises(InvalidInput, match=f"^{key!r} is rig's own: it is set by @rig.task"):
            rig.submit(["true"], gpu_memory="1G", **{key: value})
        with pytest.raises(InvalidInput, match=f"^request 2: {key!r} is rig's own"):
            check_request_keys(2, {"command": ["true"], key: value})


def test_a_python_job_without_a_call_is_refused_by_the_client_too(tmp_path):
    """Client.submit(kind='python') without @rig.task's payload queued a job that could only fail."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    with pytest.raises(InvalidInput, match="^extra may only carry a @rig.task call's payload"):
        client.submit(["true"], gpu_memory="1G", kind="python")
