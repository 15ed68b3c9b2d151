"""Auto-tuning: LoadGuard measures the loader, tries better settings mid-epoch and keeps the fastest.

Run: ``python examples/auto_tune.py`` (CPU, about 15 s).

The loader starts with PyTorch's default ``num_workers=0``: each 30 ms step first waits about 45 ms for its
batch. With ``auto_tune`` LoadGuard measures those settings, probes candidates within a share of epoch 0,
switches the loader at the training step's position (no sample skipped or repeated) and keeps the setting
that measured fastest.
"""

from __future__ import annotations

import argparse
import warnings

from lightning.pytorch import Trainer

from lightning_loadguard import LoadGuard, TuneOptions
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=150, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")

    dataset = TimedDataset(args.batches * 8, sample_s=0.045 / 8)  # 45 ms a batch, asleep like file reads
    module = TimedModule(step_s=0.030, features=dataset.features)  # records the samples it trains on
    guard = LoadGuard(window=30, auto_tune=TuneOptions(probe_share=0.5, max_workers=4))
    trainer = Trainer(
        max_epochs=args.epochs,
        callbacks=[guard],
        logger=False,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(module, timed_loader(dataset, batch_size=8, shuffle=True))

    decision = guard.decision
    if decision is None:
        print("no decision: see the note above for why")
        return
    print(decision.table())
    print(f"\nwait fraction now: {guard.metrics['loadguard/wait_fraction']:.2f}")
    per_epoch = len(dataset)
    epochs = [sorted(module.seen[e * per_epoch : (e + 1) * per_epoch]) for e in range(args.epochs)]
    exact = all(seen == list(range(per_epoch)) for seen in epochs)
    print(f"every sample exactly once per epoch across the switches: {exact}")


if __name__ == "__main__":
    main()
