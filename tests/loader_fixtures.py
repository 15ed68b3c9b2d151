"""Small loader fixtures with known orders, free of Lightning: shared by the core and the Trainer tests."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, Sampler, get_worker_info


class PyShuffle(Sampler[int]):
    """A custom sampler drawing from Python's ``random``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        idx = list(range(self.n))
        random.shuffle(idx)
        return iter(idx)

    def __len__(self) -> int:
        return self.n


class Alternating(BatchSampler):
    """A custom batch sampler making batches of 1 and 3 samples in turn."""

    def __iter__(self) -> Iterator[list[int]]:
        idx = list(self.sampler)
        i, size = 0, 1
        while i < len(idx):
            yield idx[i : i + size]
            i += size
            size = 4 - size

    def __len__(self) -> int:
        n, count, size = len(self.sampler), 0, 1
        while n > 0:
            n -= size
            count += 1
            size = 4 - size
        return count


class Stream(IterableDataset):
    """A stateful stream of indices in an epoch-dependent order."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pos = 0
        self.epoch = 0

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        order = self._order()
        while self.pos < self.n:
            i = order[self.pos]
            self.pos += 1
            yield i, torch.tensor([float(i)])
        self.pos = 0
        self.epoch += 1


class StatefulStream(Stream):
    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos, self.epoch = state["pos"], state["epoch"]


class NumpyGlobalShuffle(Sampler[int]):
    """A custom sampler drawing from numpy's global generator (which ``seed_everything`` seeds)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        import numpy as np

        return iter(np.random.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class NumpyOwnShuffle(Sampler[int]):
    """A custom sampler with its own numpy generator, made once and advanced by every epoch's draw."""

    def __init__(self, n: int, seed: int = 0) -> None:
        import numpy as np

        self.n = n
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class UnseededShuffle(Sampler[int]):
    """A custom sampler whose order cannot be reproduced: a fresh, unseeded numpy generator each epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        import numpy as np

        return iter(np.random.default_rng().permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class MadeBy:
    """A collate that appends to the batch (a list) the ``num_workers`` of the iterator that made it (0: the
    training process), from torch's own worker info: which loader settings a batch came from, told apart from a
    tuner's own account of its switches."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, samples: list[Any]) -> list[Any]:
        info = get_worker_info()
        return [*self.collate(samples), torch.tensor(info.num_workers if info is not None else 0)]


WORKER_LOG_ENV = "LOADGUARD_TEST_WORKER_LOG"
"""The file ``record_worker_start`` appends to (an environment variable: a spawned worker inherits it)."""

parent_mark: bool = False
"""Set in the training process before a fit: a forked worker inherits it, a spawned one imports this module anew."""


def record_worker_start(worker_id: int) -> None:
    """A ``worker_init_fn``: appends the worker's pid, start method and whether it inherited ``parent_mark``."""
    import json
    import multiprocessing
    import os

    line = {
        "pid": os.getpid(),
        "method": multiprocessing.get_start_method(allow_none=True),
        "inherited": parent_mark,
    }
    with open(os.environ[WORKER_LOG_ENV], "a") as f:
        f.write(json.dumps(line) + "\n")
