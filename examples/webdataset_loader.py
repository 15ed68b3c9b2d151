"""WebDataset under LoadGuard: tar shards split between DataLoader workers.

Run: ``python examples/webdataset_loader.py`` (CPU, about 10 s; needs the ``loaders`` extra). The shards are
written to a temporary directory first; nothing is downloaded.

What a user does: nothing beyond the usual. ``LoadGuard()`` measures and diagnoses; ``auto_tune=True`` keeps
``num_workers`` (the pipeline's ``split_by_worker`` gives each worker its own shards, so the order depends on
the count) and says so. A WebDataset pipeline keeps no state: ``ResumableLoaderMixin`` cannot resume it
exactly and says so at the first fit (docs/loaders.md).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from _loader_example import FEATURES, arguments, augment, fit, report
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard


def write_shards(directory: Path, samples: int, shards: int = 4) -> list[str]:
    """``samples`` samples (an index and a feature tensor) in ``shards`` tar files."""
    urls = []
    for s in range(shards):
        url = str(directory / f"train-{s:04d}.tar")
        with wds.TarWriter(url) as sink:
            for i in range(s * samples // shards, (s + 1) * samples // shards):
                buffer = io.BytesIO()
                torch.save(torch.full((FEATURES,), float(i)), buffer)
                sink.write({"__key__": f"{i:06d}", "index.cls": i, "x.pth": buffer.getvalue()})
        urls.append(url)
    return urls


def transform(sample: dict[str, Any]) -> dict[str, Any]:
    return {"index": sample["index.cls"], "x": augment(sample["x.pth"])}


def main() -> None:
    args = arguments(__doc__.splitlines()[0], workers=2).parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(Path(tmp), args.samples)
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().map(transform)
        loader = DataLoader(pipeline, batch_size=8, num_workers=args.workers)
        guard = LoadGuard(auto_tune=True, print_summary=False)
        model = fit(guard, loader, args.epochs)

    report(guard, model, args.samples)


if __name__ == "__main__":
    main()
