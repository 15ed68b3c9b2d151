"""torchvision under LoadGuard: an ``ImageFolder`` of JPEG files, decoded and randomly augmented.

Run: ``python examples/torchvision_loader.py`` (CPU, about 15 s; needs torchvision, which installs beside
``torch==2.14.1``: docs/loaders.md). The images are written to a temporary directory first; nothing is
downloaded.

What a user does: nothing beyond the usual. ``LoadGuard()`` measures and diagnoses; ``auto_tune=True`` probes
``num_workers`` and ``prefetch_factor`` like for any map-style dataset and switches mid-epoch, keeping which
samples each epoch holds and their order; the random crops and flips drawn inside workers follow torch's worker
seeding, as with any change of ``num_workers``. ``ResumableLoaderMixin`` resumes it exactly (docs/loaders.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from _loader_example import FEATURES, arguments, augment, fit, report
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.io import decode_jpeg, encode_jpeg, read_file, write_file
from torchvision.transforms import v2

from lightning_loadguard import LoadGuard, ResumableLoaderMixin

CROP = (4, FEATURES // 4)  # a grey crop of FEATURES pixels: the model's input


def write_images(directory: Path, samples: int, classes: int = 4) -> Path:
    """``samples`` JPEG files in ``classes`` class folders, ``ImageFolder``'s layout: file ``i`` is sample ``i``."""
    generator = torch.Generator().manual_seed(0)
    for c in range(classes):
        folder = directory / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(c * samples // classes, (c + 1) * samples // classes):
            pixels = torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8, generator=generator)
            write_file(str(folder / f"{i:06d}.jpg"), encode_jpeg(pixels))
    return directory


def read_jpeg(path: str) -> torch.Tensor:
    return decode_jpeg(read_file(path))


class IndexedImageFolder(ImageFolder):
    """An ``ImageFolder`` whose samples carry their index, so the example can show every epoch saw each once."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, _ = super().__getitem__(index)
        return {"index": index, "x": augment(image.flatten())}


class ImageData(ResumableLoaderMixin, LightningDataModule):
    def __init__(self, root: Path, workers: int) -> None:
        super().__init__()
        self.root, self.workers = root, workers

    def train_dataloader(self) -> DataLoader:
        augmentations = v2.Compose(
            [
                v2.RandomResizedCrop(CROP, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.Grayscale(),
                v2.ToDtype(torch.float32, scale=True),
            ]
        )
        images = IndexedImageFolder(str(self.root), loader=read_jpeg, transform=augmentations)
        return DataLoader(images, batch_size=8, shuffle=True, num_workers=self.workers)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], workers=1).parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = write_images(Path(tmp), args.samples)
        guard = LoadGuard(auto_tune=True, print_summary=False)
        model = fit(guard, ImageData(root, args.workers), args.epochs)

    report(guard, model, args.samples)


if __name__ == "__main__":
    main()
