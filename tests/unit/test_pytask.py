"""@rig.task: what .delay() refuses at once (no Redis needed), and the job's command line."""

from __future__ import annotations

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
], ids=["top-level", "other-block", "guarded", "guarded-reversed"])
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
