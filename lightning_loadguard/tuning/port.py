"""What the tuner needs of the training loop, and nothing more: :class:`TrainerPort`
(``lightning_loadguard._tuner_adapter`` implements it for Lightning; the tests drive the session through their own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class TrainerPort(Protocol):
    """What the tuner needs of the training loop, and nothing more."""

    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def current_epoch(self) -> int: ...

    @property
    def max_epochs(self) -> int | None:
        """Epochs the fit runs at most (``None``: unbounded)."""
        ...

    @property
    def devices_on_host(self) -> int:
        """Training processes this one's node runs (before the ranks' figures say how many share the host)."""
        ...

    @property
    def pinning_helps(self) -> bool:
        """An accelerator exists that pinned host memory speeds transfers to."""
        ...

    @property
    def drops_unread_iterators(self) -> bool:
        """The loop builds train iterators it drops before reading a batch (Lightning does at each epoch that
        reloads the loaders, ``reload_dataloaders_every_n_epochs``: it builds that epoch's iterator twice)."""
        ...

    def gather_rows(self, row: Sequence[float]) -> list[list[float]]:
        """Every rank's ``row`` (equal lengths on every rank), by global rank: the ranks' one collective per
        window (:data:`~lightning_loadguard.meters.ranks.Gather`)."""
        ...

    def train_iterator(self) -> tuple[Any | None, str | None]:
        """The loader iterator the loop fetches from, or ``None`` and why it cannot be replaced."""
        ...

    def replace_train_iterator(self, old: Any, new: Any) -> None:
        """Make the loop's next fetch come from ``new``."""
        ...

    def epoch_steps(self, loader: Any) -> int | None:
        """Steps of the current epoch, or ``None`` where the loader has no length."""
        ...

    def consumed_in_epoch(self) -> int:
        """Steps the loop finished in the current epoch."""
        ...

    def broadcast(self, obj: T) -> T:
        """Global rank 0's ``obj`` on every rank."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        ...

    def info(self, message: str) -> None:
        """Progress, on global rank 0."""
        ...

    def log_text(self, tag: str, text: str) -> None:
        """A text record to the loggers that keep text."""
        ...
