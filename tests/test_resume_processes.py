"""Resume cases that need real processes: DDP on 2 CPU ranks (gloo), a SIGKILL, and world-size changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from programs import run_program
from resume_harness import run

from lightning_loadguard.position import PositionMismatchError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

HARNESS = Path(__file__).with_name("resume_harness.py")
# 24 samples, batch 3: 8 batches an epoch on one rank, 4 on each of two.
BASE = {"n": 24, "batch_size": 3, "epochs": 2, "seed": 5}
DDP = {"devices": 2, "strategy": "ddp"}


def _spawn(case: dict[str, Any], log: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return run_program([HARNESS, json.dumps(dict(case, log=str(log)))], timeout=timeout, env=env, cwd=HARNESS.parent)


def _read(log: Path, rank: int) -> list[int]:
    path = Path(f"{log}.rank{rank}")
    if not path.exists():
        return []
    return [i for line in path.read_text().splitlines() for i in json.loads(line)]


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted 2-rank run, and one stopped mid-epoch 1 (checkpoint kept) then resumed on 2 ranks."""
    tmp = tmp_path_factory.mktemp("ddp")
    ckpt = tmp / "ddp.ckpt"
    _ok(_spawn(dict(BASE, **DDP), tmp / "full"))
    _ok(_spawn(dict(BASE, **DDP, stop_kind="step", stop_at=6, ckpt_out=str(ckpt)), tmp / "before"))
    _ok(_spawn(dict(BASE, **DDP, ckpt_in=str(ckpt)), tmp / "after"))
    return {
        "ckpt": ckpt,
        **{name: [_read(tmp / name, r) for r in range(2)] for name in ("full", "before", "after")},
    }


def test_ddp_each_rank_resumes_its_own_shard(ddp_runs: dict[str, Any]) -> None:
    for rank in range(2):
        assert ddp_runs["before"][rank] + ddp_runs["after"][rank] == ddp_runs["full"][rank]
        assert len(ddp_runs["before"][rank]) == 6 * 3
    for epoch in range(2):
        union = [i for r in range(2) for i in ddp_runs["full"][r][epoch * 12 : (epoch + 1) * 12]]
        assert sorted(union) == list(range(24)), "the ranks' shards must form the epoch's permutation"
    assert ddp_runs["full"][0][:12] != ddp_runs["full"][0][12:]


def test_two_ranks_to_one_finishes_the_epoch_exactly_once(ddp_runs: dict[str, Any]) -> None:
    after, _, _ = run(dict(BASE, epochs=3), ckpt_in=str(ddp_runs["ckpt"]))
    seen_in_epoch_1 = [i for r in range(2) for i in ddp_runs["before"][r][12:]]  # 2 batches on each rank
    rest = after.seen[: 24 - len(seen_in_epoch_1)]
    assert sorted(seen_in_epoch_1 + rest) == list(range(24))
    assert sorted(after.seen[len(rest) :]) == list(range(24)), "the next epoch is whole, on one rank"


def test_another_world_size_with_limit_train_batches_is_refused(ddp_runs: dict[str, Any]) -> None:
    with pytest.raises(PositionMismatchError, match=r"world_size=2 on world_size=1 with limit_train_batches=3"):
        run(dict(BASE, limit=3), ckpt_in=str(ddp_runs["ckpt"]))


def test_one_rank_to_two_finishes_the_epoch_exactly_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "one.ckpt"
    before, _, _ = run(dict(BASE, stop_kind="step", stop_at=10), ckpt_out=str(ckpt))
    _ok(_spawn(dict(BASE, **DDP, ckpt_in=str(ckpt)), tmp_path / "after"))
    after = [_read(tmp_path / "after", r) for r in range(2)]
    consumed = before.seen[24:]
    assert len(consumed) == 6
    assert len(after[0]) == len(after[1]) == 9
    assert sorted(consumed + after[0] + after[1]) == list(range(24))


def test_sigkill_after_a_checkpoint_resumes_from_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "kill.ckpt"
    case = dict(BASE, n=20, batch_size=4, epochs=2)
    proc = _spawn(dict(case, stop_kind="step", stop_at=7, ckpt_out=str(ckpt), kill=True), tmp_path / "killed")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    before = _read(tmp_path / "killed", 0)
    assert len(before) == 7 * 4
    after, _, _ = run(case, ckpt_in=str(ckpt))
    full, _, _ = run(case)
    assert before + after.seen == full.seen


@pytest.mark.slow
def test_without_loader_seed_or_pl_global_seed_rank_0s_drawn_seed_is_every_ranks(tmp_path: Path) -> None:
    # docs/resume.md: with neither loader_seed nor PL_GLOBAL_SEED, rank 0 draws the seed and broadcasts it. Each
    # rank drawing its own would shard two different permutations: the ranks' shards of an epoch would then
    # repeat some samples and miss others.
    env = {k: v for k, v in os.environ.items() if k != "PL_GLOBAL_SEED"}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    case = dict(BASE, **DDP, seed=None, log=str(tmp_path / "run"), seed_out=str(tmp_path / "seed"))
    proc = run_program([HARNESS, json.dumps(case)], timeout=120, env=env, cwd=HARNESS.parent)
    _ok(proc)
    seeds = [json.loads(Path(f"{tmp_path / 'seed'}.rank{r}").read_text()) for r in range(2)]
    assert seeds[0] == seeds[1]
    assert seeds[0] != BASE["seed"]  # drawn, not the base case's loader_seed
    seen = [_read(tmp_path / "run", r) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 2 * 12
    for epoch in range(2):
        union = [i for r in range(2) for i in seen[r][epoch * 12 : (epoch + 1) * 12]]
        assert sorted(union) == list(range(24)), f"epoch {epoch}: the ranks' shards must form one permutation"
