"""A test program that hangs fails with where each process's threads were, then each process's stacks, one
process at a time, and leaves none behind (programs.py: what a DDP hang in CI shows)."""

from __future__ import annotations

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
    with pytest.raises(pytest.fail.Exception) as failure:
        run_program([script], timeout=3)
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
