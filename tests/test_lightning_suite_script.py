"""``scripts/lightning_suite.sh`` and its pytest plugin ``scripts/loadguard_inject.py`` do what docs/index.md says
("Lightning's own tests, with LoadGuard in every Trainer"), run on a tiny fake checkout of Lightning's tests whose
test files build cheap Trainers (no fit) and look at the callbacks they were given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each run starts a few pytest processes that import Lightning: about 35 s in all on a quiet 2-core machine.
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lightning_suite.sh"

# What every fake test file shares: a Trainer with nothing of Lightning's own among its callbacks, so that
# `trainer.callbacks` is exactly the callbacks the test gave it plus whatever the plugin appended.
_COMMON = """\
import json
import os
from pathlib import Path

from lightning.pytorch import Callback, Trainer

from lightning_loadguard import LoadGuard


class Mine(Callback):
    pass


def trainer(**kwargs):
    return Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def injected(trainer):
    return [cb for cb in trainer.callbacks if isinstance(cb, LoadGuard)]
"""

# 1. fails only with LoadGuard: it asserts the exact list of callbacks.
_EXACT = """
def test_exact_callbacks():
    mine = Mine()
    assert trainer(callbacks=[mine]).callbacks == [mine]
"""

# 2. fails with and without LoadGuard; 3. passes always; 4. fails on its first run with LoadGuard, passes on
# every later run (a marker file makes it deterministic).
_CASES = (
    _EXACT
    + """


def test_always_fails():
    trainer()
    raise AssertionError("fails with and without LoadGuard")


def test_always_passes():
    assert isinstance(trainer(), Trainer)


def test_flaky_with_loadguard():
    marker = Path(os.environ["FAKE_SUITE_FLAKY_MARKER"])
    if injected(trainer()) and not marker.exists():
        marker.touch()
        raise AssertionError("failed by chance, with LoadGuard, once")
"""
)

# 5. passes always; writes one JSON line per run: each Trainer's callbacks as (LoadGuard?, auto_tune,
# print_summary), for callbacks given as None, as one callback and as a list.
_RECORD = """
def test_record_injected():
    mine = Mine()
    trainers = {"none": trainer(), "one": trainer(callbacks=mine), "list": trainer(callbacks=[mine])}
    seen = {
        name: [
            [isinstance(cb, LoadGuard), cb is mine, getattr(cb, "auto_tune", None), getattr(cb, "print_summary", None)]
            for cb in t.callbacks
        ]
        for name, t in trainers.items()
    }
    with open(os.environ["FAKE_SUITE_RECORD"], "a", encoding="utf-8") as out:
        out.write(json.dumps(seen) + "\\n")
"""

_FAILS = """
def test_fails_if_run():
    raise AssertionError("outside the tests this run was asked for")
"""

_PASSES = """
def test_passes():
    pass
"""


def _write(root: Path, relative: str, source: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")


def _suite(*args: str | Path, out: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LOADGUARD_", "PYTEST_ADDOPTS"))}
    environment.update(
        PYTHON=sys.executable,
        LOADGUARD_SUITE_OUT=str(out),
        LOADGUARD_SUITE_TIMEOUT="300",
        FAKE_SUITE_FLAKY_MARKER=str(tmp / "flaky.marker"),
        FAKE_SUITE_RECORD=str(tmp / "record.jsonl"),
        **env,
    )
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        cwd=tmp,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _records(tmp: Path) -> list[dict[str, list[list[object]]]]:
    return [json.loads(line) for line in (tmp / "record.jsonl").read_text(encoding="utf-8").splitlines()]


def _listed_under(stdout: str, heading: str) -> list[str]:
    """The indented lines that follow ``heading`` in the script's report."""
    lines = stdout.splitlines()
    assert heading in lines, stdout
    listed = []
    for line in lines[lines.index(heading) + 1 :]:
        if not line.startswith("  "):
            break
        listed.append(line.strip())
    return listed


class _Run:
    def __init__(self, done: subprocess.CompletedProcess[str], out: Path, tmp: Path) -> None:
        self.done, self.out, self.tmp = done, out, tmp

    def lines(self, name: str) -> list[str]:
        return (self.out / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def explicit_run(tmp_path_factory: pytest.TempPathFactory) -> _Run:
    """PATH is the folder holding tests_pytorch; the arguments name two files, not the default subset (which this
    checkout lacks: had the script used it, its first run would not complete)."""
    tmp = tmp_path_factory.mktemp("explicit")
    root = tmp / "tests"
    _write(root, "tests_pytorch/test_cases.py", _COMMON + _CASES)
    _write(root, "tests_pytorch/test_record.py", _COMMON + _RECORD)
    _write(root, "tests_pytorch/test_not_asked_for.py", _FAILS)
    out = tmp / "out"
    done = _suite(root, "tests_pytorch/test_cases.py", "tests_pytorch/test_record.py", out=out, tmp=tmp)
    return _Run(done, out, tmp)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> _Run:
    """PATH is tests_pytorch itself, no further arguments (the default subset), ``LOADGUARD_AUTO_TUNE=1``; every
    test of the subset passes, those outside it and the ignored legacy checkpoints fail if run."""
    tmp = tmp_path_factory.mktemp("default")
    root = tmp / "tests"
    for relative in (
        "loops/test_loop.py",
        "trainer/test_dataloaders.py",
        "trainer/connectors/test_connector.py",
        "checkpointing/test_checkpoint.py",
        "models/test_restore.py",
        "models/test_hooks.py",
    ):
        _write(root, f"tests_pytorch/{relative}", _PASSES)
    _write(root, "tests_pytorch/callbacks/test_record.py", _COMMON + _RECORD)
    _write(root, "tests_pytorch/checkpointing/test_legacy_checkpoints.py", _FAILS)
    _write(root, "tests_pytorch/models/test_other.py", _FAILS)
    _write(root, "tests_pytorch/trainer/test_trainer.py", _FAILS)
    _write(root, "tests_pytorch/test_outside.py", _FAILS)
    out = tmp / "out"
    done = _suite(root / "tests_pytorch", out=out, tmp=tmp, LOADGUARD_AUTO_TUNE="1")
    return _Run(done, out, tmp)


def test_a_test_failing_only_with_loadguard_is_named_and_exits_1(explicit_run: _Run) -> None:
    done = explicit_run.done
    assert done.returncode == 1, done.stdout + done.stderr
    exact = "tests_pytorch/test_cases.py::test_exact_callbacks"
    assert _listed_under(done.stdout, "tests that fail only with LoadGuard:") == [exact]
    assert explicit_run.lines("injected_only.txt") == [exact]
    assert "failed with LoadGuard: 3; also without it: 1; only with it, twice: 1; only with it once (flaky): 1" in (
        done.stdout
    )


def test_a_test_failing_without_loadguard_too_is_not_blamed_on_it(explicit_run: _Run) -> None:
    always = "tests_pytorch/test_cases.py::test_always_fails"
    assert always in explicit_run.lines("with_loadguard.failed")
    # The rerun without LoadGuard ran only the failures, and just this one failed again.
    assert explicit_run.lines("without_loadguard.failed") == [always]
    assert always not in explicit_run.lines("injected_only.txt")
    assert always not in _listed_under(explicit_run.done.stdout, "tests that fail only with LoadGuard:")


def test_a_test_failing_once_with_loadguard_is_reported_flaky(explicit_run: _Run) -> None:
    flaky = "tests_pytorch/test_cases.py::test_flaky_with_loadguard"
    assert explicit_run.lines("with_loadguard.failed") == sorted(
        [flaky, "tests_pytorch/test_cases.py::test_always_fails", "tests_pytorch/test_cases.py::test_exact_callbacks"]
    )
    assert _listed_under(explicit_run.done.stdout, "failed once with LoadGuard, then passed with it:") == [flaky]
    assert explicit_run.lines("flaky.txt") == [flaky]
    assert flaky not in explicit_run.lines("injected_only.txt")


def test_arguments_replace_the_default_subset(explicit_run: _Run) -> None:
    failed = explicit_run.lines("with_loadguard.failed")
    assert failed, explicit_run.done.stdout + explicit_run.done.stderr
    assert all(f.startswith(("tests_pytorch/test_cases.py::", "tests_pytorch/test_record.py::")) for f in failed)
    assert "test_not_asked_for" not in explicit_run.done.stdout + (explicit_run.out / "with_loadguard.log").read_text()


def test_loadguard_is_appended_without_auto_tune_by_default(explicit_run: _Run) -> None:
    # The recording test passed, so it ran once: in the first run with LoadGuard, never in the reruns.
    (record,) = _records(explicit_run.tmp)
    guard = [True, False, False, False]  # a LoadGuard, auto_tune=False, print_summary=False
    mine = [False, True, None, None]
    assert record == {"none": [guard], "one": [mine, guard], "list": [mine, guard]}


def test_auto_tune_env_turns_auto_tune_on(default_run: _Run) -> None:
    assert default_run.done.returncode == 0, default_run.done.stdout + default_run.done.stderr
    (record,) = _records(default_run.tmp)
    guard = [True, False, True, False]  # a LoadGuard, auto_tune=True, print_summary=False
    mine = [False, True, None, None]
    assert record == {"none": [guard], "one": [mine, guard], "list": [mine, guard]}


def test_no_arguments_run_the_default_subset(default_run: _Run) -> None:
    # The seven tests of the subset, the recording one included, and not the four that fail if run: one in
    # checkpointing/test_legacy_checkpoints.py (ignored), three outside the subset.
    assert "with_loadguard: 7 passed" in default_run.done.stdout, default_run.done.stdout
    assert default_run.lines("with_loadguard.failed") == []


def test_nothing_failed_prints_so_and_exits_0(default_run: _Run) -> None:
    done = default_run.done
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "no test failed with LoadGuard"
    assert not (default_run.out / "without_loadguard.log").exists()  # no rerun


def test_no_arguments_at_all_prints_usage_and_exits_2(tmp_path: Path) -> None:
    done = _suite(out=tmp_path / "out", tmp=tmp_path)
    assert done.returncode == 2
    assert "scripts/lightning_suite.sh PATH [PYTEST_ARGS...]" in done.stdout
    assert "LOADGUARD_AUTO_TUNE=1 injects LoadGuard(auto_tune=True)" in done.stdout
    assert not (tmp_path / "out").exists()


def test_a_folder_without_tests_pytorch_exits_2(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    done = _suite(tmp_path / "elsewhere", out=tmp_path / "out", tmp=tmp_path)
    assert done.returncode == 2
    assert f"{tmp_path / 'elsewhere'} holds no tests_pytorch folder" in done.stderr
    missing = _suite(tmp_path / "missing", out=tmp_path / "out", tmp=tmp_path)
    assert missing.returncode == 2
    assert not (tmp_path / "out").exists()


def test_a_run_that_does_not_complete_exits_2(tmp_path: Path) -> None:
    # pytest exits 4 on a usage error (here before it imports Lightning): that is no list of failed tests.
    _write(tmp_path / "tests", "tests_pytorch/test_passes.py", _PASSES)
    done = _suite(
        tmp_path / "tests", "tests_pytorch/test_passes.py", "--no-such-option", out=tmp_path / "out", tmp=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the with_loadguard run did not complete (exit 4)" in done.stderr


def test_a_checkout_with_its_pytest_configuration_above_tests(tmp_path: Path) -> None:
    repo = tmp_path / "lightning"
    _write(repo, "pyproject.toml", '[tool.pytest.ini_options]\naddopts = ["--strict-markers"]\n')
    _write(repo, "tests/tests_pytorch/test_cases.py", _COMMON + _EXACT)
    done = _suite(repo / "tests", "tests_pytorch/test_cases.py", out=tmp_path / "out", tmp=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [t.rsplit("/", 1)[-1] for t in _listed_under(done.stdout, "tests that fail only with LoadGuard:")] == [
        "test_cases.py::test_exact_callbacks"
    ]
