"""LoadGuard under real multi-process CPU DDP fits (gloo): the worst rank's wait; each host's workers, batches
and memory, summed from every rank's own loader."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
import pytest
from pipelines import assert_fetches_nest_in_the_profilers
from programs import run_program

from lightning_loadguard import cli
from lightning_loadguard.cli._runs import read_runs
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.model.diagnosis import STRAGGLER_GAP


def test_two_process_ddp_reports_the_slow_rank(tmp_path: Path) -> None:
    script = Path(__file__).with_name("ddp_loadguard_script.py")
    done = run_program([script, tmp_path], timeout=240, cwd=tmp_path, output=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Each rank's wait against its own clocks (fetches timed by Lightning's profiler, the loop by the module).
    # Rank 1's loader is the slow one by design, by far more than the straggler gap: the precondition of the
    # assertions below, checked on the run's own clocks.
    observed = [result["observed_wait_fraction"] for result in ranks]
    worst = 1
    assert observed[1] - observed[0] > STRAGGLER_GAP + 0.2, observed
    own = [result["own_wait_fraction"] for result in ranks]
    for result in ranks:
        # Every rank holds every rank's own figure: gathered, not guessed.
        assert result["rank_wait_fractions"] == pytest.approx(own, rel=1e-9)
        assert result["metrics"]["loadguard/worst_rank"] == worst
        assert result["processes_on_host"] == 2
        # Each rank's own figure against its clocks: fetch by fetch, its wait lies inside the profiler's (the
        # window's last steps); its loop time is the clock's over those steps but at the window's edges, where
        # its last step ends at the epoch's end and the module's at its last hook (the ranks synchronise in
        # between): they differ by less than one step's period.
        waits, fetches = result["own_wait_s"], result["clock_fetch_s"]
        assert len(waits) == 20, len(waits)
        assert_fetches_nest_in_the_profilers(tuple(waits), tuple(fetches[-len(waits) :]))
        periods = result["clock_period_s"][-len(waits) :]
        loop = sum(waits) + sum(result["own_step_s"])
        assert abs(loop - sum(periods)) < max(periods), (loop, sum(periods), max(periods))
    # The ranks publish (and meet in its collective) on the same steps, however each paces its logging.
    assert ranks[0]["published"] == ranks[1]["published"] and len(ranks[0]["published"]) >= 2
    # No rank leaves the closing gather before every rank finished it: one that exits while another still
    # receives its part aborts that one at exit.
    assert all("barrier loadguard_closing" in result["after_closing"] for result in ranks), ranks[0]["after_closing"]
    rank0 = ranks[0]
    # The logged wait is the worst rank's own.
    assert rank0["metrics"]["loadguard/wait_fraction"] == pytest.approx(own[worst], rel=1e-6)
    # One worker, prefetch 2: two batches in flight per rank, two ranks on this host.
    per_rank = 2 * rank0["batch_bytes"]
    assert rank0["inflight_host_bytes"] == 2 * per_rank
    assert rank0["metrics"]["loadguard/inflight_host_mb"] == pytest.approx(2 * per_rank / 1e6)
    # Every figure of a distributed run (the worst rank among them) is in METRICS, as on one process.
    assert "loadguard/worst_rank" in rank0["metrics"]
    assert set(rank0["metrics"]) <= set(METRICS), set(rank0["metrics"]) - set(METRICS)
    # A rank that waits clearly more than the others is named.
    assert "straggler_rank" in rank0["verdicts"]
    assert worst in rank0["straggler"].values()


@pytest.mark.slow
def test_each_rank_reports_its_own_host_summed_from_every_ranks_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three ranks (tests/ddp_hosts_script.py): ranks 0 and 1 on this machine with 2 workers x prefetch 3 and
    1 worker x prefetch 2; rank 2 told apart by LOADGUARD_HOST_KEY with 1 worker x prefetch 4. Every rank's
    LoadGuard was built and pickled under a third host's name: each must count the host it runs on."""
    script = Path(__file__).with_name("ddp_hosts_script.py")
    done = run_program(
        [script, tmp_path], timeout=240, cwd=script.parent, env=dict(os.environ, OMP_NUM_THREADS="1"), output=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    batch_bytes = 4 * (8 + 4 * 256)  # 4 samples: an int64 index and 256 float32 features each
    hosts = [
        {"processes": 2, "workers": 2 + 1, "capacity": 2 * 3 + 1 * 2},  # ranks 0 and 1
        {"processes": 1, "workers": 1, "capacity": 1 * 4},  # rank 2
    ]
    usable = len(os.sched_getaffinity(0))
    for rank, result in enumerate(ranks):
        host, metrics = hosts[rank // 2], result["metrics"]
        assert metrics["loadguard/host_processes"] == host["processes"] == result["processes_on_host"], rank
        assert metrics["loadguard/host_workers"] == host["workers"] == result["workers_on_host"], rank
        assert metrics["loadguard/host_prefetch_capacity"] == host["capacity"], rank
        assert result["inflight_host_bytes"] == host["capacity"] * batch_bytes, rank
        assert metrics["loadguard/inflight_host_mb"] == pytest.approx(host["capacity"] * batch_bytes / 1e6), rank
        queued = metrics["loadguard/host_prefetch_queued"]
        assert 0 < queued <= host["capacity"], rank  # a producer far faster than the step keeps its queues full
        assert metrics["loadguard/queued_host_mb"] == pytest.approx(queued * batch_bytes / 1e6), rank
        assert 1 <= metrics["loadguard/host_cores"] <= usable, rank
        assert 0 < metrics["loadguard/host_available_mb"] <= psutil.virtual_memory().total / 1e6, rank
        # The busiest host, named apart, alike on every rank.
        assert metrics["loadguard/hosts"] == 2
        assert metrics["loadguard/inflight_host_mb_max"] == pytest.approx(8 * batch_bytes / 1e6), rank
        # One collective per logging step: every rank's figures in one row each.
        assert result["calls"]["all_gather"] == result["calls"]["publish"] >= 2, result["calls"]
        assert re.search(rf"host: loader workers\W+{host['workers']}\b", result["summary"]), result["summary"]
        assert re.search(rf"host: prefetch capacity\W+{host['capacity']} batches", result["summary"])
    # What rank 0 logged (its own host), read back from the event files; the dashboard charts it.
    run = read_runs(tmp_path)[-1]
    assert run.scalars["loadguard/host_workers"].latest == 3
    assert run.scalars["loadguard/host_prefetch_capacity"].latest == 8
    charted = {tag for _, (_, tags) in custom_scalars_layout()["LoadGuard"].items() for tag in tags}
    assert {"loadguard/host_workers", "loadguard/host_prefetch_capacity", "loadguard/host_prefetch_queued"} <= charted
    assert cli.main(["report", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    line = next(line for line in report.splitlines() if "loadguard/host_prefetch_capacity" in line)
    assert re.search(r"\b8\b", line) and "batches" in line, line
