"""LoadGuard and ResumableLoaderMixin under the ``pytorch_lightning`` distribution's Trainer.

``lightning`` depends on ``pytorch_lightning``, so both are installed wherever LoadGuard is; the rest of the
suite runs ``lightning.pytorch``. The standalone case hides ``lightning`` as if only ``pytorch_lightning``
were installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_FIT = textwrap.dedent(
    """
    import importlib, math, sys, warnings
    import torch
    from torch.utils.data import DataLoader

    namespace = sys.argv[1]
    if namespace == "pytorch_lightning" and sys.argv[2] == "alone":
        # As on a machine with only the standalone package: importing `lightning` fails.
        sys.modules["lightning"] = None
    pl = importlib.import_module(namespace)

    from lightning_loadguard import LoadGuard
    from lightning_loadguard.datamodule import STATE_KEY, ResumableLoaderMixin
    from lightning_loadguard.synthetic import TimedDataset

    class Data(ResumableLoaderMixin, pl.LightningDataModule):
        loader_seed = 1

        def train_dataloader(self):
            return DataLoader(TimedDataset(48, sample_s=0.002), batch_size=4, shuffle=True, num_workers=1)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.extend(int(i) for i in batch[0])
            return self.layer(batch[1]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with_guard = sys.argv[4] == "guard"
    guard = LoadGuard(window=6, log_every_n_steps=3, print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[guard] if with_guard else [], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Model()
        trainer.fit(model, datamodule=Data())
    assert sorted(model.seen) == list(range(48)), model.seen
    if with_guard:
        for name in ("loadguard/wait_fraction", "loadguard/producer_rate", "loadguard/ready_fraction"):
            assert name in guard.metrics and not math.isnan(guard.metrics[name]), (name, guard.metrics)
        assert guard.metrics["loadguard/data_wait_ms"] > 0, guard.metrics
        assert guard.diagnosis is not None
    path = sys.argv[3]
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)
    assert STATE_KEY in state["Data"], list(state)
    print("loaded:", sorted(m for m in ("lightning", "pytorch_lightning") if sys.modules.get(m) is not None))
    """
)


def _fit(namespace: str, mode: str, tmp_path: Path, guard: str = "guard") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "fit.py"
    script.write_text(_FIT)
    return subprocess.run(
        [sys.executable, str(script), namespace, mode, str(tmp_path / "last.ckpt"), guard],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _standalone_release() -> tuple[int, int]:
    from importlib.metadata import version

    major, minor = version("pytorch_lightning").split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize(
    ("namespace", "mode", "loaded"),
    [
        ("pytorch_lightning", "both", "['lightning', 'pytorch_lightning']"),
        ("pytorch_lightning", "alone", "['pytorch_lightning']"),
    ],
)
def test_trainer_of_either_distribution_runs_loadguard_and_the_mixin(
    namespace: str, mode: str, loaded: str, tmp_path: Path
) -> None:
    if mode == "both" and _standalone_release() < (2, 6):
        # docs/troubleshooting.md: Lightning 2.5's pytorch_lightning.Trainer refuses a callback of the `lightning`
        # package, which LoadGuard is wherever `lightning` is installed; the mixin works there.
        refused = _fit(namespace, mode, tmp_path)
        assert refused.returncode != 0 and "ValueError: Expected a parent" in refused.stderr, refused.stderr[-3000:]
        done = _fit(namespace, mode, tmp_path, "no guard")
    else:
        done = _fit(namespace, mode, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"loaded: {loaded}" in done.stdout
