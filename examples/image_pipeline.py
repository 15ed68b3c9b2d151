"""A CPU-bound image pipeline: decode JPEG files and augment them with PIL, measured by LoadGuard.

Run: ``python examples/image_pipeline.py`` (CPU, about 30 s). ``--num-workers`` sets the loader's workers;
``--auto-tune`` lets LoadGuard choose them.

It writes a few hundred generated JPEG images to a temporary folder, then trains a small CNN on them. Every
sample is decoded from its file, randomly cropped, flipped, colour-jittered and resized in the loader, as in
a typical vision pipeline: the cost is in the CPU, not in waiting for a disk.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import warnings
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuard

try:
    from PIL import Image, ImageEnhance, ImageFilter
except ImportError as err:  # Pillow comes with tensorboard; a trimmed environment may lack it
    raise SystemExit("This example needs Pillow: pip install pillow") from err

CLASSES = 4


def write_images(folder: Path, count: int, size: int, seed: int = 0) -> list[tuple[Path, int]]:
    """Write ``count`` JPEG images of ``size`` x ``size`` pixels; the label is the dominant colour band."""
    rng = random.Random(seed)
    items = []
    for i in range(count):
        label = i % CLASSES
        base = [rng.randrange(40, 120) for _ in range(3)]
        if label < 3:
            base[label] = 220
        noise = Image.effect_noise((size, size), 40).convert("RGB")
        image = Image.blend(Image.new("RGB", (size, size), tuple(base)), noise, 0.35)
        path = folder / f"{i:05d}.jpg"
        image.save(path, quality=90)
        items.append((path, label))
    return items


class JpegFolder(Dataset):
    """Decodes and augments each image on every access, as ``torchvision.datasets.ImageFolder`` with
    ``RandomResizedCrop``, ``RandomHorizontalFlip`` and ``ColorJitter`` would."""

    def __init__(self, items: list[tuple[Path, int]], out_size: int = 96) -> None:
        self.items = items
        self.out_size = out_size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        rng = random.Random()
        with Image.open(path) as file:
            image = file.convert("RGB")
        w, h = image.size
        crop = int(min(w, h) * rng.uniform(0.6, 1.0))
        left, top = rng.randrange(w - crop + 1), rng.randrange(h - crop + 1)
        image = image.crop((left, top, left + crop, top + crop)).resize((self.out_size, self.out_size))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.7, 1.3))
        image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.7, 1.3))
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.1, 1.0)))
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        # uint8 through the worker queue (a quarter of float32's bytes), converted in the training step.
        return pixels.view(self.out_size, self.out_size, 3).permute(2, 0, 1).contiguous(), label


class SmallCnn(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, CLASSES),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = torch.nn.functional.cross_entropy(self.net(images.float() / 255.0), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=480, help="JPEG files to generate")
    parser.add_argument("--size", type=int, default=256, help="pixels per side of the generated images")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--auto-tune", action="store_true", help="let LoadGuard choose the loader settings")
    parser.add_argument("--logdir", default="image_pipeline_logs")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")

    torch.set_num_threads(1)  # the step shares the cores with the loader's workers
    with tempfile.TemporaryDirectory() as tmp:
        items = write_images(Path(tmp), args.images, args.size)
        loader = DataLoader(JpegFolder(items), batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
        guard = LoadGuard(window=20, auto_tune=args.auto_tune)
        trainer = Trainer(
            max_epochs=args.epochs,
            callbacks=[guard],
            logger=TensorBoardLogger(args.logdir, name="image_pipeline"),
            log_every_n_steps=5,
            accelerator="cpu",
            devices=1,
            enable_checkpointing=False,
            enable_model_summary=False,
        )
        trainer.fit(SmallCnn(), loader)
    if guard.diagnosis is not None:
        print(f"verdict: {guard.diagnosis.verdict}")
    if guard.decision is not None:
        print(guard.decision.table())


if __name__ == "__main__":
    main()
