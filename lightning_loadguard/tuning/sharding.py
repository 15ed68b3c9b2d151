"""Whether an iterable dataset splits its samples between DataLoader workers, from what it declares.

A naive ``IterableDataset`` read by several workers is replayed whole by each (duplicate samples); the data
libraries people train with split their shards between workers themselves. Either way the tuner keeps
``num_workers``: a sharding dataset's order depends on it (which worker reads which shard, and the loader
interleaves the workers' batches), a naive one's sample set does. What differs is why, and what to do.
"""

from __future__ import annotations

from typing import Any


def _module(dataset: object) -> str:
    return type(dataset).__module__ or ""


def worker_sharding(dataset: Any) -> str | None:
    """A description of how ``dataset`` splits its samples between workers, or ``None`` where it declares none.

    Recognised by what each library declares: a Hugging Face ``datasets.IterableDataset`` (its ``n_shards``),
    a litdata ``StreamingDataset`` (which its loader tells the worker count, ``set_num_workers``), and a
    WebDataset pipeline holding a ``split_by_worker`` stage (``webdataset.WebDataset``'s default).

    Example:
        >>> from torch.utils.data import IterableDataset
        >>> class Stream(IterableDataset):
        ...     def __iter__(self): return iter(range(3))
        >>> worker_sharding(Stream()) is None
        True
    """
    shards = getattr(dataset, "n_shards", None) if _module(dataset).startswith("datasets.") else None
    if isinstance(shards, int):
        return f"a Hugging Face IterableDataset of {shards} shards, which the workers split between them"
    litdata = any(cls.__module__.startswith("litdata.") for cls in type(dataset).__mro__)
    if litdata and callable(getattr(dataset, "set_num_workers", None)):
        return (
            f"a litdata {type(dataset).__name__}, whose chunks are split between the num_workers its loader was "
            "built with"
        )
    stages = getattr(dataset, "pipeline", None)
    if isinstance(stages, list) and any(getattr(s, "__name__", None) == "split_by_worker" for s in stages):
        return "a WebDataset pipeline whose shards are split between workers (split_by_worker)"
    return None
