"""The host's CPU as measured: container quotas from cgroup files, and who used the cores over a window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_loadguard.meters.cpu import (
    MIN_WINDOW_S,
    CpuSampler,
    CpuUse,
    affinity_cpus,
    cgroup_cpu_limit,
    usable_cores,
    usable_cpu_count,
)
from lightning_loadguard.meters.monitor import LoaderMonitor
from lightning_loadguard.meters.ranks import figure_row, figures_by_name, rank_figures, summarise
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot


def _cgroup(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    for name, text in files.items():
        path = tmp_path / "fs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "fs").mkdir(exist_ok=True)
    proc = tmp_path / "self_cgroup"
    proc.write_text(self_cgroup)
    return str(tmp_path / "fs"), str(proc)


def test_cgroup_v2_quota_on_the_process_cgroup(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/cpu.max": "400000 100000\n"})
    assert cgroup_cpu_limit(root, proc) == 4.0


def test_cgroup_v2_a_parent_limit_applies_and_the_tightest_wins(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "0::/kubepods/pod1/c1\n",
        {"kubepods/pod1/c1/cpu.max": "max 100000\n", "kubepods/pod1/cpu.max": "150000 100000\n"},
    )
    assert cgroup_cpu_limit(root, proc) == 1.5


def test_cgroup_v2_without_a_limit(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_cgroup_v2_container_sees_its_own_cgroup_as_the_mount(tmp_path: Path) -> None:
    # The path in /proc/self/cgroup does not exist inside the container's namespace: the mount is read.
    root, proc = _cgroup(tmp_path, "0::/../outside\n", {"cpu.max": "200000 100000\n"})
    assert cgroup_cpu_limit(root, proc) == 2.0


def test_cgroup_v1_quota_and_period(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n",
        {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_cpu_limit(root, proc) == 3.0


def test_cgroup_v1_no_quota_is_minus_one(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "2:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_unreadable_cgroup_files_mean_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(str(tmp_path / "missing"), str(tmp_path / "missing_proc")) is None
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": "garbage\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_usable_cores_is_the_affinity_mask_narrowed_by_the_quota(tmp_path: Path) -> None:
    cpus = len(affinity_cpus())
    root, proc = _cgroup(tmp_path, "0::/\n", {"cpu.max": f"{int(cpus * 100000 / 2)} 100000\n"})
    assert usable_cores(root, proc) == pytest.approx(cpus / 2)
    assert usable_cpu_count(root, proc) == max(1, cpus // 2)
    wide, proc2 = _cgroup(tmp_path / "w", "0::/\n", {"cpu.max": f"{cpus * 4 * 100000} 100000\n"})
    assert usable_cores(wide, proc2) == cpus  # a quota above the mask does not add cores


def test_the_hosts_cores_are_the_most_any_of_its_ranks_may_use() -> None:
    # Three ranks on host 1 whose masks and quotas leave them 2, 6 and 3 cores; one rank on host 2 with 16.
    ranks = [(1.0, 2), (1.0, 6), (1.0, 3), (2.0, 16)]
    rows = [
        figure_row(
            rank_figures(WindowSnapshot(wait_s=(0.0,), step_s=(0.1,), host=HostFacts(cpu_count=cores)), host_key=key)
        )
        for key, cores in ranks
    ]
    gathered = figures_by_name(rows)
    for rank in range(3):
        assert summarise(gathered, this_rank=rank).metrics["loadguard/host_cores"] == 6
    assert summarise(gathered, this_rank=3).metrics["loadguard/host_cores"] == 16


def test_spare_cores_take_the_tighter_of_quota_and_host() -> None:
    # A 2-core quota on an 8-CPU host that other jobs keep busy on 7 of the CPUs: 1 CPU free, 1.5 of quota.
    use = CpuUse(1.0, usable_cores=2.0, host_cores=8, loop_cores=0.5, worker_cores=0.0, busy_cores=7.0)
    assert use.other_cores == pytest.approx(6.5)
    assert use.spare_cores == pytest.approx(1.0)
    # Other ranks of this host (1.5 cores) are training, not "other" work.
    assert use.others_excluding(training_cores_on_host=2.0) == pytest.approx(5.0)


_SPIN = """
import sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
print(time.process_time())
"""


def test_sampler_counts_a_child_processes_cpu_time_as_the_workers_including_after_it_exits() -> None:
    sampler = CpuSampler()
    sampler.sample()
    child = subprocess.run([sys.executable, "-c", _SPIN, "0.3"], capture_output=True, text=True, check=True)
    use = sampler.sample(min_window_s=0.0)
    assert use is not None
    child_cpu = float(child.stdout.split()[-1])  # the child's own clock, which includes interpreter start-up
    # /proc accounts in clock ticks (10 ms); interpreter start-up is in both figures.
    assert use.worker_cores * use.window_s == pytest.approx(child_cpu, abs=0.05)
    assert use.loop_cores * use.window_s < 0.2  # the parent only waited


_SPIN_THEN_WAIT = _SPIN.replace("print(time.process_time())", "print(time.process_time(), flush=True)\ntime.sleep(30)")


@pytest.mark.parametrize("is_worker", [True, False])
def test_sampler_counts_the_loaders_live_workers_by_their_pids(is_worker: bool) -> None:
    # A live child that spun 0.3 s and now waits: a worker when the loader lists its pid, other work if not.
    child = subprocess.Popen([sys.executable, "-c", _SPIN_THEN_WAIT, "0.3"], stdout=subprocess.PIPE, text=True)
    try:
        sampler = CpuSampler(worker_pids=lambda: [child.pid] if is_worker else [])
        sampler.sample()
        assert child.stdout is not None
        child_cpu = float(child.stdout.readline())
        use = sampler.sample(min_window_s=0.0)
        assert use is not None and child.poll() is None  # still running: not in the reaped children's totals
    finally:
        child.kill()
        child.wait()
    counted = use.worker_cores * use.window_s
    if is_worker:
        # The sampler's window began after the child started: interpreter start-up may fall outside it.
        assert child_cpu - 0.15 <= counted <= child_cpu + 0.05, (counted, child_cpu)
    else:
        assert counted < 0.02


def test_sampler_counts_the_processes_own_threads_by_an_independent_clock() -> None:
    sampler = CpuSampler()
    sampler.sample()
    start = time.process_time()
    end = start + 0.2
    while time.process_time() < end:
        pass
    spent = time.process_time() - start
    use = sampler.sample(min_window_s=0.0)
    assert use is not None
    assert use.loop_cores * use.window_s == pytest.approx(spent, abs=0.03)
    assert use.worker_cores * use.window_s < 0.02


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="system-wide CPU times per CPU: Linux /proc/stat")
def test_sampler_sees_a_process_that_is_not_ours_as_other_work(tmp_path: Path) -> None:
    out = tmp_path / "cpu.txt"
    # Started through a shell that exits at once: the spinner is re-parented, not a child of the test.
    script = tmp_path / "spin.py"
    script.write_text(_SPIN)
    sampler = CpuSampler()
    sampler.sample()
    subprocess.run(f"{sys.executable} {script} 0.4 > {out} &", shell=True, check=True)
    deadline = time.monotonic() + 30
    while (not out.exists() or not out.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    use = sampler.sample(min_window_s=0.0)
    assert use is not None and use.busy_cores is not None
    spinner_cpu = float(out.read_text().split()[-1])
    # Everything else on the host adds to "other": the spinner is a lower bound (less tick rounding).
    assert use.other_cores * use.window_s >= spinner_cpu - 0.05
    assert use.worker_cores * use.window_s < 0.05


def test_sampler_first_call_starts_the_window() -> None:
    sampler = CpuSampler()
    assert sampler.sample() is None
    assert os.cpu_count()


def test_a_window_shorter_than_the_minimum_goes_on_rather_than_misread() -> None:
    sampler = CpuSampler()
    sampler.sample()
    assert sampler.sample(min_window_s=60.0) is None  # too short: no figure, the window is kept
    use = sampler.sample(min_window_s=0.0)
    assert use is not None and use.window_s > 0


def test_the_cpu_and_host_meters_leave_a_mocked_monotonic_clock_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tools and tests drive simulated time by counting `time.monotonic()` calls (Lightning's time-gated
    # validation tests do); LoadGuard's own reads must not advance such a clock.
    calls: list[float] = []

    def counting_clock() -> float:
        calls.append(0.0)
        return float(len(calls))

    from lightning_loadguard.meters.host import host_facts

    sampler = CpuSampler()
    monkeypatch.setattr(time, "monotonic", counting_clock)
    sampler.sample(min_window_s=0.0)
    sampler.sample(min_window_s=0.0)
    sampler.use_since(sampler.read(), min_window_s=0.0)
    host_facts(max_age_s=0.0)
    assert calls == []


def _spin(seconds: float) -> float:
    """Spin this thread for ``seconds`` of CPU time; the CPU time spent, by the process's own clock."""
    start = time.process_time()
    while time.process_time() < start + seconds:
        pass
    return time.process_time() - start


def test_a_window_since_a_mark_reads_the_cores_used_since_the_mark_not_the_logged_window() -> None:
    monitor = LoaderMonitor(window=8)
    monitor.sample_cpu()
    time.sleep(MIN_WINDOW_S + 0.1)
    logged = monitor.snapshot().cpu  # the rolling window: the loop slept through it
    assert logged is not None and logged.loop_cores * logged.window_s < 0.1
    mark = monitor.mark()
    spent = _spin(MIN_WINDOW_S + 0.1)
    since = monitor.snapshot(since=mark).cpu
    assert since is not None and since is not logged
    assert since.loop_cores * since.window_s == pytest.approx(spent, abs=0.05)
    # A window too short for the kernel's ticks carries the logged window's reading instead.
    assert monitor.snapshot(since=monitor.mark()).cpu is logged
