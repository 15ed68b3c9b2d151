"""A 2-process CPU DDP fit with LoadGuard, where rank 1's loader is the slow one (run as a subprocess)."""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.profilers import SimpleProfiler
from pipelines import FETCH_ACTION, ClockedDataset, ClockedModule, Observed, clocked_collate, quiet_trainer

from lightning_loadguard import LoadGuard
from lightning_loadguard.synthetic import timed_loader

warnings.filterwarnings("ignore")


def main(out_dir: str) -> None:
    seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Rank 1 makes each batch in 40 ms (sleeping) with one worker; rank 0 in no time; the step takes 5 ms. Rank 1
    # then waits for most of each step, rank 0 for almost none however busy the host: the gap is the test's
    # precondition, far above the straggler gap.
    dataset = ClockedDataset(length=240, sample_s=0.010 if rank == 1 else 0.0)
    guard = LoadGuard(window=20, print_summary=False)
    published: list[int] = []
    events: list[str] = []
    publish = guard._publish

    def recorded(trainer: object, *args: object, **kwargs: object) -> None:
        published.append(trainer.global_step)  # type: ignore[attr-defined]
        events.append("publish")
        publish(trainer, *args, **kwargs)

    guard._publish = recorded  # type: ignore[method-assign]
    # The run's own clocks: Lightning's profiler times each fetch, the module the loop (see pipelines.Observed).
    profiler = SimpleProfiler()
    module = ClockedModule(step_s=0.005)
    trainer = quiet_trainer(
        strategy="ddp", devices=2, max_epochs=1, callbacks=[guard], log_every_n_steps=10, profiler=profiler
    )
    barrier = trainer.strategy.barrier

    def recorded_barrier(name: str | None = None) -> None:
        events.append(f"barrier {name}")
        barrier(name)

    trainer.strategy.barrier = recorded_barrier  # type: ignore[method-assign]
    trainer.fit(module, timed_loader(dataset, batch_size=4, num_workers=1, collate_fn=clocked_collate))
    module.fetch_s = list(profiler.recorded_durations[FETCH_ACTION])
    snapshot = guard.snapshot
    assert snapshot is not None and guard.diagnosis is not None
    epoch = Observed.of(module, 1, len(module.steps))
    result = {
        "metrics": guard.metrics,
        "published": published,
        "after_closing": events[len(events) - events[::-1].index("publish") :],
        "rank_wait_fractions": snapshot.rank_wait_fractions,
        "observed_wait_fraction": Observed.of(module, 1, guard.window).wait_fraction,
        # Step by step, this rank's window as LoadGuard measured it and the epoch as its own clocks saw it.
        "own_wait_s": list(snapshot.wait_s),
        "own_step_s": list(snapshot.step_s),
        "own_wait_fraction": snapshot.wait_fraction,
        "clock_fetch_s": list(epoch.fetch_s),
        "clock_period_s": list(epoch.period_s),
        "processes_on_host": snapshot.host.processes_on_host,
        "batch_bytes": snapshot.batch_bytes,
        "inflight_host_bytes": snapshot.inflight_host_bytes,
        "verdicts": [finding.verdict for finding in guard.diagnosis.findings],
        "straggler": {
            k: v for f in guard.diagnosis.findings if f.verdict == "straggler_rank" for k, v in f.evidence.items()
        },
    }
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1])
    # An initialized gloo group left to the interpreter's exit can abort the process (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
