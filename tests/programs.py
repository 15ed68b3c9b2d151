"""Running a test's program (an example, a multi-process DDP script) so that a hang explains itself.

A program that runs past its time limit is frozen with its whole process group (DDP ranks launched by
Lightning and their loader workers included), then each process in turn gets SIGABRT: with
``PYTHONFAULTHANDLER`` set, it prints every thread's Python stack on the way down, under a header naming the
process and where its threads wait in the kernel, and the failure shows those stacks instead of a bare timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
import pytest


def run_program(
    args: Sequence[str],
    *,
    timeout: float,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True)``; fails the test with every
    process's stacks where the program outlives ``timeout`` seconds."""
    command = [sys.executable, *map(str, args)]
    environment = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stacks_of_the_group(process)
        pytest.fail(
            f"{' '.join(command[1:])} ran past {timeout:.0f} s; every process's stacks at that moment follow "
            f"(stdout, then stderr)\n{stdout[-4000:]}\n{stderr[-30000:]}",
            pytrace=False,
        )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _stacks_of_the_group(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Every process's stacks, one process at a time: the group is frozen (SIGSTOP), then each process, leaves
    first, is woken with SIGABRT pending and its dump read before the next; a header names it and what its
    threads wait on in the kernel. Stacks dumped together interleave line by line and cannot be read."""
    processes = _group(process.pid)
    waits = {pid: _kernel_waits(pid) for pid, _, _ in processes}  # before the freeze, which would be all they show
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGSTOP)
    err = process.stderr
    assert err is not None
    os.set_blocking(err.fileno(), False)
    chunks = [_drain(err.fileno())]
    for pid, depth, command in sorted(processes, key=lambda p: -p[1]):
        chunks.append(f"\n===== pid {pid} (depth {depth}) {command}\n{waits[pid]}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGABRT)
            os.kill(pid, signal.SIGCONT)
        _wait_ended(pid)
        chunks.append(_drain(err.fileno()))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    os.set_blocking(err.fileno(), True)
    try:
        stdout, rest = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        return "", "".join(chunks)
    return stdout, "".join(chunks) + rest


def _group(root: int) -> list[tuple[int, int, str]]:
    """The program and its descendants: (pid, depth below the program, command line)."""
    found: list[tuple[int, int, str]] = []
    with contextlib.suppress(psutil.Error):
        level, depth = [psutil.Process(root)], 0
        while level:
            below = []
            for process in level:
                with contextlib.suppress(psutil.Error):
                    found.append((process.pid, depth, " ".join(process.cmdline())[:300]))
                    below.extend(process.children())
            level, depth = below, depth + 1
    return found


def _wait_ended(pid: int, timeout: float = 5.0) -> None:
    # A frozen parent does not reap its child: a zombie has ended too.
    deadline = time.monotonic() + timeout
    with contextlib.suppress(psutil.Error):
        child = psutil.Process(pid)
        while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)


def _kernel_waits(pid: int) -> str:
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            wchan = (task / "wchan").read_text().strip() or "-"
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            lines.append(f"  thread {task.name}: state {state}, waits in {wchan}")
    return "\n".join(lines) + "\n"


def _drain(fd: int) -> str:
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    return data.decode(errors="replace")
