"""A test program that hangs fails with each of its processes' stacks, one process at a time, and leaves none
behind (programs.py: what a DDP hang in CI shows)."""

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
    assert "started" in text
    blocks = text.split("===== pid ")[1:]
    assert len(blocks) == 3, text
    pids = [int(block.split()[0]) for block in blocks]
    # Leaves first, each block the stack of its own process only: the children's, then the parent's.
    for child in blocks[:2]:
        assert "waits_in_the_child" in child and "waits_in_the_parent" not in child, child
        assert "thread" in child and "waits in" in child
    assert "waits_in_the_parent" in blocks[2] and "waits_in_the_child" not in blocks[2], blocks[2]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
