"""Running a test's program (an example, a multi-process DDP script) so that a hang explains itself.

A program that runs past its time limit is frozen with its whole process group (DDP ranks launched by
Lightning and their loader workers included), then each process in turn gets SIGABRT: with
``PYTHONFAULTHANDLER`` set, it prints every thread's Python stack on the way down. The failure opens with
where each process's threads are (one line each, the program first), then each process's stacks under a
header naming it, its parent and where its threads wait in the kernel: CI keeps the opening of a long
failure, so what decides a hang comes first.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

_IDLE = ("in _feed", "in _serve", "tqdm/_monitor.py")
"""Threads every loader process has, waiting for work: counted in the summary, not listed."""
_INNERMOST = 4
"""Frames shown for each thread in the opening summary."""
_PREFIXES = sorted({sysconfig.get_paths()["purelib"] + "/", sysconfig.get_paths()["stdlib"] + "/"}, key=len)[::-1]


@dataclass
class _Dumped:
    pid: int
    parent: int
    depth: int
    command: str
    waits: str
    stacks: str = ""


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
        stdout, before, dumped = _stacks_of_the_group(process)
        pytest.fail(
            f"{' '.join(command[1:])} ran past {timeout:.0f} s; where each process's threads were then "
            f"(innermost frames first; the program first):\n{_where(dumped)}\n"
            f"{''.join(_block(d) for d in dumped)}\n"
            f"----- the program's stdout (end)\n{stdout[-3000:]}\n----- its stderr before the dump (end)\n"
            f"{before[-3000:]}",
            pytrace=False,
        )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _stacks_of_the_group(process: subprocess.Popen[str]) -> tuple[str, str, list[_Dumped]]:
    """The program's stdout, its stderr before the dump, and every process's stacks, program first.

    The group is frozen (SIGSTOP), then each process, leaves first, is woken with SIGABRT pending and its dump
    read before the next: stacks dumped together interleave line by line and cannot be read."""
    dumped = [
        _Dumped(pid, parent, depth, command, _kernel_waits(pid)) for pid, parent, depth, command in _group(process.pid)
    ]
    # The kernel waits are read before the freeze, which would be all they show.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGSTOP)
    err = process.stderr
    assert err is not None
    os.set_blocking(err.fileno(), False)
    before = _drain(err.fileno())
    for one in sorted(dumped, key=lambda d: -d.depth):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(one.pid, signal.SIGABRT)
            os.kill(one.pid, signal.SIGCONT)
        _wait_ended(one.pid)
        one.stacks = _drain(err.fileno())
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    os.set_blocking(err.fileno(), True)
    try:
        stdout, rest = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        stdout, rest = "", ""
    if dumped:
        dumped[-1].stacks += rest
    return stdout, before, dumped


def _group(root: int) -> list[tuple[int, int, int, str]]:
    """The program and its descendants, level by level: (pid, parent pid, depth below the program, command)."""
    found: list[tuple[int, int, int, str]] = []
    with contextlib.suppress(psutil.Error):
        level, depth = [(psutil.Process(root), 0)], 0
        while level:
            below = []
            for process, parent in level:
                with contextlib.suppress(psutil.Error):
                    found.append((process.pid, parent, depth, " ".join(process.cmdline())[:300]))
                    below.extend((child, process.pid) for child in process.children())
            level, depth = below, depth + 1
    return found


def _threads(stacks: str) -> list[tuple[str, list[str]]]:
    """faulthandler's dump as (thread header, frame lines, innermost first)."""
    threads: list[tuple[str, list[str]]] = []
    for line in stacks.splitlines():
        if re.match(r"(Current thread|Thread) 0x", line):
            threads.append((line.split(" (most recent")[0], []))
        elif threads and line.startswith("  "):
            threads[-1][1].append(line.strip())
    return threads


def _frame(line: str) -> str:
    """``File "path", line N in name`` as ``path:N name``."""
    found = re.match(r'File "(.*)", line (\d+) in (.*)', line)
    return f"{_unprefixed(found[1])}:{found[2]} {found[3]}" if found else line


def _unprefixed(path: str) -> str:
    return next((path[len(prefix) :] for prefix in _PREFIXES if path.startswith(prefix)), path)


def _short(line: str) -> str:
    for prefix in _PREFIXES:
        line = line.replace(f'"{prefix}', '"')
    return line


def _where(dumped: list[_Dumped]) -> str:
    lines = []
    for one in dumped:
        threads = _threads(one.stacks)
        busy = [(header, frames) for header, frames in threads if not _idle(frames)]
        idle = len(threads) - len(busy)
        lines.append(f"  pid {one.pid} (parent {one.parent}, depth {one.depth}): {len(threads)} threads, {idle} idle")
        for header, frames in busy:
            lines.append(f"    {header}: {' < '.join(map(_frame, frames[:_INNERMOST])) or '(no frames)'}")
    return "\n".join(lines)


def _idle(frames: list[str]) -> bool:
    # The wait itself is innermost (threading's Condition.wait); what waits is a frame or two out.
    return any(word in frame for frame in frames[:4] for word in _IDLE)


def _block(one: _Dumped) -> str:
    kept = [line for line in one.stacks.splitlines() if not line.startswith("Extension modules:")]
    return f"\n===== pid {one.pid} (parent {one.parent}, depth {one.depth}) {one.command}\n{one.waits}" + "\n".join(
        _short(line) for line in kept
    )


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
