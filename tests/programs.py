"""Running a test's program (an example, a multi-process DDP script) so that a hang explains itself.

A program that runs past its time limit gets SIGABRT across its whole process group (DDP ranks launched by
Lightning and their loader workers included); with ``PYTHONFAULTHANDLER`` set, each process prints every
thread's Python stack on the way down, and the failure shows those stacks instead of a bare timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGABRT)
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()
