"""The stored position of a train loader: what the consumer finished, and what is needed to rebuild the order."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

STATE_VERSION = 1
"""Bumped whenever the meaning of a stored field changes; older or newer states are refused."""


class PositionMismatchError(ValueError):
    """A stored position cannot be applied to the loader it is being loaded into.

    A ``ValueError``, raised on resume with both values in its message, so a run never continues from a
    position that does not describe its loader.

    Example:
        >>> try:
        ...     LoaderPosition.from_state_dict({"version": 999})
        ... except PositionMismatchError as err:
        ...     print(err)
        loader position has version 999; this release reads version 1 only
    """


@dataclass(frozen=True)
class LoaderPosition:
    """Where the consumer of one epoch's batch order stands, plus what is needed to rebuild that order.

    The order of an epoch is a function of ``(seed, epoch)`` and of the layout fields; the consumer's place in
    it is ``batches_consumed``. Nothing here describes the producer (workers, prefetch depth), so a position
    taken with 8 workers loads into a loader with 0.

    Attributes:
        epoch: The epoch the consumer is in. A finished epoch is stored as the start of the next one.
        batches_consumed: Batches this rank's consumer finished in ``epoch`` (the trainer's own count).
        samples_consumed: Samples in those batches on this rank (informational; derived from the plan).
        seed: Base seed of the epoch orders.
        dataset_len: Length of the map-style dataset (``None`` for an iterable dataset).
        batch_size: Samples per batch on one rank (``None`` for a custom batch sampler).
        drop_last: The loader's ``drop_last``.
        drop_tail: Whether the global order is cut (not padded) to a multiple of ``world_size``.
        world_size: Number of ranks sharing the epoch.
        epoch_origin: Samples of the epoch's global order consumed under an earlier world size; the current
            layout shards only what follows them.
        origin_batches: Value of the trainer's batch count when the current layout took over.
        dataset_state: For a stateful iterable dataset, its ``state_dict()`` at the consumer's position.
        version: Format version (:data:`STATE_VERSION`).

    Example:
        >>> p = LoaderPosition(epoch=2, batches_consumed=5, seed=7, dataset_len=40, batch_size=4)
        >>> LoaderPosition.from_state_dict(p.state_dict()) == p
        True
    """

    epoch: int = 0
    batches_consumed: int = 0
    samples_consumed: int = 0
    seed: int = 0
    dataset_len: int | None = None
    batch_size: int | None = None
    drop_last: bool = False
    drop_tail: bool = False
    world_size: int = 1
    epoch_origin: int = 0
    origin_batches: int = 0
    dataset_state: Any = None
    version: int = STATE_VERSION

    def __post_init__(self) -> None:
        for name in ("epoch", "batches_consumed", "samples_consumed", "epoch_origin", "origin_batches"):
            if getattr(self, name) < 0:
                raise ValueError(f"LoaderPosition.{name} must be >= 0, got {getattr(self, name)}")
        if self.world_size < 1:
            raise ValueError(f"LoaderPosition.world_size must be >= 1, got {self.world_size}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"LoaderPosition.batch_size must be >= 1 or None, got {self.batch_size}")
        if self.origin_batches > self.batches_consumed:
            raise ValueError(
                f"LoaderPosition.origin_batches ({self.origin_batches}) exceeds batches_consumed "
                f"({self.batches_consumed})"
            )

    @property
    def layout_batches(self) -> int:
        """Batches consumed since the current layout took over."""
        return self.batches_consumed - self.origin_batches

    def state_dict(self) -> dict[str, Any]:
        """A plain dict (ints, bools, None and the dataset's own state) safe for ``torch.save``."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> LoaderPosition:
        """Rebuild a position, refusing unknown versions and unknown fields.

        Raises:
            PositionMismatchError: ``state`` has another version, misses ``version`` or has unknown keys.
        """
        if not isinstance(state, dict):
            raise PositionMismatchError(f"a loader position must be a dict, got {type(state).__name__}")
        version = state.get("version")
        if version != STATE_VERSION:
            raise PositionMismatchError(
                f"loader position has version {version!r}; this release reads version {STATE_VERSION} only"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise PositionMismatchError(f"loader position has unknown fields {unknown}")
        return cls(**state)

    def load_state_dict(self, state: dict[str, Any]) -> LoaderPosition:
        """Frozen dataclass: returns the loaded position instead of mutating ``self``."""
        return self.from_state_dict(state)

    def evolve(self, **changes: Any) -> LoaderPosition:
        """A copy with ``changes`` applied (validated like the constructor)."""
        return replace(self, **changes)
