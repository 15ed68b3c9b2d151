"""The train loader's settings: one type, one reader, one notion of the effective prefetch depth.

The diagnosis, the tuner, the checkpointed tuning decision and the loader switch all speak of these four
settings; this module is their only home (with torch's default prefetch depth).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_PREFETCH = 2
"""torch's ``prefetch_factor`` when a loader with workers is given ``None``."""

SWITCHABLE: tuple[str, ...] = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
"""The settings that can change on a built ``DataLoader`` (once its iterator is shut down)."""


@dataclass(frozen=True)
class LoaderSettings:
    """The train loader's worker settings as the trainer iterates it.

    ``batch_size`` describes the loader but is no setting the tuner chooses: it is left out of equality, so
    two settings compare equal when the loader would run the same way.

    Example:
        >>> LoaderSettings(num_workers=4, prefetch_factor=2).batches_in_flight
        8
        >>> LoaderSettings(num_workers=4).label
        'workers=4 prefetch=2'
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    batch_size: int | None = field(default=None, compare=False)

    @property
    def prefetch(self) -> int:
        """Batches each worker keeps in flight: ``prefetch_factor``, or torch's default where it is ``None``
        (also without workers: the depth the loader gets once it is given workers)."""
        return DEFAULT_PREFETCH if self.prefetch_factor is None else self.prefetch_factor

    @property
    def batches_in_flight(self) -> int:
        """Batches that can exist at once between the workers and the consumer.

        ``num_workers x prefetch`` outstanding batches, plus one transient pinned copy when ``pin_memory`` is
        on. With ``num_workers=0`` nothing is prefetched.
        """
        if self.num_workers <= 0:
            return 0
        return self.num_workers * self.prefetch + (1 if self.pin_memory else 0)

    @property
    def label(self) -> str:
        text = "workers=0" if self.num_workers == 0 else f"workers={self.num_workers} prefetch={self.prefetch}"
        if self.pin_memory:
            text += " pinned"
        if self.persistent_workers:
            text += " persistent"
        return text

    def loader_kwargs(self) -> dict[str, Any]:
        """The arguments that make a loader run these settings (persistence is applied on its own)."""
        kwargs = self.fields()
        del kwargs["persistent_workers"]
        return kwargs

    def fields(self) -> dict[str, Any]:
        """The four settings by name, ``prefetch_factor`` ``None`` without workers (where torch ignores it)."""
        values = self.to_dict()
        if self.num_workers <= 0:
            values["prefetch_factor"] = None
        return values

    def same_loader(self, other: LoaderSettings) -> bool:
        """Equal but for ``persistent_workers``, which only matters from the next epoch on."""
        return replace(self, persistent_workers=False) == replace(other, persistent_workers=False)

    def to_dict(self) -> dict[str, Any]:
        """The four settings as plain data (the checkpointed form)."""
        return {name: getattr(self, name) for name in SWITCHABLE}


def settings_of(loader: Any) -> LoaderSettings:
    """The settings ``loader`` runs with; ``prefetch_factor`` is the effective depth (``None`` without workers).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> settings_of(DataLoader(list(range(8)), batch_size=4, num_workers=2))
        LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=False, pin_memory=False, batch_size=4)
    """
    workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = getattr(loader, "prefetch_factor", None) if workers > 0 else None
    return LoaderSettings(
        num_workers=workers,
        prefetch_factor=(DEFAULT_PREFETCH if prefetch is None else int(prefetch)) if workers > 0 else None,
        persistent_workers=bool(getattr(loader, "persistent_workers", False)),
        pin_memory=bool(getattr(loader, "pin_memory", False)),
        batch_size=getattr(loader, "batch_size", None),
    )
