"""The tuner's Lightning side: a :class:`~lightning_loadguard.tuning.port.TrainerPort` over a ``Trainer``.

``LoadGuard(auto_tune=...)`` creates one :class:`TunerAdapter` and forwards its hooks to it. The tuning
itself is plain Python in :mod:`lightning_loadguard.tuning`; every Lightning internal read or written here goes
through :mod:`lightning_loadguard._lightning`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_utilities.core.rank_zero import rank_zero_info

from lightning_loadguard import _lightning as _pl
from lightning_loadguard.meters.monitor import LoaderMonitor
from lightning_loadguard.model.diagnosis import TunerReach
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.session import TuningSession

if TYPE_CHECKING:
    import lightning.pytorch as pl

T = TypeVar("T")


class _LightningPort:
    """The training loop as the tuner sees it, read from a Lightning ``Trainer``."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer

    @property
    def world_size(self) -> int:
        return int(self._trainer.world_size)

    @property
    def global_rank(self) -> int:
        return int(self._trainer.global_rank)

    @property
    def current_epoch(self) -> int:
        return int(self._trainer.current_epoch)

    @property
    def max_epochs(self) -> int | None:
        max_epochs = getattr(self._trainer, "max_epochs", None)
        return int(max_epochs) if max_epochs is not None and max_epochs >= 0 else None

    @property
    def devices_on_host(self) -> int:
        return int(getattr(self._trainer, "num_devices", 1) or 1)

    @property
    def pinning_helps(self) -> bool:
        return self._trainer.strategy.root_device.type == "cuda"

    @property
    def drops_unread_iterators(self) -> bool:
        return int(getattr(self._trainer, "reload_dataloaders_every_n_epochs", 0) or 0) > 0

    def gather_rows(self, row: Sequence[float]) -> list[list[float]]:
        return _pl.gather_rows(self._trainer, row)

    def train_iterator(self) -> tuple[Any | None, str | None]:
        return _pl.train_iterator(self._trainer)

    def replace_train_iterator(self, old: Any, new: Any) -> None:
        _pl.replace_train_iterator(self._trainer, old, new)

    def epoch_steps(self, loader: Any) -> int | None:
        return _pl.epoch_steps(self._trainer, loader)

    def consumed_in_epoch(self) -> int:
        return _pl.consumed_in_epoch(self._trainer)

    def broadcast(self, obj: T) -> T:
        return self._trainer.strategy.broadcast(obj, src=0)

    def any_rank(self, flag: bool) -> bool:
        return bool(self._trainer.strategy.reduce_boolean_decision(flag, all=False))

    def info(self, message: str) -> None:
        rank_zero_info(message)

    def log_text(self, tag: str, text: str) -> None:
        _pl.log_text(self._trainer.loggers, tag, text, int(getattr(self._trainer, "global_step", 0)))


class TunerAdapter:
    """Wires a Lightning ``Trainer``'s events to a :class:`~lightning_loadguard.tuning.session.TuningSession`.

    Args:
        options: the limits of the tuner.
        monitor: the meters the tuner reads its windows from (the callback's own).
        say: reports a condition to the user once.
    """

    def __init__(self, options: TuneOptions, monitor: LoaderMonitor, say: Callable[[str], None]) -> None:
        self._options = options
        self._session = TuningSession(options, monitor, say)

    @property
    def options(self) -> TuneOptions:
        return self._options

    def reach(self) -> TunerReach | None:
        """What this fit's tuner does about worker counts (:meth:`TuningSession.reach`); ``None`` before it
        started."""
        return self._session.reach()

    @property
    def decision(self) -> TuneDecision | None:
        return self._session.decision

    def on_loaders_ready(self, trainer: pl.Trainer, loaders: list[Any]) -> None:
        self._session.on_loaders_ready(_LightningPort(trainer), loaders)

    @property
    def every_step(self) -> bool:
        """Whether the tuner needs :meth:`on_train_batch_end` on every step (while it probes)."""
        return self._session.probing

    def on_train_batch_end(self, trainer: pl.Trainer, logging_step: bool = False) -> None:
        self._session.on_train_batch_end(_LightningPort(trainer), logging_step)

    def teardown(self) -> None:
        self._session.teardown()

    def state_dict(self) -> dict[str, Any]:
        return self._session.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._session.load_state_dict(state)
