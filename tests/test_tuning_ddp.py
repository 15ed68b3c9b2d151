"""Auto-tuning under real 2-process CPU DDP: one decision for all ranks, and each rank's order untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path

from programs import run_program
from torch.utils.data import DistributedSampler

SCRIPT = Path(__file__).with_name("tuning_ddp_script.py")


def _expected(rank: int, epoch: int) -> list[int]:
    # Lightning gives each rank a DistributedSampler seeded with the global seed; its order is (seed, epoch).
    sampler = DistributedSampler(range(480), num_replicas=2, rank=rank, shuffle=True, seed=11)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_all_ranks_apply_one_decision_and_keep_their_order(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = run_program([SCRIPT, out], timeout=180, env=env, cwd=SCRIPT.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    decisions = [r["decision"] for r in ranks]
    assert decisions[0] is not None and decisions[0] == decisions[1]
    assert len(decisions[0]["candidates"]) >= 2  # measured and switched on both ranks
    assert [r["workers"] for r in ranks] == [decisions[0]["num_workers"]] * 2
    for rank, result in enumerate(ranks):
        seen = result["seen"]
        assert seen == _expected(rank, 0) + _expected(rank, 1)
