"""What docs/loaders.md says of the data libraries beyond its tables, each claim against the library itself.

WebDataset resumed mid-epoch without the mixin (Lightning goes on), and with it under DDP (refused on every
rank, as with one); litdata's ``StreamingDataLoader`` left in restore mode without the mixin;
torchdata's ``StatefulDataLoader`` resumed by its own state without the mixin (docs/resume.md); the start method
``litdata.optimize`` leaves behind; WebDataset's default ``nodesplitter`` with more than one rank.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from loader_libraries import build_loader, installed, iterate
from pipelines import quiet_trainer
from programs import run_program
from resume_chain import NOT_RESUMABLE
from resume_harness import Recorder, case_trainer, run
from test_loader_libraries import _run_chains
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

needs_webdataset = pytest.mark.skipif(not installed("webdataset"), reason="webdataset is not installed")
needs_litdata = pytest.mark.skipif(not installed("litdata"), reason="litdata is not installed")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loader_claims")


class EpochRecorder(Recorder):
    """``Recorder`` that also groups the sample indices by the epoch that trained them."""

    def __init__(self, case: dict[str, Any], ckpt: str | None = None) -> None:
        super().__init__(case, ckpt=ckpt)
        self.by_epoch: dict[int, list[int]] = {}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        before = len(self.seen)
        loss = super().training_step(batch, batch_idx)
        self.by_epoch.setdefault(self.current_epoch, []).extend(self.seen[before:])
        return loss


class WithoutMixin(pl.LightningDataModule):
    """A datamodule as a user without ``ResumableLoaderMixin`` writes it: the library's loader, nothing else."""

    def __init__(self, case: dict[str, Any]) -> None:
        super().__init__()
        self.case = case

    def train_dataloader(self) -> Any:
        c = self.case
        loader = build_loader(
            c["sampler"],
            Path(c["root"]),
            n=c["n"],
            batch_size=c["batch_size"],
            shuffle=c.get("shuffle", False),
            num_workers=c.get("workers", 0),
        )
        if c.get("with_length"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # webdataset's note that the length is only declared
                loader.dataset.with_length(c["n"])
        return loader


def _fit_without_mixin(
    case: dict[str, Any], *, ckpt_out: str | None = None, ckpt_in: str | None = None
) -> tuple[EpochRecorder, pl.Trainer, list[str]]:
    """One fit of ``case`` without the mixin; with ``ckpt_out`` it saves there at ``stop_at`` and stops. Returns
    the model, the trainer and every warning's message."""
    trainer = case_trainer(case, [])
    model = EpochRecorder(case, ckpt=ckpt_out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=WithoutMixin(case), ckpt_path=ckpt_in)
    return model, trainer, [str(w.message) for w in caught]


# -- WebDataset without the mixin -----------------------------------------------------------------------------

# 20 samples, batch 4: 5 batches an epoch; global step 7 is two batches into epoch 1.
WDS_CASE = {"n": 20, "batch_size": 4, "epochs": 2, "sampler": "webdataset", "stop_kind": "step", "stop_at": 7}


def _webdataset_resumed_mid_epoch(
    files: Path, tmp_path: Path, with_length: bool
) -> tuple[EpochRecorder, pl.Trainer, list[str]]:
    """The fit resumed from a checkpoint two batches into epoch 1: its model, trainer and warnings."""
    case = dict(WDS_CASE, root=str(files / "webdataset"), with_length=with_length)
    ckpt = str(tmp_path / "mid.ckpt")
    before, _, _ = _fit_without_mixin(case, ckpt_out=ckpt)
    assert before.by_epoch[1] == list(range(8))
    return _fit_without_mixin(case, ckpt_in=ckpt)


@needs_webdataset
def test_webdataset_resumed_mid_epoch_without_the_mixin_goes_on_as_lightning_does(files: Path, tmp_path: Path) -> None:
    after, trainer, _ = _webdataset_resumed_mid_epoch(files, tmp_path, with_length=False)
    assert trainer.state.finished and trainer.current_epoch == WDS_CASE["epochs"]
    # Not exact: the pipeline starts over, so the two batches epoch 1 trained before the checkpoint come again.
    assert after.by_epoch[1][:8] == list(range(8))


@needs_webdataset
@pytest.mark.parametrize("with_length", [False, True], ids=["as_documented", "with_length"])
def test_lightning_warns_of_a_mid_epoch_webdataset_resume_only_where_the_pipeline_declares_a_length(
    with_length: bool, files: Path, tmp_path: Path
) -> None:
    # Lightning 2.6 warns only where the epoch has a length (training_epoch_loop: num_training_batches != inf).
    _, trainer, messages = _webdataset_resumed_mid_epoch(files, tmp_path, with_length=with_length)
    assert trainer.state.finished
    assert sum(NOT_RESUMABLE in m for m in messages) == int(with_length), messages


# -- WebDataset under DDP, with the mixin -----------------------------------------------------------------------

# As test_loader_libraries.py's chains: 40 samples, batch 4, 3 epochs, SIGKILL after step 13. One rank reads 10
# batches an epoch (step 13 is epoch 1's fourth batch); each of two ranks reads 2 of the 4 shards, 5 batches an
# epoch (step 13 is epoch 2's fourth batch).
WDS_CHAIN_CASE = {"n": 40, "batch_size": 4, "epochs": 3, "sampler": "webdataset"}
WDS_CHAINS: list[dict[str, Any]] = [
    {"name": "webdataset_one_rank", "case": WDS_CHAIN_CASE},
    {"name": "webdataset_ddp", "case": dict(WDS_CHAIN_CASE, devices=2)},
]
REFUSED_EPOCH = {"webdataset_one_rank": 1, "webdataset_ddp": 2}


@pytest.fixture(scope="module")
def webdataset_chains(files: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_chains(WDS_CHAINS, files, tmp_path_factory)


@pytest.mark.slow
@needs_webdataset
@pytest.mark.parametrize("name", sorted(REFUSED_EPOCH))
def test_webdataset_resumed_inside_an_epoch_is_refused_on_every_rank(
    name: str, webdataset_chains: dict[str, Any]
) -> None:
    result = webdataset_chains[name]
    stderr = webdataset_chains["_stderr"]
    assert result["ended"] == ["exit 0", "SIGKILL", "exit 1"], stderr[-3000:]
    checkpoint = result["checkpoints"][0]
    refusal = f"cannot resume inside epoch {REFUSED_EPOCH[name]} exactly (the trainer continues at its batch 3 from "
    assert f"{refusal}{checkpoint})" in stderr, stderr[-3000:]
    # Refused before the first step on every rank: a rank that let it through would have trained (and logged)
    # that step before waiting for the other rank's gradients.
    for rank, reference in result["reference"].items():
        assert len(reference) == 3 * WDS_CHAIN_CASE["n"] // len(result["reference"]), rank
        assert result["resumed"][rank] == reference[: 13 * WDS_CHAIN_CASE["batch_size"]], rank


# -- litdata without the mixin --------------------------------------------------------------------------------

# 40 samples, batch 4: 10 batches an epoch; a checkpoint at global step 13 is 3 batches (12 samples) into epoch 1.
LITDATA_CASE = {"n": 40, "batch_size": 4, "epochs": 4, "sampler": "litdata", "shuffle": True}


@needs_litdata
@pytest.mark.parametrize("workers", [0, 2])
def test_litdata_resumed_without_the_mixin_repeats_the_resumed_epochs_rest_then_runs_an_epoch_behind(
    workers: int, files: Path, tmp_path: Path
) -> None:
    case = dict(LITDATA_CASE, root=str(files / "litdata"), workers=workers)
    build_loader("litdata", Path(case["root"]), n=case["n"])  # the files, written once outside the timed fits
    full, _, _ = _fit_without_mixin(case)
    ckpt = str(tmp_path / "mid.ckpt")
    _fit_without_mixin(dict(case, stop_kind="step", stop_at=13), ckpt_out=ckpt)
    resumed, _, _ = _fit_without_mixin(case, ckpt_in=ckpt)
    # The resumed epoch is exact: Lightning saved and restored the loader's own state.
    assert resumed.by_epoch[1] == full.by_epoch[1][12:]
    # The loader is still restoring when the next epoch starts: it serves the resumed epoch's rest again.
    assert resumed.by_epoch[2] == full.by_epoch[1][12:]
    for epoch in range(3, LITDATA_CASE["epochs"]):
        assert resumed.by_epoch[epoch] == full.by_epoch[epoch - 1] != full.by_epoch[epoch], epoch


# -- torchdata's StatefulDataLoader without the mixin ----------------------------------------------------------

needs_torchdata = pytest.mark.skipif(importlib.util.find_spec("torchdata") is None, reason="torchdata is not installed")
# 20 samples, batch 4, shuffled: 5 batches an epoch; global step 5 is epoch 0's last batch.
STATEFUL_CASE = {"n": 20, "batch_size": 4, "epochs": 2, "sampler": "stateful_loader", "shape": "without_mixin"}


def _stateful_loader_resumed(stop_kind: str, stop_at: int, tmp_path: Path) -> tuple[list[int], list[int], Any]:
    """(the uninterrupted fit's indices, the resumed fit's indices, its trainer): a StatefulDataLoader over a
    map-style dataset resumed by its own state, which Lightning saves and restores; every fit starts from the same
    global seed, as one calling ``seed_everything(0)`` would."""
    torch.manual_seed(0)
    full, _, _ = run(STATEFUL_CASE)
    ckpt = str(tmp_path / "stateful.ckpt")
    torch.manual_seed(0)
    before, _, _ = run(dict(STATEFUL_CASE, stop_kind=stop_kind, stop_at=stop_at), ckpt_out=ckpt)
    assert before.seen == full.seen[:20]
    torch.manual_seed(0)
    after, _, trainer = run(STATEFUL_CASE, ckpt_in=ckpt)
    return full.seen, after.seen, trainer


@needs_torchdata
def test_stateful_dataloader_resumed_by_its_state_after_a_last_batch_checkpoint_trains_an_empty_epoch(
    tmp_path: Path,
) -> None:
    # docs/resume.md, the StatefulDataLoader row: the loader's state, taken on epoch 0's last batch, says that
    # epoch is done; the resumed fit's epoch 1 gets no batch, and the fit ends at max_epochs.
    full, after, trainer = _stateful_loader_resumed("step", 5, tmp_path)
    assert len(full) == 40
    assert after == []
    assert trainer.state.finished and trainer.current_epoch == STATEFUL_CASE["epochs"]


@needs_torchdata
def test_stateful_dataloader_resumed_by_its_state_after_an_epoch_end_checkpoint_trains_another_order(
    tmp_path: Path,
) -> None:
    # docs/resume.md: at an epoch-end checkpoint the resumed epoch 1 holds every sample once, but not in the
    # order the uninterrupted fit trained it: drawn again from the resumed process's random state, so from the
    # same global seed it is epoch 0's order again.
    full, after, _ = _stateful_loader_resumed("epoch_end", 0, tmp_path)
    assert sorted(after) == list(range(20))
    assert after != full[20:]
    assert after == full[:20]


# -- litdata.optimize and the start method --------------------------------------------------------------------

OPTIMIZE = """
import json, multiprocessing, sys
import litdata
from loader_libraries import _litdata_sample

root = sys.argv[1]
methods = [multiprocessing.get_start_method(allow_none=True)]
for name, given in (("default", {}), ("given", {"start_method": "forkserver"})):
    litdata.optimize(
        fn=_litdata_sample, inputs=list(range(8)), output_dir=f"{root}/{name}", chunk_size=4, num_workers=1, **given
    )
    methods.append(multiprocessing.get_start_method(allow_none=True))
print(json.dumps(methods))
"""


@pytest.mark.slow
@needs_litdata
def test_litdata_optimize_sets_the_process_wide_start_method(tmp_path: Path) -> None:
    # A process of its own: the start method is set once per process, and this one's must stay as it is.
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    tests = Path(__file__).parent
    done = run_program(["-c", OPTIMIZE, tmp_path], timeout=300, env=env, cwd=tests)
    assert done.returncode == 0, done.stderr[-4000:]
    methods = json.loads(done.stdout.strip().splitlines()[-1])
    # Importing litdata leaves fork set: spawn is optimize's doing.
    assert methods[0] != "spawn" and methods[1:] == ["spawn", "forkserver"], methods


TRAIN_AFTER_OPTIMIZE = """
import json, os, sys, warnings
import litdata, torch
import loader_fixtures
from lightning_loadguard.synthetic import TimedModule
from loader_libraries import _litdata_sample
from pipelines import quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

root = sys.argv[1]
os.environ[loader_fixtures.WORKER_LOG_ENV] = f"{root}/workers.jsonl"
litdata.optimize(fn=_litdata_sample, inputs=list(range(8)), output_dir=f"{root}/out", chunk_size=4, num_workers=1)
loader_fixtures.parent_mark = True
data = TensorDataset(torch.arange(16), torch.zeros(16, 16))
loader = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=loader_fixtures.record_worker_start)
warnings.simplefilter("ignore")
quiet_trainer(max_epochs=2).fit(TimedModule(), loader)
print(json.dumps({"parent": os.getpid()}))
"""


@pytest.mark.slow
@needs_litdata
def test_after_litdata_optimize_a_fit_spawns_its_non_persistent_workers_at_every_epoch(tmp_path: Path) -> None:
    # docs/loaders.md: after litdata.optimize (no start_method) a training run in the same process starts its
    # DataLoader workers with spawn, each importing everything again, at every epoch unless they are persistent.
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    tests = Path(__file__).parent
    done = run_program(["-c", TRAIN_AFTER_OPTIMIZE, tmp_path], timeout=300, env=env, cwd=tests)
    assert done.returncode == 0, done.stderr[-4000:]
    parent = json.loads(done.stdout.strip().splitlines()[-1])["parent"]
    starts = [json.loads(line) for line in (tmp_path / "workers.jsonl").read_text().splitlines()]
    assert len(starts) == 2, starts  # one worker, started once per epoch
    assert len({s["pid"] for s in starts} | {parent}) == 3
    # Spawned: started by spawn, and without the mark the training process set before the fit (a forked
    # worker inherits the parent's memory; a spawned one imported the module again).
    assert [(s["method"], s["inherited"]) for s in starts] == [("spawn", False), ("spawn", False)]


# -- WebDataset's default nodesplitter ------------------------------------------------------------------------


@needs_webdataset
def test_webdataset_default_nodesplitter_refuses_a_second_rank(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = files / "nodesplitter"
    build_loader("webdataset", root, n=40)  # the files, written as one rank
    # How webdataset learns the rank and world size where no process group is initialised (torchrun sets them).
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="you need to add an explicit nodesplitter"):
        iterate(build_loader("webdataset", root, n=40))
    # The documented fix: split_by_node gives this rank its half of the shards.
    assert iterate(build_loader("webdataset", root, n=40, rank=(1, 2))) == [*range(10, 20), *range(30, 40)]


class ShardsByWorkerInfo(IterableDataset):
    """An iterable that shards by worker itself, through ``get_worker_info()``, declaring nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, self.n, workers):
            yield torch.tensor(i), torch.zeros(16)


def test_an_iterable_sharding_by_worker_info_is_not_recognised_and_keeps_its_workers() -> None:
    # docs/loaders.md, Known limits: the tuner recognises worker sharding by what a library declares; one done
    # through get_worker_info() gets the naive iterable's sentence, and num_workers is kept either way.
    from lightning_loadguard import LoadGuard, TuneOptions
    from lightning_loadguard.synthetic import TimedModule
    from lightning_loadguard.tuning.sharding import worker_sharding

    n = 160
    assert worker_sharding(ShardsByWorkerInfo(n)) is None
    guard = LoadGuard(print_summary=False, auto_tune=TuneOptions(warmup_steps=2, window_steps=6))
    module = TimedModule(step_s=0.004)
    trainer = quiet_trainer(max_epochs=2, callbacks=[guard])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(ShardsByWorkerInfo(n), batch_size=4, num_workers=2))
    decision = guard.decision
    assert decision is not None and decision.verdict == "model_only"
    assert "may not shard by worker, so num_workers is not changed" in decision.reason
    assert trainer.train_dataloader.num_workers == 2
    # Nothing duplicated, nothing lost: no worker was added and no stream restarted mid-epoch.
    assert sorted(module.seen) == sorted(list(range(n)) * 2)
