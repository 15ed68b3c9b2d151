"""litdata under LoadGuard: a dataset written with ``litdata.optimize``, read with ``StreamingDataLoader``.

Run: ``python examples/litdata_loader.py`` (CPU, about 15 s; needs the ``loaders`` extra, litdata installed
with ``--no-deps``). The chunks are written to a temporary directory first; nothing is downloaded.

What a user does: add ``ResumableLoaderMixin`` to the datamodule for an exact resume. The loader keeps its own
state, which Lightning saves in every checkpoint; the mixin leaves resuming to it and ends its restore mode
when the resumed epoch is over (without it, every later epoch continues the resumed one's position).
``auto_tune=True`` keeps ``num_workers`` (the chunks are split between the workers the loader was built with,
so the order depends on the count) and says so (docs/loaders.md).
"""

from __future__ import annotations

import multiprocessing
import tempfile
from typing import Any

import litdata
import torch
from _loader_example import FEATURES, arguments, augment, fit, report
from lightning.pytorch import LightningDataModule

from lightning_loadguard import LoadGuard, ResumableLoaderMixin


def sample(index: int) -> dict[str, Any]:
    return {"index": index, "x": torch.full((FEATURES,), float(index))}


class Augmented(litdata.StreamingDataset):
    """litdata's way to transform: a subclass whose ``__getitem__`` reads a sample, then works on it."""

    def __getitem__(self, index: Any) -> dict[str, Any]:
        item = super().__getitem__(index)
        return {"index": item["index"], "x": augment(item["x"])}


class LitData(ResumableLoaderMixin, LightningDataModule):
    def __init__(self, directory: str, workers: int) -> None:
        super().__init__()
        self.directory, self.workers = directory, workers

    def train_dataloader(self) -> litdata.StreamingDataLoader:
        dataset = Augmented(self.directory, shuffle=True, seed=0)
        return litdata.StreamingDataLoader(dataset, batch_size=8, num_workers=self.workers)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], workers=2).parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        # optimize sets the process-wide start method (spawn unless told): DataLoader workers would then import
        # everything again at each epoch. Fork, torch's default on Linux, and put back what was set.
        before = multiprocessing.get_start_method(allow_none=True)
        litdata.optimize(
            fn=sample,
            inputs=list(range(args.samples)),
            output_dir=tmp,
            chunk_size=64,
            num_workers=1,
            start_method="fork",
        )
        multiprocessing.set_start_method(before, force=True)
        guard = LoadGuard(auto_tune=True, print_summary=False)
        model = fit(guard, LitData(tmp, args.workers), args.epochs)

    report(guard, model, args.samples)


if __name__ == "__main__":
    main()
