"""Builders for Trainer-level resume cases: a dataset of indices, datamodules, a recording model, a runner.

Imported by the resume tests and run as a script for the cases that need real processes (DDP, SIGKILL):
``python tests/resume_harness.py '<json case>'``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from loader_fixtures import (
    Alternating,
    NumpyGlobalShuffle,
    NumpyOwnShuffle,
    PyShuffle,
    StatefulStream,
    Stream,
    UnseededShuffle,
)
from loader_libraries import LIBRARIES, build_loader
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_loadguard.datamodule import ResumableLoaderMixin

warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")


class Indexed(Dataset):
    """Sample ``i`` is ``(i, [i])``: the index travels with the sample to the training step."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.tensor([float(i)])


class Batches:
    """Not a DataLoader: an object with ``__iter__`` and ``__len__`` over a loader's batches."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class GeneratorLoader(DataLoader):
    """A DataLoader subclass whose ``__iter__`` is a generator (as some of Lightning's own tests write)."""

    def __iter__(self) -> Any:
        yield from super().__iter__()


def build_train_loader(case: dict[str, Any], trainer: Any) -> Any:
    """The train loader (or loaders) ``case`` describes; ``trainer`` is needed for a ``DistributedSampler``."""
    c = case
    n, b, kind = c["n"], c.get("batch_size", 4), c.get("sampler", "default")
    workers = c.get("workers", 0)
    extra: dict[str, Any] = {"num_workers": workers, "persistent_workers": c.get("persistent", False)}
    if c.get("prefetch"):
        extra["prefetch_factor"] = c["prefetch"]
    if c.get("pin_memory"):
        extra["pin_memory"] = True
    if kind == "stateful_iterable":
        return DataLoader(StatefulStream(n), batch_size=b, **extra)
    if kind == "stateful_iterable_loader":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(StatefulStream(n), batch_size=b, **extra)
    if kind in LIBRARIES:  # a data library's own loader over files the test wrote (loader_libraries)
        rank = (trainer.global_rank, trainer.world_size) if trainer.world_size > 1 else None
        shuffle = c.get("shuffle", False)
        return build_loader(kind, Path(c["root"]), n=n, batch_size=b, shuffle=shuffle, rank=rank, **extra)
    if kind == "not_a_loader":
        return Batches(DataLoader(Indexed(n), batch_size=b, shuffle=True, **extra))
    if kind == "plain_iterable":
        return DataLoader(Stream(n), batch_size=b, **extra)
    ds = Indexed(n)
    drop_last = c.get("drop_last", False)
    if kind == "default":
        return DataLoader(ds, batch_size=b, shuffle=c.get("shuffle", True), drop_last=drop_last, **extra)
    if kind == "custom":
        return DataLoader(ds, batch_size=b, sampler=PyShuffle(n), drop_last=drop_last, **extra)
    if kind == "distributed":
        sampler = DistributedSampler(
            ds, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=True, seed=5
        )
        return DataLoader(ds, batch_size=b, sampler=sampler, drop_last=drop_last, **extra)
    if kind == "batch_sampler":
        return DataLoader(ds, batch_sampler=Alternating(PyShuffle(n), 1, False), **extra)
    numpy_samplers = {"numpy_global": NumpyGlobalShuffle, "numpy_own": NumpyOwnShuffle, "unseeded": UnseededShuffle}
    if kind in numpy_samplers:
        return DataLoader(ds, batch_size=b, sampler=numpy_samplers[kind](n), drop_last=drop_last, **extra)
    if kind == "stateful_loader":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, batch_size=b, shuffle=True, drop_last=drop_last, **extra)
    if kind == "subclass":
        return GeneratorLoader(ds, batch_size=b, shuffle=True, drop_last=drop_last, **extra)
    if kind == "dict_with_stream":  # several loaders, one over an IterableDataset
        return {"a": DataLoader(ds, batch_size=b, shuffle=True, **extra), "b": DataLoader(Stream(n), batch_size=b)}
    if kind == "list_with_subclass":  # several loaders, one a DataLoader subclass
        return [DataLoader(ds, batch_size=b, shuffle=True, **extra), GeneratorLoader(Indexed(n // 2), batch_size=b)]
    if kind in ("dict", "list", "combined"):
        # A second task half as long, whose samples are told apart by an offset of 1000 in the record.
        loaders = [
            DataLoader(ds, batch_size=b, shuffle=True, drop_last=drop_last, **extra),
            DataLoader(Indexed(n // 2), batch_size=b, shuffle=True, **extra),
        ]
        if kind == "combined":
            from lightning.pytorch.utilities import CombinedLoader

            return CombinedLoader(loaders, mode="max_size_cycle")
        return dict(zip("ab", loaders, strict=True)) if kind == "dict" else loaders
    raise ValueError(f"unknown sampler kind {kind!r}")


class _CaseLoader:
    """Holds a case and builds its train loader; combined with LightningDataModule and the mixin in any order."""

    case: dict[str, Any]
    trainer: Any

    def hold(self, case: dict[str, Any]) -> None:
        self.case = case
        if case.get("seed") is not None:
            self.loader_seed = case["seed"]
        if case.get("allow_inexact"):
            self.allow_inexact_resume = True

    def train_dataloader(self) -> DataLoader:
        return build_train_loader(self.case, self.trainer)


class Data(ResumableLoaderMixin, _CaseLoader, pl.LightningDataModule):
    def __init__(self, case: dict[str, Any]) -> None:
        super().__init__()
        self.hold(case)


# DataModule shapes: every way a class hierarchy can reach the user's train_dataloader.
class OverrideCallingSuper(Data):
    """A subclass whose override returns ``super().train_dataloader()``."""

    def train_dataloader(self) -> DataLoader:
        return super().train_dataloader()


class OverrideCallingSuperTwice(OverrideCallingSuper):
    """Two levels of overrides, each returning ``super().train_dataloader()``."""

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        return loader


class OverrideWithoutSuper(Data):
    """A subclass whose override builds its own loader."""

    def train_dataloader(self) -> DataLoader:
        return build_train_loader(self.case, self.trainer)


class _PlainBase(_CaseLoader, pl.LightningDataModule):
    """A DataModule without the mixin that defines train_dataloader."""

    def __init__(self, case: dict[str, Any]) -> None:
        super().__init__()
        self.hold(case)


class MixinAfterBase(_PlainBase, ResumableLoaderMixin):
    """The mixin listed after a base that defines train_dataloader and, through LightningDataModule, state_dict."""


class MixinAfterLightning(pl.LightningDataModule, ResumableLoaderMixin):
    """The mixin listed after LightningDataModule, with its own train_dataloader."""

    def __init__(self, case: dict[str, Any]) -> None:
        super().__init__()
        _CaseLoader.hold(self, case)  # type: ignore[arg-type]

    def train_dataloader(self) -> DataLoader:
        return _CaseLoader.train_dataloader(self)  # type: ignore[arg-type]


class FromDatasets(ResumableLoaderMixin, pl.LightningDataModule):
    """Built with ``LightningDataModule.from_datasets``, which sets train_dataloader on the instance."""


SHAPES = {
    "plain": Data,
    "override_super": OverrideCallingSuper,
    "override_super_twice": OverrideCallingSuperTwice,
    "override_no_super": OverrideWithoutSuper,
    "mixin_after_base": MixinAfterBase,
    "mixin_after_lightning": MixinAfterLightning,
}


def make_datamodule(case: dict[str, Any]) -> pl.LightningDataModule:
    """The datamodule of ``case['shape']`` (default ``plain``; ``without_mixin``: no ResumableLoaderMixin) over
    the loader ``case`` describes."""
    shape = case.get("shape", "plain")
    if shape == "from_datasets":
        # Lightning's own loader: shuffled, over the dataset given.
        data = FromDatasets.from_datasets(train_dataset=Indexed(case["n"]), batch_size=case.get("batch_size", 4))
        if case.get("seed") is not None:
            data.loader_seed = case["seed"]
    elif shape == "without_mixin":  # the same loader with Lightning's own resume, for comparison
        data = _PlainBase(case)
    else:
        data = SHAPES[shape](case)
    if case.get("validate"):
        # Set on the instance, as from_datasets does: every shape gets a two-sample validation set.
        data.val_dataloader = lambda: DataLoader(Indexed(2), batch_size=2)  # type: ignore[method-assign]
    return data


class ValidatedData(Data):
    """``Data`` with a two-sample validation set, so that validation runs at every epoch's end."""

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Indexed(2), batch_size=2)


class Recorder(pl.LightningModule):
    """Records the sample indices each training step sees; saves and stops (or dies) where told."""

    def __init__(self, case: dict[str, Any], ckpt: str | None = None, log: str | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.case = case
        self.ckpt = ckpt
        self.log_path = log
        self.seen: list[int] = []
        self.validated: list[int] = []
        self.stepping_batches: float | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, list) and len(batch) == 4:  # a clocked batch (loader_libraries): indices, features
            batch = [batch[0], batch[1][:, :1]]  # the model takes one feature
        if isinstance(batch, dict):  # several loaders: every task's indices, the second one's offset by 1000
            batch = list(batch.values())
        if isinstance(batch, list) and isinstance(batch[0], (list, tuple)):
            (idx, x), (second, _) = batch
            got = [int(i) for i in idx] + [1000 + int(i) for i in second]
        else:
            idx, x = batch
            got = [int(i) for i in idx]
        self.seen.extend(got)
        if self.log_path:
            with open(f"{self.log_path}.rank{self.global_rank}", "a") as f:
                f.write(json.dumps(got) + "\n")
        return self.layer(x).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.case.get("read_stepping"):
            self.stepping_batches = self.trainer.estimated_stepping_batches
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _stop(self) -> None:
        if self.ckpt and self.case.get("stop_kind") != "mcp":
            self.trainer.save_checkpoint(self.ckpt)
        if self.case.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        self.trainer.should_stop = True

    def on_train_start(self) -> None:
        if self.case.get("stop_kind") == "start" and self.ckpt:
            self._stop()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.case.get("stop_kind") in ("step", "mcp") and self.ckpt and self.global_step == self.case["stop_at"]:
            self._stop()

    def on_train_epoch_end(self) -> None:
        if self.case.get("stop_kind") == "epoch_end" and self.ckpt and self.current_epoch == self.case["stop_at"]:
            self._stop()


class ValidatingRecorder(Recorder):
    """Also records the epoch of every validation step."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated.append(self.current_epoch)


def case_trainer(case: dict[str, Any], callbacks: list[pl.Callback], **overrides: Any) -> pl.Trainer:
    """The CPU Trainer a case runs under: its ``epochs``, ``max_steps``, ``devices``, ``strategy``, ``limit`` (train
    batches), ``accumulate`` (gradient batches) and ``reload`` (loaders every n epochs); no logger, progress bar or
    sanity check. ``overrides`` replace any Trainer argument (a segment's own ``max_steps``)."""
    arguments: dict[str, Any] = {
        "max_epochs": case.get("epochs", 2),
        "max_steps": case.get("max_steps", -1),
        "accelerator": "cpu",
        "devices": case.get("devices", 1),
        "strategy": case.get("strategy", "auto"),
        "limit_train_batches": case.get("limit", 1.0),
        "accumulate_grad_batches": case.get("accumulate", 1),
        "reload_dataloaders_every_n_epochs": case.get("reload", 0),
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": bool(callbacks),
        "callbacks": callbacks,
        "logger": False,
        "num_sanity_val_steps": 0,
    }
    return pl.Trainer(**{**arguments, **overrides})


def run(
    case: dict[str, Any], *, ckpt_out: str | None = None, ckpt_in: str | None = None, log: str | None = None
) -> tuple[Recorder, Data, pl.Trainer]:
    """Fit once. With ``ckpt_out`` the run saves there at ``case['stop_kind']``/``case['stop_at']`` and stops."""
    callbacks = []
    if case.get("stop_kind") == "mcp" and ckpt_out:
        callbacks.append(
            ModelCheckpoint(
                dirpath=str(Path(ckpt_out).parent),
                filename="mcp-{step}",
                every_n_train_steps=case["stop_at"],
                save_top_k=-1,
            )
        )
    trainer = case_trainer(case, callbacks)
    validate = bool(case.get("validate"))
    model = (ValidatingRecorder if validate else Recorder)(case, ckpt=ckpt_out, log=log)
    data = ValidatedData(case) if validate else make_datamodule(case)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_in)
    return model, data, trainer


def main() -> None:
    case = json.loads(sys.argv[1])
    _, data, trainer = run(case, ckpt_out=case.get("ckpt_out"), ckpt_in=case.get("ckpt_in"), log=case["log"])
    if case.get("seed_out"):  # the seed this rank's position holds, for the test to compare over ranks
        position = data.loader_position
        assert position is not None
        Path(f"{case['seed_out']}.rank{trainer.global_rank}").write_text(json.dumps(position.seed))


if __name__ == "__main__":
    main()
    # An initialized gloo group left to the interpreter's exit can abort the process (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
