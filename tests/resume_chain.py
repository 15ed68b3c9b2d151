"""Kill-and-resume chains: every segment of a run is a real process killed with SIGKILL after a checkpoint.

``python tests/resume_chain.py scenarios.json results.json`` imports torch and Lightning once, then forks one
process per fit: the uninterrupted reference run, and each segment of the interrupted run. A segment resumes
from the checkpoint the previous segment named (in a file written just before it died), saves where its
``kill`` says, and kills its whole process group (its DataLoader workers and, under DDP, every rank) with
SIGKILL. Each rank appends the sample indices of every training step to a log as it trains, so the logs hold
exactly what training consumed. The results (per scenario: how each process ended, the reference's and the
concatenated segments' indices per rank, Lightning's "not resumable" warnings) go to ``results.json``.

A scenario: ``{"name": ..., "case": {...resume_harness case...}, "segments": [segment, ...]}`` where a
segment may set ``max_steps`` and ``max_epochs``, add Lightning's own checkpoints (``every_step_checkpoint``:
``ModelCheckpoint(every_n_train_steps=1)``; ``epoch_end_checkpoint``: ``ModelCheckpoint()``), and one of
``"kill": {"kind": "step" | "mcp" | "epoch_end", "at": N}`` (save with ``trainer.save_checkpoint`` at global
step N / let ``ModelCheckpoint(every_n_train_steps=N)`` save / let ``ModelCheckpoint()`` save at the end of
epoch N, then die) or ``"save": "after_fit" | "epoch_end"`` (the fit ends by ``max_steps``; the next segment
resumes from ``trainer.save_checkpoint`` after fit, or from the epoch-end checkpoint of the truncated epoch).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from resume_harness import Recorder, case_trainer, make_datamodule

NOT_RESUMABLE = "dataloader is not resumable"


class Killer(Recorder):
    """Records the indices each step trains; saves a checkpoint where told, names it, and dies."""

    def __init__(self, case: dict[str, Any], kill: dict[str, Any] | None, name_file: str, log: str) -> None:
        super().__init__(case, log=log)
        self.kill = kill or {}
        self.name_file = name_file

    def _name(self, path: str) -> None:
        if self.global_rank == 0:
            Path(self.name_file).write_text(path)

    def _die(self) -> None:
        # Every rank has saved and stands here: nobody trains another step before the whole group dies.
        self.trainer.strategy.barrier()
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        kind = self.kill.get("kind")
        if kind not in ("step", "mcp") or self.global_step != self.kill["at"]:
            return
        if kind == "step":
            path = f"{self.name_file}.step{self.global_step}.ckpt"
            self.trainer.save_checkpoint(path)
        else:
            path = self.trainer.checkpoint_callback.best_model_path  # saved by ModelCheckpoint just before
        self._name(path)
        self._die()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.kill.get("kind") == "epoch_end" and self.current_epoch == self.kill["at"] + 1:
            self._name(self.trainer.checkpoint_callback.best_model_path)
            self._die()


def fit_segment(case: dict[str, Any], seg: dict[str, Any], ckpt_in: str | None, log: str, name_file: str) -> None:
    if case.get("seed_everything") is not None:
        pl.seed_everything(case["seed_everything"], verbose=False)
    kill = seg.get("kill")
    save = seg.get("save")
    ckpt_dir = f"{name_file}.ckpts"
    callbacks: list[pl.Callback] = []
    if kill and kill["kind"] == "mcp":
        callbacks.append(
            ModelCheckpoint(dirpath=ckpt_dir, filename="{step}", every_n_train_steps=kill["at"], save_top_k=-1)
        )
    if seg.get("every_step_checkpoint"):
        callbacks.append(ModelCheckpoint(dirpath=f"{ckpt_dir}/steps", filename="{step}", every_n_train_steps=1))
    if (kill and kill["kind"] == "epoch_end") or save == "epoch_end" or seg.get("epoch_end_checkpoint"):
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}-{step}", save_top_k=-1))
    # Each segment is a forked process of this driver: DDP ranks fork from it too.
    trainer = case_trainer(
        case,
        callbacks,
        max_epochs=seg.get("max_epochs", case.get("epochs", 2)),
        max_steps=seg.get("max_steps", case.get("max_steps", -1)),
        strategy="ddp_fork" if case.get("devices", 1) > 1 else "auto",
    )
    model = Killer(case, kill, name_file, log)
    trainer.fit(model, datamodule=make_datamodule(case), ckpt_path=ckpt_in)
    if save == "after_fit":
        path = f"{name_file}.after_fit.ckpt"
        trainer.save_checkpoint(path)
        Path(name_file).write_text(path)
    elif save == "epoch_end":
        Path(name_file).write_text(trainer.checkpoint_callback.best_model_path)


def _record_warnings(path: str) -> None:
    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(str(message)) + "\n")

    warnings.simplefilter("always")
    warnings.showwarning = show


def in_child(fn: Callable[[], None], warnings_log: str) -> str:
    """Run ``fn`` in a forked process with its own process group; how it ended: ``SIGKILL`` or ``exit N``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.setpgid(0, 0)
            _record_warnings(warnings_log)
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit {os.WEXITSTATUS(status)}"


def _indices(log: str, rank: int) -> list[int]:
    path = Path(f"{log}.rank{rank}")
    return [i for line in path.read_text().splitlines() for i in json.loads(line)] if path.exists() else []


def _warned(path: str) -> list[str]:
    p = Path(path)
    return [m for m in map(json.loads, p.read_text().splitlines()) if NOT_RESUMABLE in m] if p.exists() else []


def run_scenario(scenario: dict[str, Any], tmp: Path) -> dict[str, Any]:
    case = scenario["case"]
    ranks = range(case.get("devices", 1))
    ref_log = str(tmp / "ref")
    reference = dict(scenario.get("reference", {}))
    ended = [in_child(lambda: fit_segment(case, reference, None, ref_log, str(tmp / "ref.name")), f"{ref_log}.w")]
    ckpt: str | None = None
    resumed: dict[int, list[int]] = {r: [] for r in ranks}
    warned: list[list[str]] = []
    named: list[str | None] = []
    for i, seg in enumerate(scenario["segments"]):
        log, name_file = str(tmp / f"seg{i}"), str(tmp / f"seg{i}.name")
        ended.append(in_child(lambda s=seg, c=ckpt, lg=log, nf=name_file: fit_segment(case, s, c, lg, nf), f"{log}.w"))
        for r in ranks:
            resumed[r] += _indices(log, r)
        warned.append(_warned(f"{log}.w"))
        ckpt = Path(name_file).read_text() if Path(name_file).exists() else None
        named.append(ckpt)
        if ended[-1].startswith("exit") and ended[-1] != "exit 0":
            break
    return {
        "ended": ended,
        "reference": {r: _indices(ref_log, r) for r in ranks},
        "resumed": resumed,
        "warned": warned,
        "checkpoints": named,
    }


def main() -> None:
    scenarios = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    results = {}
    for scenario in scenarios:
        tmp = out.parent / scenario["name"]
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        results[scenario["name"]] = run_scenario(scenario, tmp)
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
