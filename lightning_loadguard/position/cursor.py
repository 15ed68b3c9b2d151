"""The consumer's own count of an epoch's batches, and the epoch a loader plays next."""

from __future__ import annotations

import math

from lightning_loadguard.position.state import PositionMismatchError


class EpochCursor:
    """Where the consumer stands in the epoch orders, counted from the batches it finished.

    The cursor is the single source of the position: a loader built on it plays ``(epoch, batches)`` when
    it is iterated, the caller reports every batch whose training step finished (:meth:`consumed`) and every
    start of an epoch of its loop (:meth:`epoch_started`). No loop counter is trusted: an epoch is over when
    its batch total was consumed, or when the loop starts another epoch after consuming part of it (an
    epoch cut short by ``max_steps``, a stop request, or a hook that skips the rest).

    Args:
        epoch: The epoch to play first.
        batches: Batches of it already consumed (a resumed position).

    Example:
        >>> c = EpochCursor(epoch=1, batches=3)
        >>> c.check_next(3)              # the loop's index of its next batch agrees
        >>> c.consumed(total=5); c.position
        (1, 4)
        >>> c.consumed(total=5); c.position  # the epoch's last batch: the next one starts
        (2, 0)
        >>> c.epoch_started(); c.position
        (2, 0)
    """

    def __init__(self, epoch: int = 0, batches: int = 0) -> None:
        if epoch < 0 or batches < 0:
            raise ValueError(f"epoch and batches must be >= 0, got epoch={epoch}, batches={batches}")
        self.epoch = epoch
        self.batches = batches
        self._start = batches
        self._resumed = batches > 0

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, batches consumed in it)``; a finished epoch is the next one's start."""
        return self.epoch, self.batches

    def consumed(self, total: float = math.inf) -> None:
        """One more batch's step finished; ``total`` is the epoch's batch count (``inf`` if unknown)."""
        self.batches += 1
        self._resumed = False
        if self.batches >= total:
            self.finish_epoch()

    def finish_epoch(self) -> None:
        """The epoch ran out of batches: the next iteration plays the next epoch from its start."""
        self.epoch += 1
        self.batches = self._start = 0

    def epoch_started(self) -> None:
        """The loop starts an epoch: after a partly consumed one, the loader moves on to the next epoch."""
        if self.batches > self._start:
            self.finish_epoch()
        self._start = self.batches

    def check_next(self, batch_idx: int) -> None:
        """Refuse to go on when the loop's index of the batch it is about to train is not the cursor's.

        Raises:
            PositionMismatchError: the loop counts ``batch_idx`` batches done in its epoch while the loader
                continues after ``batches``; one of them would end the epoch at the wrong place.
        """
        if batch_idx == self.batches:
            return
        if self._resumed and batch_idx == 0:
            raise PositionMismatchError(
                f"the checkpoint's loader position is {self.batches} batches into epoch {self.epoch}, but the "
                "trainer starts a new epoch: the checkpoint was written when a fit stopped mid-epoch (for "
                "example at max_steps) and this fit does not continue that epoch. Resume with a larger "
                "max_steps to finish it, or from a checkpoint written at an epoch's end"
            )
        raise PositionMismatchError(
            f"the trainer is about to train batch {batch_idx} of its epoch, the loader continues after "
            f"{self.batches} consumed batches of epoch {self.epoch}: the sample order would not be the "
            "uninterrupted run's"
        )
