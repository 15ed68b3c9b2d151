"""Running a test's program (an example, a multi-process DDP script) so that a hang explains itself.

A program that runs past its time limit is frozen with its whole process group (DDP ranks launched by
Lightning and their loader workers included), then each process in turn gets SIGABRT: with
``PYTHONFAULTHANDLER`` set, it prints every thread's Python stack on the way down. The failure opens with
where each process's threads are (one line each, the program first), then each process's stacks under a
header naming it, its parent and where its threads wait in the kernel: CI keeps the opening of a long
failure, so what decides a hang comes first.

One hang is not the program's: a process that never left ``os.fork()``. Forking a process that has other
threads (a DDP rank: gloo's, the loader's queue feeders) copies their locks as they were; a child that
inherits one held waits for it forever, inside the C library or the interpreter's own after-fork handling,
before any Python code of the child runs. A program given an ``output`` directory runs once more after that
hang alone, what the hung run wrote there removed, and the test warns that it did.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import warnings
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
    output: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True)``; fails the test with every
    process's stacks where the program outlives ``timeout`` seconds.

    ``output``: the directory the program writes into. Where the hang is a process stuck inside ``os.fork()``
    (the module's docstring), what the run added there is removed and the program runs once more."""
    command = [sys.executable, *map(str, args)]
    environment = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    kept = set(output.iterdir()) if output is not None else set()
    done = _run_once(command, timeout, cwd, environment)
    in_fork = done.in_fork() if isinstance(done, _Hang) else []
    if in_fork and output is not None:
        for path in set(output.iterdir()) - kept:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        warnings.warn(
            f"{' '.join(command[1:])}: process {', '.join(map(str, in_fork))} never left os.fork() in "
            f"{timeout:.0f} s; ran once more. Where each process's threads were:\n{_where(done.dumped)}",
            stacklevel=2,
        )
        done = _run_once(command, timeout, cwd, environment)
    if isinstance(done, _Hang):
        pytest.fail(done.report(), pytrace=False)
    return done


@dataclass
class _Hang:
    command: list[str]
    timeout: float
    stdout: str
    stderr_before: str
    dumped: list[_Dumped]

    def in_fork(self) -> list[int]:
        """The processes whose dumping thread was inside multiprocessing's ``os.fork()`` call."""
        return [one.pid for one in self.dumped if _inside_fork(one.stacks)]

    def report(self) -> str:
        return (
            f"{' '.join(self.command[1:])} ran past {self.timeout:.0f} s; where each process's threads were then "
            f"(innermost frames first; the program first):\n{_where(self.dumped)}\n"
            f"{''.join(_block(d) for d in self.dumped)}\n"
            f"----- the program's stdout (end)\n{self.stdout[-3000:]}\n----- its stderr before the dump (end)\n"
            f"{self.stderr_before[-3000:]}"
        )


def _run_once(
    command: list[str], timeout: float, cwd: Path | str | None, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str] | _Hang:
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return _Hang(command, timeout, *_stacks_of_the_group(process))
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _inside_fork(stacks: str) -> bool:
    current = next((frames for header, frames in _threads(stacks) if header.startswith("Current thread")), [])
    return bool(current) and re.search(r'popen_fork\.py", line \d+ in _launch$', current[0]) is not None


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
