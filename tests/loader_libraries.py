"""Small pipelines on the data libraries people train with, built on local files a test writes.

Hugging Face ``datasets`` (a map-style Arrow table with ``with_format("torch")``, and a streaming
``IterableDataset`` over local Parquet files), WebDataset (tar shards), litdata (``optimize`` to a local
directory, read with ``StreamingDataset`` + ``StreamingDataLoader``) and torchvision (an ``ImageFolder`` of JPEG
files decoded with ``torchvision.io.decode_jpeg`` and augmented with ``transforms.v2``). Each is used as its
documentation shows;
the only addition is the dataset's own clock: every sample passes through a transform of known CPU cost that
stamps when it started and finished (``perf_counter``, comparable across processes), and the collate stamps the
batch's end, so a batch is ``[indices, features, stamps, collated]`` as :class:`pipelines.ClockedModule` reads it.
"""

from __future__ import annotations

import importlib.util
import io
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FEATURES = 16
SHARDS = 4
LIBRARIES = ("hf_map", "hf_stream", "webdataset", "litdata", "torchvision")
MAP_STYLE = ("hf_map", "torchvision")
"""The libraries whose dataset is map-style: the tuner probes and switches them mid-epoch like any ``Dataset``."""
IMAGE_SIDE = 4
"""The augmented image is a ``IMAGE_SIDE`` x ``IMAGE_SIDE`` grey crop: ``FEATURES`` values."""


class SampleClock:
    """The transform every sample passes through: ``sample_s`` of this thread's CPU time, stamped.

    A fixed amount of work (CPU time, not a wall-clock deadline) like a decode or augmentation, so a worker
    that shares its core with others takes longer, as a real transform would; the stamps record what it took.
    """

    def __init__(self, sample_s: float) -> None:
        self.sample_s = sample_s

    def __call__(self, index: Any, features: Any) -> dict[str, Any]:
        started = time.perf_counter()
        end = time.thread_time() + self.sample_s
        while time.thread_time() < end:
            pass
        return {
            "index": int(index),
            "features": torch.as_tensor(features, dtype=torch.float32),
            "stamps": torch.tensor([started, time.perf_counter()], dtype=torch.float64),
        }


def clocked_collate(samples: list[dict[str, Any]]) -> list[torch.Tensor]:
    """torch's ``default_collate`` of the clocked samples, then the batch's own end stamp."""
    batch = default_collate([(s["index"], s["features"], s["stamps"]) for s in samples])
    return [*batch, torch.tensor(time.perf_counter(), dtype=torch.float64)]


class RowsCollate:
    """The collate of the map-style table: each row read from Arrow goes through the clock, then collates."""

    def __init__(self, clock: SampleClock) -> None:
        self.clock = clock

    def __call__(self, rows: list[dict[str, Any]]) -> list[torch.Tensor]:
        return clocked_collate([self.clock(row["index"], row["features"]) for row in rows])


class _RowClock:
    """``IterableDataset.map`` function: a streamed row through the clock."""

    def __init__(self, clock: SampleClock) -> None:
        self.clock = clock

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.clock(row["index"], row["features"])


class _TarSampleClock:
    """WebDataset ``map`` function: a decoded tar sample through the clock."""

    def __init__(self, clock: SampleClock) -> None:
        self.clock = clock

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return self.clock(sample["index.cls"], sample["features.pth"])


def _rows(indices: range) -> dict[str, list[Any]]:
    return {"index": list(indices), "features": [[float(i)] * FEATURES for i in indices]}


def _shard_ranges(n: int) -> list[range]:
    return [range(s * n // SHARDS, (s + 1) * n // SHARDS) for s in range(SHARDS)]


def write_parquet(root: Path, n: int) -> list[str]:
    """``SHARDS`` Parquet files holding samples ``0 .. n-1`` in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    files = []
    for shard, indices in enumerate(_shard_ranges(n)):
        path = root / f"part-{shard:02d}.parquet"
        if not path.exists():
            pq.write_table(pa.table(_rows(indices)), path)
        files.append(str(path))
    return files


def write_tar_shards(root: Path, n: int) -> list[str]:
    """``SHARDS`` WebDataset tar shards holding samples ``0 .. n-1`` in order."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for shard, indices in enumerate(_shard_ranges(n)):
        path = root / f"shard-{shard:02d}.tar"
        if not path.exists():
            with wds.TarWriter(str(path)) as sink:
                for i in indices:
                    buffer = io.BytesIO()
                    torch.save(torch.full((FEATURES,), float(i)), buffer)
                    sink.write({"__key__": f"{i:06d}", "index.cls": i, "features.pth": buffer.getvalue()})
        urls.append(str(path))
    return urls


def _litdata_sample(index: int) -> dict[str, Any]:
    return {"index": index, "features": torch.full((FEATURES,), float(index))}


def write_litdata(root: Path, n: int) -> str:
    """Samples ``0 .. n-1`` written with ``litdata.optimize`` in ``SHARDS`` chunks."""
    import litdata

    out = root / "optimized"
    if not (out / "index.json").exists():
        # optimize sets the process-wide start method (to spawn unless told): every later DataLoader would then
        # spawn its workers, each importing torch and Lightning again. Fork, as torch's default here, and put
        # back whatever was set.
        before = multiprocessing.get_start_method(allow_none=True)
        try:
            litdata.optimize(
                fn=_litdata_sample,
                inputs=list(range(n)),
                output_dir=str(out),
                chunk_size=n // SHARDS,
                num_workers=1,
                start_method="fork",
            )
        finally:
            multiprocessing.set_start_method(before, force=True)
    return str(out)


def _clocked_streaming_dataset() -> type:
    """litdata's documented way to transform: a ``StreamingDataset`` subclass whose ``__getitem__`` reads, then
    transforms. Made on first use (importing litdata costs most of a second in every process that imports this
    module) and kept at module level under its name, so that it pickles."""
    made = globals().get("ClockedStreamingDataset")
    if made is not None:
        return made
    import litdata

    class ClockedStreamingDataset(litdata.StreamingDataset):
        def __init__(self, *args: Any, clock: SampleClock, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.clock = clock

        def __getitem__(self, index: Any) -> dict[str, Any]:
            sample = super().__getitem__(index)
            return self.clock(sample["index"], sample["features"])

    ClockedStreamingDataset.__qualname__ = "ClockedStreamingDataset"
    globals()["ClockedStreamingDataset"] = ClockedStreamingDataset
    return ClockedStreamingDataset


def write_jpegs(root: Path, n: int) -> str:
    """An ``ImageFolder`` tree of ``n`` JPEG files, one class a shard: sorted, sample ``i`` is the ``i``-th file."""
    from torchvision.io import encode_jpeg, write_file

    if not (root / "done").exists():
        generator = torch.Generator().manual_seed(0)
        for shard, indices in enumerate(_shard_ranges(n)):
            folder = root / f"class_{shard}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in indices:
                pixels = torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=generator)
                write_file(str(folder / f"{i:06d}.jpg"), encode_jpeg(pixels, quality=90))
        (root / "done").touch()
    return str(root)


def read_jpeg(path: str) -> torch.Tensor:
    """``ImageFolder``'s loader: the file's bytes decoded by ``torchvision.io.decode_jpeg`` (uint8, C x H x W)."""
    from torchvision.io import decode_jpeg, read_file

    return decode_jpeg(read_file(path))


def augmentations() -> Any:
    """A training-time ``transforms.v2`` pipeline: random crop and flip, drawn from torch's random stream."""
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomResizedCrop(IMAGE_SIDE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.Grayscale(),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )


class ClockedImages(torch.utils.data.Dataset):
    """An ``ImageFolder`` (decoded and augmented as above) whose samples pass through the clock with their index."""

    def __init__(self, folder: Any, clock: SampleClock) -> None:
        self.folder = folder
        self.clock = clock

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, _ = self.folder[index]
        return self.clock(index, image.flatten())


def build_loader(
    library: str,
    root: Path,
    *,
    n: int = 160,
    batch_size: int = 4,
    num_workers: int = 0,
    sample_s: float = 0.0,
    shuffle: bool = False,
    rank: tuple[int, int] | None = None,
    **loader_kwargs: Any,
) -> DataLoader:
    """The train loader of ``library`` over ``n`` samples written under ``root`` (once; later calls reuse them).

    Every batch is ``[indices, features, stamps, collated]``; ``shuffle`` is each library's own shuffling.
    ``rank`` (this process's rank, the world size) splits a streaming dataset between DDP ranks as its library
    documents it (``split_dataset_by_node``, WebDataset's ``split_by_node``); a map-style dataset is split by
    the ``DistributedSampler`` Lightning puts in, and litdata splits itself.
    """
    clock = SampleClock(sample_s)
    settings: dict[str, Any] = {"batch_size": batch_size, "num_workers": num_workers, **loader_kwargs}
    if library == "hf_map":
        import datasets

        table = datasets.Dataset.from_dict(_rows(range(n))).with_format("torch")
        return DataLoader(table, shuffle=shuffle, collate_fn=RowsCollate(clock), **settings)
    if library == "hf_stream":
        import datasets

        files = write_parquet(root / "parquet", n)
        stream = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        if shuffle:
            stream = stream.shuffle(seed=0, buffer_size=16)
        if rank is not None:
            from datasets.distributed import split_dataset_by_node

            stream = split_dataset_by_node(stream, rank=rank[0], world_size=rank[1])
        return DataLoader(stream.map(_RowClock(clock)), collate_fn=clocked_collate, **settings)
    if library == "webdataset":
        import webdataset as wds

        urls = write_tar_shards(root / "tars", n)
        split = {"nodesplitter": wds.split_by_node} if rank is not None else {}
        pipeline = wds.WebDataset(urls, shardshuffle=SHARDS if shuffle else False, seed=0, empty_check=False, **split)
        if shuffle:
            pipeline = pipeline.shuffle(16, seed=0)
        return DataLoader(pipeline.decode().map(_TarSampleClock(clock)), collate_fn=clocked_collate, **settings)
    if library == "litdata":
        import litdata

        directory = write_litdata(root / "litdata", n)
        dataset = _clocked_streaming_dataset()(directory, shuffle=shuffle, seed=0, clock=clock)
        return litdata.StreamingDataLoader(dataset, collate_fn=clocked_collate, **settings)
    if library == "torchvision":
        from torchvision.datasets import ImageFolder

        folder = ImageFolder(write_jpegs(root / f"images-{n}", n), loader=read_jpeg, transform=augmentations())
        return DataLoader(ClockedImages(folder, clock), shuffle=shuffle, collate_fn=clocked_collate, **settings)
    raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")


def installed(library: str) -> bool:
    """Whether the package ``library`` needs is installed here (found, not imported)."""
    module = {
        "hf_map": "datasets",
        "hf_stream": "datasets",
        "webdataset": "webdataset",
        "litdata": "litdata",
        "torchvision": "torchvision",
    }
    return importlib.util.find_spec(module[library]) is not None


def iterate(loader: Any) -> list[int]:
    """The sample indices of one pass over ``loader``, in order."""
    return [int(i) for batch in loader for i in batch[0]]
