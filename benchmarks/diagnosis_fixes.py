"""Does the diagnosis's fix work, and does it say so only when it does? Each pipeline is diagnosed, the fix it
states is applied, and the step rate is measured before and after, side by side.

    python benchmarks/diagnosis_fixes.py             # every case, 3 alternating rounds
    python benchmarks/diagnosis_fixes.py --quick     # 1 round, shorter runs
    python benchmarks/diagnosis_fixes.py --only cpu_contended competing_process

For each case (a pipeline built so that one constraint dominates):

1. a fit with ``LoadGuard`` gives the diagnosis: its verdict, ``diagnosis.recommended`` (DataLoader keyword
   arguments) and ``diagnosis.certain``; the verdict must be one the pipeline was built to show;
2. the stated fix is applied: the recommended settings when the diagnosis is certain; when it is not, the
   fix it states instead, ``LoadGuard(auto_tune=True)``, whose decision is applied; where the fix is a code
   change (``recommended == {}`` with an action), the benchmark makes that change as the fix describes it
   (a collate_fn, or torch's sharing strategy set for the measured fit alone);
3. the step rate (steps/s over whole epochs from the first batch on, later epochs' iterator start-up included,
   in a Lightning fit of the same module without LoadGuard) is measured before and after, in alternating
   rounds (before, after; then after, before), each setting's figure its median over the rounds.

Target: ``after / before >= 0.98`` for every applied fix. A certain recommendation that would lower the rate
is the failure this benchmark exists to catch; an uncertain one is also measured as "applied anyway" to show
why it was not stated as certain. The compute-bound case checks its own claim: with batches made for free (in
memory) the step rate must not rise by more than 5 %.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuard
from lightning_loadguard.meters.settings import SWITCHABLE, settings_of
from lightning_loadguard.model.findings import Diagnosis
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning.options import TuneOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer
from workloads import CpuModule, JpegDataset, Stopwatch, make_jpegs

NOT_LOWER = 0.98
"""A fix may not lower the step rate below this share of the rate before it."""

FREE_LOADER_GAIN = 1.05
"""For a compute-bound verdict: a loader that costs nothing may raise the step rate by at most this factor."""


def _slow_worker_init(worker_id: int) -> None:
    time.sleep(0.25)  # opening a remote store, loading an index: paid again by every new worker


class ManySmallTensors(Dataset):
    """Samples of 96 small tensors each: handing a batch of them from a worker costs one shared-memory file
    per tensor, a real cost in the training process (not a delay injected for the benchmark)."""

    def __init__(self, length: int, pieces: int = 96) -> None:
        self.length, self.pieces = length, pieces

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return torch.tensor(index), [torch.full((4,), float(index + k)) for k in range(self.pieces)]


def collate_pieces(samples: list[Any]) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Keeps every piece a tensor of its own (the cost the diagnosis should name)."""
    return torch.stack([s[0] for s in samples]), [list(s[1]) for s in samples]


def collate_stacked(samples: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The fix the diagnosis states: one contiguous tensor per batch."""
    return torch.stack([s[0] for s in samples]), torch.stack([torch.stack(s[1]) for s in samples])


@dataclass
class Case:
    """A pipeline: its dataset, loader settings, step, and the verdicts it is built to show."""

    name: str
    expected: tuple[str, ...]
    dataset: Callable[[], Dataset]
    loader: dict[str, Any]
    module: Callable[[], Any]
    epochs: int = 1
    batch_size: int = 4
    window: int = 30
    code_fix: dict[str, Any] = field(default_factory=dict)  # what the fix's words ask the user to change
    competitor: bool = False

    def build(self, **settings: Any) -> DataLoader:
        return timed_loader(self.dataset(), batch_size=self.batch_size, **{**self.loader, **settings})


def cases(tmp: Path, quick: bool) -> list[Case]:
    scale = 2 if quick else 3
    jpegs: list[Path] = []

    def jpeg_dataset() -> Dataset:
        if not jpegs:
            jpegs.extend(make_jpegs(tmp / "jpeg", 32))
        return JpegDataset(jpegs, 32 * 12 * scale)

    return [
        # One worker sleeping 120 ms a batch (I/O) against a 60 ms step.
        Case(
            "producer_deficit",
            ("producer_deficit",),
            lambda: TimedDataset(4 * 16 * scale, sample_s=0.030),
            {"num_workers": 1, "persistent_workers": True},
            lambda: TimedModule(0.060, record=False),
        ),
        # One batch in seven costs 200 ms more; on average the worker keeps up (33 ms against 60 ms).
        Case(
            "bursty",
            ("bursty",),
            lambda: TimedDataset(4 * 21 * scale, sample_s=0.001, burst_every=4 * 7, burst_s=0.200),
            {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True},
            lambda: TimedModule(0.060, record=False),
            window=42,
        ),
        # Eight-step epochs whose two workers spend 250 ms starting up each epoch (worker_init_fn).
        Case(
            "epoch_start_stall",
            ("epoch_start_stall",),
            lambda: TimedDataset(4 * 8, sample_s=0.001),
            {"num_workers": 2, "worker_init_fn": _slow_worker_init},
            lambda: TimedModule(0.030, record=False),
            epochs=3 * scale,
            window=16,
        ),
        # Batches of 4 x 96 small tensors: ready in the worker, slow to take in the training process.
        Case(
            "transfer_bound",
            ("transfer_bound",),
            lambda: ManySmallTensors(8 * 16 * scale),
            {"num_workers": 2, "persistent_workers": True, "collate_fn": collate_pieces},
            lambda: _PieceModule(0.030),
            batch_size=8,
            code_fix={"collate_fn": collate_stacked},
        ),
        # Two workers computing 8 ms a batch in Python, batches of two tensors, a 6 ms step that waits: taking
        # a made batch waits for its worker's sharer thread under torch's default sharing strategy.
        Case(
            "transfer_bound_sharing",
            ("transfer_bound",),
            lambda: TimedDataset(4 * 400 * scale, sample_s=0.002, spin=True),
            {"num_workers": 2, "persistent_workers": True},
            lambda: TimedModule(0.006, record=False),
            window=60,
            code_fix={"sharing_strategy": "file_system"},
        ),
        # Five workers computing 8 ms a batch in Python on a 2-core host, a 4 ms step that waits: more workers
        # than cores, where the workers the cores carry alone could not make the batches the loop takes.
        Case(
            "host_oversubscribed",
            ("host_oversubscribed",),
            lambda: TimedDataset(4 * 400 * scale, sample_s=0.002, spin=True),
            {"num_workers": 5, "persistent_workers": True},
            lambda: TimedModule(0.004, record=False),
            window=60,
        ),
        # Two workers at 8 ms a batch against a 60 ms step: nothing in the loader to change.
        Case(
            "compute_bound",
            ("compute_bound",),
            lambda: TimedDataset(4 * 16 * scale, sample_s=0.002),
            {"num_workers": 2, "persistent_workers": True},
            lambda: TimedModule(0.060, record=False),
        ),
        # JPEG decoding in the loop and a small CNN whose torch threads use every core.
        Case(
            "cpu_contended",
            ("producer_deficit", "compute_bound"),
            jpeg_dataset,
            {"num_workers": 0},
            lambda: CpuModule("cnn"),
            batch_size=32,
            window=10,
        ),
        # 16 ms of CPU work per batch in one worker against a 10 ms waiting step, and another job spinning.
        Case(
            "competing_process",
            ("producer_deficit",),
            lambda: TimedDataset(4 * 40 * scale, sample_s=0.004, spin=True),
            {"num_workers": 1, "persistent_workers": True},
            lambda: TimedModule(0.010, record=False),
            competitor=True,
        ),
    ]


class _PieceModule(TimedModule):
    """A :class:`TimedModule` for ``(index, pieces)`` batches, whatever the collate made of the pieces."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(torch.zeros(1, self.layer.in_features)).pow(2).mean()


def diagnose(case: Case) -> LoadGuard:
    guard = LoadGuard(window=case.window, log_every_n_steps=max(2, case.window // 3), print_summary=False)
    quiet_trainer(max_epochs=case.epochs, callbacks=[guard]).fit(case.module(), case.build())
    return guard


def tuned_settings(case: Case) -> dict[str, Any]:
    """The stated fix where the diagnosis is not certain: let the tuner measure, and keep its decision."""
    guard = LoadGuard(print_summary=False, auto_tune=TuneOptions())
    quiet_trainer(max_epochs=max(1, case.epochs), callbacks=[guard]).fit(case.module(), case.build())
    d = guard.decision
    if d is None:
        return {}
    settings: dict[str, Any] = {"num_workers": d.num_workers, "persistent_workers": d.persistent_workers}
    if d.num_workers > 0:
        settings["prefetch_factor"] = d.prefetch_factor
    return settings


class _InMemory:
    """Batches made beforehand, replayed every epoch (an iterable, not a list: Lightning takes a list for
    several loaders)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def step_rate(case: Case, settings: dict[str, Any], in_memory: bool = False) -> float:
    """Steps/s over whole epochs of the case's Lightning fit without LoadGuard (the run the diagnosis saw,
    whose loop uses CPU beside the workers), from the first batch on: every later epoch's iterator start-up
    counts, the first one (paid by every setting alike) does not."""
    settings = dict(settings)
    strategy = settings.pop("sharing_strategy", None)
    before = torch.multiprocessing.get_sharing_strategy()
    if strategy is not None:
        torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        loader = case.build(**settings)
        data: Any = _InMemory(list(loader)) if in_memory else loader
        watch = Stopwatch(warmup=0)
        quiet_trainer(max_epochs=max(1, case.epochs), callbacks=[watch]).fit(case.module(), data)
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
    return watch.rate


def _describe(settings: dict[str, Any]) -> str:
    if not settings:
        return "nothing"
    return ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in settings.items() if k not in ("worker_init_fn",))


def _same(loader: dict[str, Any], applied: dict[str, Any]) -> bool:
    """Whether ``applied`` leaves the loader as it was (a tuner that kept the user's settings)."""
    if set(applied) - set(SWITCHABLE):
        return False  # a collate_fn or another change in code
    return settings_of(SimpleNamespace(**loader)) == settings_of(SimpleNamespace(**{**loader, **applied}))


def _spinner() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def _measure(
    case: Case, settings: dict[str, Any], rounds: int, in_memory: bool = False
) -> tuple[float, float, list[float]]:
    """Median step rate before and after, alternating their order each round, and each round's ratio."""
    before, after, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            b = step_rate(case, {})
            a = step_rate(case, settings, in_memory)
        else:
            a = step_rate(case, settings, in_memory)
            b = step_rate(case, {})
        before.append(b)
        after.append(a)
        ratios.append(a / b)
    return statistics.median(before), statistics.median(after), ratios


def run(case: Case, rounds: int) -> tuple[list[str], bool]:
    competitor = _spinner() if case.competitor else None
    try:
        guard = diagnose(case)
        d: Diagnosis | None = guard.diagnosis
        assert d is not None
        verdict_ok = d.verdict in case.expected
        recommended = {**d.recommended, **(case.code_fix if d.verdict == "transfer_bound" else {})}
        applied, how = recommended, "recommended"
        anyway = ""
        if d.verdict == "compute_bound":
            before, after, ratios = _measure(case, {}, rounds, in_memory=True)
            ok = after / before <= FREE_LOADER_GAIN
            outcome = f"loader made free: x{after / before:.2f} (claim holds if <= {FREE_LOADER_GAIN})"
            return (
                [
                    case.name,
                    d.verdict + ("" if verdict_ok else " (WRONG)"),
                    "nothing",
                    "yes",
                    f"{before:.1f}",
                    f"{after:.1f}",
                    " ".join(f"{r:.2f}" for r in ratios),
                    outcome,
                ],
                ok and verdict_ok,
            )
        if not d.certain:
            # The diagnosis said it is a hypothesis and pointed to the tuner: apply the tuner's decision.
            if recommended:
                b, a, _ = _measure(case, recommended, 1)
                anyway = f"; {_describe(recommended)} applied anyway: x{a / b:.2f}"
            applied, how = tuned_settings(case), "auto_tune=True decided"
        if _same(case.loader, applied):
            row = [
                case.name,
                d.verdict + ("" if verdict_ok else " (WRONG)"),
                f"your settings kept ({how})",
                "yes" if d.certain else "no",
                "-",
                "-",
                "-",
                "ok: nothing changed" + anyway,
            ]
            return row, verdict_ok
        before, after, ratios = _measure(case, applied, rounds)
        ratio = after / before
        ok = ratio >= NOT_LOWER and verdict_ok
        outcome = ("ok" if ratio >= NOT_LOWER else "FIX LOWERED THE STEP RATE") + anyway
        row = [
            case.name,
            d.verdict + ("" if verdict_ok else " (WRONG)"),
            f"{_describe(applied)} ({how})",
            "yes" if d.certain else "no",
            f"{before:.1f}",
            f"{after:.1f}",
            " ".join(f"{r:.2f}" for r in ratios),
            outcome,
        ]
        return row, ok
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, shorter runs")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, quick 1)")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    rounds = args.rounds or (1 if args.quick else 3)
    rows, failures, loads = [], [], [_load()]
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases(Path(tmp), args.quick):
            if args.only is not None and case.name not in args.only:
                continue
            row, ok = run(case, rounds)
            rows.append(row)
            loads.append(_load())
            if not ok:
                failures.append(case.name)
            print(f"{case.name}: done (load {loads[-1]})", flush=True)
    headers = (
        "case",
        "verdict",
        "fix applied",
        "certain",
        "steps/s before",
        "after",
        "after/before per round",
        "outcome",
    )
    print(
        render_table(
            f"Diagnosis fixes, median of {rounds} alternating round(s); load seen: {' | '.join(loads)}",
            rows,
            headers,
            wrap=True,
        )
    )
    if failures:
        raise SystemExit(f"the stated fix lowered the step rate or the verdict was wrong for: {', '.join(failures)}")


if __name__ == "__main__":
    main()
