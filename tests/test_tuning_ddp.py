"""Auto-tuning under real 2-process CPU DDP: one decision for all ranks, and each rank's order untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from programs import run_program
from torch.utils.data import DistributedSampler
from tuning_ddp_script import RETUNE_EPOCHS

SCRIPT = Path(__file__).with_name("tuning_ddp_script.py")


def _expected(rank: int, epoch: int) -> list[int]:
    # Lightning gives each rank a DistributedSampler seeded with the global seed; its order is (seed, epoch).
    sampler = DistributedSampler(range(480), num_replicas=2, rank=rank, shuffle=True, seed=11)
    sampler.set_epoch(epoch)
    return list(sampler)


def _fit_with_output(tmp_path: Path, mode: str | None = None, timeout: float = 180) -> tuple[Any, list[dict[str, Any]]]:
    """The script's 2-rank fit (``mode``: its fault or ``retune``): the finished process and each rank's record."""
    out = tmp_path / "ddp"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = run_program(
        [SCRIPT, out, *([mode] if mode else [])], timeout=timeout, env=env, cwd=SCRIPT.parent, output=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


def _fit(tmp_path: Path, mode: str | None = None, timeout: float = 180) -> list[dict[str, Any]]:
    return _fit_with_output(tmp_path, mode, timeout)[1]


def test_all_ranks_apply_one_decision_and_keep_their_order(tmp_path: Path) -> None:
    ranks = _fit(tmp_path)
    decisions = [r["decision"] for r in ranks]
    assert decisions[0] is not None and decisions[0] == decisions[1]
    assert len(decisions[0]["candidates"]) >= 2  # measured and switched on both ranks
    assert [r["workers"] for r in ranks] == [decisions[0]["num_workers"]] * 2
    for rank, result in enumerate(ranks):
        seen = result["seen"]
        assert seen == _expected(rank, 0) + _expected(rank, 1)
        # One all_gather per logging step and one per tuning window: each rank's figures travel as one row.
        calls = result["calls"]
        assert calls["windows"] >= 2 and calls["all_gather"] == calls["logging_steps"] + calls["windows"], calls


@pytest.mark.slow
def test_ranks_whose_own_readings_differ_plan_alike_from_rank_0s_figures(tmp_path: Path) -> None:
    # Each rank's host readings, worker starts and clocks are its own (rank 1 here reads no free memory). A planner
    # that planned from them would take other steps than rank 0's (a window ending elsewhere, a restart skipped, a
    # decision where rank 0 probes on), and the ranks would meet in different collectives for good (a hang seen in
    # CI). Every rank plans from rank 0's figures, window for window.
    ranks = _fit(tmp_path, "rank_figures", timeout=120)
    planned = [r["planned"] for r in ranks]
    assert len(planned[0]) >= 2 and planned[0] == planned[1]
    assert planned[0][0][0] != 1  # rank 0's own reading of its free RAM, on both ranks
    decisions = [r["decision"] for r in ranks]
    assert decisions[0] is not None and decisions[0] == decisions[1]
    assert len(decisions[0]["candidates"]) >= 2
    assert [r["workers"] for r in ranks] == [decisions[0]["num_workers"]] * 2
    for rank, result in enumerate(ranks):
        assert result["seen"] == _expected(rank, 0) + _expected(rank, 1)


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "step"), [("window", "measuring the window"), ("record", "planning the next probe")])
def test_a_tuner_step_that_fails_on_one_rank_stops_tuning_on_every_rank(tmp_path: Path, fault: str, step: str) -> None:
    # Rank 1's tuner fails at its second window. Had it stopped alone, rank 0 would wait for it in the tuner's
    # next collective for good: every rank stops at the same point, back on the user's settings, in order.
    proc, ranks = _fit_with_output(tmp_path, fault)
    assert [r["decision"] for r in ranks] == [None, None]
    assert [r["workers"] for r in ranks] == [1, 1]  # the user's settings
    for rank, result in enumerate(ranks):
        assert result["seen"] == _expected(rank, 0) + _expected(rank, 1)
    assert f"auto-tuning stopped: {step} failed (on another rank)" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_a_reduction_of_the_ranks_figures_that_fails_on_one_rank_leaves_the_collectives_paired(tmp_path: Path) -> None:
    # Rank 1 cannot reduce the gathered figures at its second logging step. Were the gather switched off with
    # it, rank 1 would skip it from then on and rank 0 would wait in it for good (or meet the tuner's
    # collectives instead): the gather goes on on every rank, and the tuner decides as before.
    ranks = _fit(tmp_path, "summarise")
    assert ranks[0]["decision"] is not None and ranks[0]["decision"] == ranks[1]["decision"]
    for rank, result in enumerate(ranks):
        assert result["seen"] == _expected(rank, 0) + _expected(rank, 1)


@pytest.mark.slow
def test_a_change_after_the_decision_is_probed_again_on_every_rank_in_each_ranks_order(tmp_path: Path) -> None:
    # test_retune_fit.py's data phase turns 25 times heavier from the first epoch after the decision (epoch 2 at most):
    # the ranks' watches read their windows at the same logging steps, agree that the change held, and probe again
    # together.
    ranks = _fit(tmp_path, "retune", timeout=300)
    decisions = [r["decision"] for r in ranks]
    assert decisions[0] is not None and decisions[0] == decisions[1]
    assert decisions[0]["retunes"] >= 1 and decisions[0]["num_workers"] > 1, decisions[0]
    assert [r["workers"] for r in ranks] == [decisions[0]["num_workers"]] * 2
    for rank, result in enumerate(ranks):
        assert result["seen"] == [i for epoch in range(RETUNE_EPOCHS) for i in _expected(rank, epoch)]
