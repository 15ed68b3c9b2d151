"""The synthetic pipelines' known costs: a spinning sample is a fixed amount of CPU work, as a transform is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SHARED_CORE = textwrap.dedent(
    """
    import multiprocessing, os, resource, time
    from lightning_loadguard.synthetic import TimedDataset

    def spin(ready):
        ready.set()
        while True:
            pass

    if __name__ == "__main__":
        core = {min(os.sched_getaffinity(0))}
        os.sched_setaffinity(0, core)
        ready = multiprocessing.get_context("fork").Event()
        rival = multiprocessing.get_context("fork").Process(target=spin, args=(ready,), daemon=True)
        rival.start()
        ready.wait()
        os.sched_setaffinity(rival.pid, core)
        dataset = TimedDataset(4, sample_s=COST, spin=True)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        dataset[0]
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        rival.kill()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(cpu, wall)
    """
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_spinning_sample_does_its_cpu_work_while_another_process_holds_the_core() -> None:
    # A worker preempted mid-sample must still do the sample's work: a spin to a wall-clock deadline would
    # count the time another process held the core as done, and oversubscribed workers would look free.
    cost = 0.15
    script = _SHARED_CORE.replace("COST", repr(cost))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    cpu, wall = map(float, out.stdout.split())

    assert cpu >= 0.95 * cost, (cpu, wall)  # the process's own CPU clock, read by the kernel's rusage
    assert wall >= 1.3 * cost, (cpu, wall)  # the core was shared: the work took longer than its cost
