"""A test program that hangs fails with where each process's threads were, then each process's stacks, one
process at a time, and leaves none behind (programs.py: what a DDP hang in CI shows). One whose forked child
never left ``os.fork()`` runs once more, what it wrote removed; any other hang fails at once."""

from __future__ import annotations

import warnings
from pathlib import Path

import psutil
import pytest
from programs import run_program

_HANGING = """
import multiprocessing, sys, time

def waits_in_the_child():
    time.sleep(1000)

def waits_in_the_parent(children):
    for child in children:
        child.join()

if __name__ == "__main__":
    children = [multiprocessing.get_context("fork").Process(target=waits_in_the_child) for _ in range(2)]
    for child in children:
        child.start()
    print("started", flush=True)
    waits_in_the_parent(children)
"""


def test_a_hanging_program_fails_with_every_process_stack_under_its_own_header(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(_HANGING)
    with pytest.raises(pytest.fail.Exception) as failure, warnings.catch_warnings():
        warnings.simplefilter("error")  # a hang outside os.fork() is not run again, whatever the output
        run_program([script], timeout=3, output=tmp_path)
    text = str(failure.value)
    summary, *blocks = text.split("\n===== pid ")
    assert len(blocks) == 3, text
    # The opening names each process and its innermost frames, the program first: what CI keeps of a long failure.
    where = summary.splitlines()[1:]
    assert [line.split()[:2] for line in where if line.startswith("  pid")] == [["pid", b.split()[0]] for b in blocks]
    # Each thread's innermost frames, on one line: the children's sleep and the parent's join, from where they wait.
    assert [line.split(": ", 1)[1].split(" < ")[0].split()[-1] for line in where if line.startswith("    ")] == [
        "poll",
        "waits_in_the_child",
        "waits_in_the_child",
    ], summary
    pids = [int(block.split()[0]) for block in blocks]
    parent, children = blocks[0], blocks[1:]
    # Each block the stack of its own process only: the program's, then its children's, each naming its parent.
    assert "waits_in_the_parent" in parent and "waits_in_the_child" not in parent, parent
    for child in children:
        assert "waits_in_the_child" in child and "waits_in_the_parent" not in child, child
        assert f"(parent {pids[0]}, depth 1)" in child
        assert "thread" in child and "waits in" in child
    assert "started" in text.split("----- the program's stdout")[1]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


_FORK_HANGS = """
import functools, multiprocessing, os, sys, time
from pathlib import Path

out, attempts, hanging = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
attempt = len(attempts.read_text()) + 1 if attempts.exists() else 1
attempts.write_text("x" * attempt)
(out / f"attempt{attempt}.txt").write_text("written")
if attempt <= hanging:
    # The child waits in C inside os.fork(), before any Python code of its own: as one that inherited a held lock.
    os.register_at_fork(after_in_child=functools.partial(time.sleep, 1000))

def child():
    pass

if __name__ == "__main__":
    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join()
    print("done", flush=True)
"""


def _fork_hangs(tmp_path: Path, hanging: int) -> tuple[list[str], Path, Path]:
    script, out = tmp_path / "fork_hangs.py", tmp_path / "out"
    script.write_text(_FORK_HANGS)
    out.mkdir()
    (out / "made_by_the_test.txt").write_text("kept")
    return [str(script), str(out), str(tmp_path / "attempts"), str(hanging)], out, tmp_path / "attempts"


def test_a_child_that_never_left_fork_runs_the_program_once_more_without_what_the_hung_run_wrote(
    tmp_path: Path,
) -> None:
    args, out, attempts = _fork_hangs(tmp_path, hanging=1)
    with pytest.warns(UserWarning, match=r"never left os\.fork\(\) in 4 s; ran once more") as warned:
        done = run_program(args, timeout=4, output=out)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert attempts.read_text() == "xx"
    assert sorted(path.name for path in out.iterdir()) == ["attempt2.txt", "made_by_the_test.txt"]
    # The warning names the stuck child and where it was: inside fork, called by multiprocessing's Process.start.
    assert "_launch" in str(warned[0].message), warned[0].message


@pytest.mark.slow  # each waits out its 4 s limit, twice for the first; the case above runs by default
def test_a_child_that_never_left_fork_twice_fails_with_the_stacks(tmp_path: Path) -> None:
    args, out, attempts = _fork_hangs(tmp_path, hanging=2)
    with pytest.raises(pytest.fail.Exception) as failure, pytest.warns(UserWarning, match="never left"):
        run_program(args, timeout=4, output=out)
    assert attempts.read_text() == "xx"
    assert "ran past 4 s" in str(failure.value) and "popen_fork.py" in str(failure.value)


@pytest.mark.slow  # each waits out its 4 s limit, twice for the first; the case above runs by default
def test_without_an_output_directory_a_child_that_never_left_fork_fails_at_once(tmp_path: Path) -> None:
    args, _, attempts = _fork_hangs(tmp_path, hanging=1)
    with pytest.raises(pytest.fail.Exception, match="ran past 4 s"), warnings.catch_warnings():
        warnings.simplefilter("error")
        run_program(args, timeout=4)
    assert attempts.read_text() == "x"
