"""Every Lightning internal the package reads or writes is in the compatibility module, nowhere else.

A Lightning internal is a private name (``_name``) that Lightning's own sources define: a method, a class,
or an attribute its objects set on themselves (``trainer._checkpoint_connector``, ``fit_loop._combined_loader``,
``epoch_loop._batches_that_stepped``), used as an attribute or spelled as a string (``getattr(x, "_name")``,
a checkpoint key). Names torch's data loading also defines (``_iterator``, ``_get_iterator``) are torch's, and
names the package defines on its own objects are its own.
"""

from __future__ import annotations

import ast
import inspect
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.utils.data

from lightning_loadguard import _lightning
from lightning_loadguard._lightning import pl
from lightning_loadguard.position import PositionMismatchError

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_loadguard"
SEAM = ("_lightning.py", "_lightning/")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(root: Path) -> set[str]:
    """Private names a source tree defines: functions, classes, module names, attributes set on self/cls."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _private(n)}


def _lightning_internals() -> set[str]:
    lightning = _defined_privates(Path(pl.__file__).parent)
    torch_data = _defined_privates(Path(torch.utils.data.__file__).parent)
    own = _defined_privates(PACKAGE)
    return lightning - torch_data - own


def _uses(path: Path, internals: set[str]) -> list[tuple[int, str]]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in internals:
            hits.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in internals:
            hits.append((node.lineno, repr(node.value)))
    return hits


def test_the_rule_finds_what_it_is_meant_to_find(tmp_path: Path) -> None:
    internals = _lightning_internals()
    assert {"_checkpoint_connector", "_combined_loader", "_batches_that_stepped", "_data_fetcher"} <= internals
    assert "_iterator" not in internals  # torch's DataLoader attribute, not Lightning's
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(trainer):\n"
        "    a = trainer._checkpoint_connector._loaded_checkpoint\n"
        "    b = getattr(trainer.fit_loop, '_combined_loader', None)\n"
        "    return a, b, trainer.train_dataloader._iterator\n"
    )
    found = sorted(name for _, name in _uses(sample, internals))
    assert found == ["'_combined_loader'", "_checkpoint_connector", "_loaded_checkpoint"]


def test_the_internals_read_exist_in_the_installed_lightning() -> None:
    """What ``_lightning`` says it reads is there in this Lightning (CI runs each supported version)."""
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu")
    fit_loop = trainer.fit_loop
    assert callable(getattr(type(fit_loop), "_load_combined_loader_states", None))
    assert hasattr(fit_loop, "_combined_loader") and hasattr(fit_loop, "_data_fetcher")
    assert isinstance(fit_loop.epoch_loop._batches_that_stepped, int)
    assert hasattr(trainer._checkpoint_connector, "_loaded_checkpoint")
    source = inspect.getsource(type(fit_loop.epoch_loop))
    assert '].train_dataloader_next"' in source and type(fit_loop.epoch_loop).__name__ == "_TrainingEpochLoop"


def test_lightning_internals_are_touched_only_in_the_compatibility_module() -> None:
    internals = _lightning_internals()
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(SEAM):
            continue
        hits = _uses(path, internals)
        if hits:
            outside[relative] = hits
    assert not outside, f"Lightning internals outside _lightning: {outside}"


def test_tensorboard_loggers_are_recognised_by_class_of_either_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Importing pytorch_lightning installs its own warning format over LoadGuard's: undone after this test.
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    import pytorch_lightning

    from lightning_loadguard._lightning import is_tensorboard_logger

    class Mine(pl.loggers.TensorBoardLogger):
        pass

    class TensorBoardLogger:  # the same name, another class
        experiment = None

    assert is_tensorboard_logger(pl.loggers.TensorBoardLogger(str(tmp_path)))
    assert is_tensorboard_logger(Mine(str(tmp_path)))
    assert is_tensorboard_logger(pytorch_lightning.loggers.TensorBoardLogger(str(tmp_path)))
    assert not is_tensorboard_logger(TensorBoardLogger())
    assert not is_tensorboard_logger(pl.loggers.CSVLogger(str(tmp_path)))


def test_every_hook_loadguard_implements_is_a_callback_hook_marked_override() -> None:
    from lightning_loadguard import LoadGuard

    hooks = {name for name in vars(pl.Callback) if not name.startswith("_")} & set(vars(LoadGuard))
    left_out = {name for name in hooks if vars(LoadGuard)[name] is None}
    hooks -= left_out
    assert {"setup", "on_train_batch_end", "teardown", "on_exception", "state_dict"} <= hooks
    assert left_out <= {name for name in vars(pl.Callback) if "_batch_" in name or name.startswith("on_before_")} | {
        "on_after_backward"
    }
    for name in hooks:
        function = vars(LoadGuard)[name]
        function = getattr(function, "fget", function)
        assert getattr(function, "__override__", False), f"LoadGuard.{name} lacks @override"
    for name, function in vars(LoadGuard).items():
        if getattr(function, "__override__", False):
            assert hasattr(pl.Callback, name), f"LoadGuard.{name} is marked @override but overrides nothing"


def test_the_hooks_loadguard_leaves_out_are_never_dispatched_and_the_rest_are() -> None:
    from lightning.pytorch.profilers import SimpleProfiler
    from pipelines import quiet_trainer

    from lightning_loadguard import LoadGuard
    from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

    # The profiler records every hook Lightning dispatches to a callback, by name.
    profiler = SimpleProfiler()
    guard = LoadGuard(window=4, print_summary=False)
    trainer = quiet_trainer(callbacks=[guard], max_epochs=1, profiler=profiler, limit_val_batches=2)
    loader = timed_loader(TimedDataset(24), 4)

    class Validated(TimedModule):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            pass

    trainer.fit(Validated(), loader, loader)
    ours = [name for name in profiler.recorded_durations if name.startswith("[Callback]LoadGuard")]
    dispatched = {name.rsplit(".", 1)[-1] for name in ours}
    assert {"on_train_batch_start", "on_train_batch_end", "on_validation_start"} <= dispatched
    per_step = {"on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad"}
    per_batch = {"on_validation_batch_start", "on_validation_batch_end"}
    assert not dispatched & (per_step | per_batch), sorted(dispatched)
    assert guard.metrics["loadguard/step_ms"] > 0


def _fit_and_say(max_epochs: int) -> tuple[list[str], dict[str, float]]:
    from pipelines import quiet_trainer

    from lightning_loadguard import LoadGuard
    from lightning_loadguard._warnings import LoadGuardWarning
    from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

    guard = LoadGuard(window=4, log_every_n_steps=2, print_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(callbacks=[guard], max_epochs=max_epochs).fit(TimedModule(), timed_loader(TimedDataset(24), 4))
    said = [str(w.message) for w in caught if issubclass(w.category, LoadGuardWarning)]
    return [m for m in said if "no fetch of the training loop was seen" in m], guard.metrics


def test_a_fetch_action_lightning_no_longer_names_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_loadguard import _lightning

    said, _ = _fit_and_say(max_epochs=1)
    assert said == []  # Lightning as installed names its fetches
    monkeypatch.setattr(_lightning, "_FETCH_ACTION_SUFFIX", "].renamed_in_another_version")
    monkeypatch.setattr(_lightning, "_fetch_actions", {})
    said, metrics = _fit_and_say(max_epochs=2)
    assert len(said) == 1 and "[_TrainingEpochLoop].train_dataloader_next" in said[0]
    assert "loadguard/wait_fraction" not in metrics and "loadguard/producer_rate" in metrics


def test_an_internal_the_resume_reads_that_is_missing_is_refused_not_guessed() -> None:
    # docs/resume.md: where an internal the mixin reads is missing, it refuses with PositionMismatchError.
    elsewhere = SimpleNamespace(fit_loop=SimpleNamespace())  # a trainer of some other layout
    with pytest.raises(PositionMismatchError, match=r"keeps no checkpoint being restored where versions 2.5-2.6 do"):
        _lightning.loaded_checkpoint(elsewhere)
    with pytest.raises(PositionMismatchError, match=r"keeps no batch progress where .*exact resume is refused"):
        _lightning.batches_done_in_epoch(elsewhere)
    restoring = SimpleNamespace(_checkpoint_connector=SimpleNamespace(_loaded_checkpoint={"state_dict": {}}))
    with pytest.raises(PositionMismatchError, match=r"keeps no batch progress in the checkpoint"):
        _lightning.shift_restored_batch_count(restoring, 2)


# docs/architecture.md's seam table, "where it is missing": each function's fallback, on a trainer of some other
# layout (a SimpleNamespace holding only what the case names), and where the fallback shows in a fit, the fit.


def _fit_watching_epochs() -> tuple[list[set[str]], list[str]]:
    """A 2-epoch fit (1 worker, window 4, logging every 2 steps): LoadGuard's metric names at each epoch's end,
    and its warnings."""
    from lightning.pytorch import Callback
    from pipelines import quiet_trainer

    from lightning_loadguard import LoadGuard, LoadGuardWarning
    from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

    guard = LoadGuard(window=4, log_every_n_steps=2, print_summary=False)
    names: list[set[str]] = []

    class AtEpochEnd(Callback):  # after LoadGuard's own epoch-end figures
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            names.append(set(guard.metrics))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(callbacks=[guard, AtEpochEnd()], max_epochs=2).fit(
            TimedModule(record=False), timed_loader(TimedDataset(32), 4, num_workers=1)
        )
    return names, [str(w.message) for w in caught if issubclass(w.category, LoadGuardWarning)]


def test_without_the_loader_hook_the_loader_is_instrumented_at_train_start_one_iterator_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    elsewhere = SimpleNamespace(fit_loop=SimpleNamespace())  # no FitLoop._load_combined_loader_states
    assert _lightning.hook_loaders_ready(elsewhere, lambda loaders: None) is False
    assert vars(elsewhere.fit_loop) == {}  # nothing written
    monkeypatch.setattr(_lightning, "hook_loaders_ready", lambda trainer, on_ready: False)
    names, said = _fit_watching_epochs()
    assert len(names) == 2
    # Epoch 0's workers started before on_train_start: the producer is measured from epoch 1's iterator on.
    assert "loadguard/wait_fraction" in names[0] and "loadguard/producer_rate" not in names[0]
    assert "loadguard/producer_rate" in names[1]
    assert said == []


def test_without_the_fit_loops_loaders_no_loader_is_probed_and_the_wait_is_still_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _lightning.train_loaders(SimpleNamespace(fit_loop=SimpleNamespace())) == []  # no _combined_loader
    # The loader hook reads the same internal: where one is missing, so is the other.
    monkeypatch.setattr(_lightning, "hook_loaders_ready", lambda trainer, on_ready: False)
    monkeypatch.setattr(_lightning, "train_loaders", lambda trainer: [])
    names, said = _fit_watching_epochs()
    assert len(names) == 2
    assert len(said) == 1 and "producer capacity, readiness and epoch start-up are not measured" in said[0]
    assert all("loadguard/wait_fraction" in n and "loadguard/producer_rate" not in n for n in names), names


def test_without_batches_that_stepped_the_step_axis_is_the_global_step() -> None:
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()), global_step=7)
    assert _lightning.log_step(trainer) == 7
    trainer.fit_loop.epoch_loop._batches_that_stepped = 5
    assert _lightning.log_step(trainer) == 5


def test_without_the_combined_loaders_limits_an_epoch_is_the_loaders_length() -> None:
    loader = torch.utils.data.DataLoader(range(40), batch_size=4)
    assert _lightning.epoch_steps(SimpleNamespace(fit_loop=SimpleNamespace()), loader) == 10
    limited = SimpleNamespace(fit_loop=SimpleNamespace(_combined_loader=SimpleNamespace(limits=[3])))
    assert _lightning.epoch_steps(limited, loader) == 3


def test_a_train_iterator_of_unknown_structure_is_not_replaced_and_says_why() -> None:
    elsewhere = SimpleNamespace(fit_loop=SimpleNamespace())
    iterator, why = _lightning.train_iterator(elsewhere)
    assert iterator is None and why is not None and "unknown structure" in why
    with pytest.raises(RuntimeError, match="changed under the tuner"):
        _lightning.replace_train_iterator(elsewhere, None, iter([]))


def test_where_the_loop_progress_a_resume_aligns_is_missing_it_is_refused_naming_it() -> None:
    def resuming(loaded: dict[str, Any] | None) -> SimpleNamespace:
        # Neither 2.5's restarted_on_train_batch_end nor 2.6's is_resuming: the alignment has work to do.
        return SimpleNamespace(
            ckpt_path="last.ckpt",
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()),
            _checkpoint_connector=SimpleNamespace(_loaded_checkpoint=loaded),
        )

    without_progress = {"loops": {"fit_loop": {}}}
    with pytest.raises(PositionMismatchError, match=r"keeps no loop progress in the checkpoint where versions"):
        _lightning.repair_restored_progress(resuming(without_progress), epoch=1, batches=3)
    with pytest.raises(PositionMismatchError, match=r"keeps no loop progress where versions"):
        _lightning.align_with_lightning_restart(resuming(without_progress))
    with pytest.raises(PositionMismatchError, match=r"keeps no loop progress where versions"):
        _lightning.iterates_twice_on_resume(resuming(without_progress))
    # Restored already (nothing pending): read from a fit loop that keeps no epoch progress.
    with pytest.raises(PositionMismatchError, match=r"keeps no loop progress where versions"):
        _lightning.align_with_lightning_restart(resuming(None))


def test_the_internals_read_during_a_fit_exist_in_the_installed_lightning() -> None:
    """The rest of the seam table's internals, read where they live: in a fit, once the train loader is built."""
    from lightning.pytorch import Callback
    from pipelines import quiet_trainer

    from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

    seen: dict[str, Any] = {}

    class Reads(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx != 1:
                return
            fit_loop, epoch_loop = trainer.fit_loop, trainer.fit_loop.epoch_loop
            seen["iterators"] = fit_loop._combined_loader._iterator.iterators
            seen["limits"] = fit_loop._combined_loader.limits
            seen["train_iterator"] = _lightning.train_iterator(trainer)
            seen["epoch_steps"] = _lightning.epoch_steps(trainer, fit_loop._combined_loader.flattened[0])
            seen["processed"] = epoch_loop.batch_progress.current.processed
            seen["restarted_on_train_batch_end"] = hasattr(epoch_loop, "restarted_on_train_batch_end")
            seen["is_resuming"] = hasattr(fit_loop, "is_resuming")
            seen["iteration_based"] = fit_loop._iteration_based_training()

    trainer = quiet_trainer(callbacks=[Reads()], max_epochs=1, limit_train_batches=5)
    trainer.fit(TimedModule(record=False), timed_loader(TimedDataset(40), batch_size=4))
    assert isinstance(seen["iterators"], list) and len(seen["iterators"]) == 1
    iterator, why = seen["train_iterator"]
    assert iterator is seen["iterators"][0] and why is None
    assert seen["limits"] == [5] and seen["epoch_steps"] == 5  # the limit, not the loader's 10
    assert seen["processed"] == 1  # batch 0 done
    # From 2.5 (the oldest pyproject allows) and from 2.6: the resume tells the releases apart by them.
    assert seen["restarted_on_train_batch_end"]
    release = tuple(int(part) for part in pl.__version__.split(".")[:2])
    assert seen["is_resuming"] == (release >= (2, 6)), pl.__version__
    assert seen["iteration_based"] is False  # max_epochs, not max_steps


def test_the_not_resumable_warning_is_silenced_by_its_text_until_restored_and_no_other_is() -> None:
    """docs/architecture.md: ``silence_not_resumable_warning`` matches Lightning's warning by its text: that warning
    is hidden until the returned function restores the filters, another warning never is."""
    text = _lightning.NOT_RESUMABLE_WARNING + " not resumable ..."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restore = _lightning.silence_not_resumable_warning()
        warnings.warn(text, UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
        restore()
        warnings.warn(text, UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning", text]


def test_lightnings_loader_patches_left_in_place_are_undone() -> None:
    """docs/architecture.md: ``restore_loader_classes`` puts back what Lightning's loader-building context managers
    saved as ``__old__init__`` (and the like) where a fault left their patch in place, on subclasses too."""

    class Subclass(torch.utils.data.DataLoader):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    classes = (torch.utils.data.DataLoader, Subclass)
    originals = {cls: cls.__dict__.get("__init__") for cls in classes}
    for cls in classes:
        saved = cls.__dict__["__init__"]
        cls.__old__init__ = saved  # type: ignore[attr-defined]
        cls.__init__ = lambda self, *a, **k: None  # type: ignore[method-assign]
    _lightning.restore_loader_classes()
    for cls in classes:
        assert cls.__dict__.get("__init__") is originals[cls], cls
        assert "__old__init__" not in cls.__dict__, cls
    assert Subclass(list(range(4)), batch_size=2).batch_size == 2
