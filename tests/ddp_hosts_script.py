"""Run by test_ddp.py: a 3-process CPU DDP fit whose ranks run different loaders on two hosts.

Ranks 0 and 1 share this machine's hostname (2 workers x prefetch 3, and 1 worker x prefetch 2); rank 2 is told
apart by ``LOADGUARD_HOST_KEY`` (1 worker x prefetch 4). Every rank's LoadGuard is built while that variable
names a third host, and pickled and unpickled (as a launcher that ships callbacks to its ranks would) before
its rank sets the variable as its host needs: the host counted must be the one the rank runs on. Each rank
writes what it reported; rank 0 also logs to TensorBoard under the output directory.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import warnings
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger
from pipelines import leave_process_group, quiet_trainer

from lightning_loadguard import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

warnings.filterwarnings("ignore")

LOADERS = {0: (2, 3), 1: (1, 2), 2: (1, 4)}
"""Each rank's (num_workers, prefetch_factor)."""

HOSTS = {0: None, 1: None, 2: "node-b"}
"""Each rank's LOADGUARD_HOST_KEY (``None``: unset, the hostname counts)."""

BATCH, FEATURES = 4, 256


def main(out_dir: str) -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ["LOADGUARD_HOST_KEY"] = "the-launchers-host"
    guard = pickle.loads(pickle.dumps(LoadGuard(window=10, print_summary=False)))
    host = HOSTS[rank]
    if host is None:
        del os.environ["LOADGUARD_HOST_KEY"]
    else:
        os.environ["LOADGUARD_HOST_KEY"] = host
    workers, prefetch = LOADERS[rank]
    loader = timed_loader(
        TimedDataset(3 * BATCH * 40, features=FEATURES), batch_size=BATCH, num_workers=workers, prefetch_factor=prefetch
    )
    trainer = quiet_trainer(
        strategy="ddp",
        devices=3,
        max_steps=30,
        callbacks=[guard],
        log_every_n_steps=10,
        logger=TensorBoardLogger(out_dir, name="run"),
    )
    # The collectives LoadGuard's logging steps cost: one all_gather each.
    calls = {"publish": 0, "all_gather": 0}

    def counted(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def call(*args: object, **kwargs: object) -> object:
            calls["publish" if name == "_publish" else name] += 1
            return original(*args, **kwargs)

        setattr(owner, name, call)

    counted(guard, "_publish")
    counted(trainer.strategy, "all_gather")
    trainer.fit(TimedModule(step_s=0.01, features=FEATURES), loader)
    snapshot = guard.snapshot
    assert snapshot is not None and guard.diagnosis is not None
    result = {
        "metrics": guard.metrics,
        "summary": guard.summary(),
        "calls": calls,
        "processes_on_host": snapshot.host.processes_on_host,
        "workers_on_host": snapshot.host.workers_on_host,
        "inflight_host_bytes": snapshot.inflight_host_bytes,
    }
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
    leave_process_group()
