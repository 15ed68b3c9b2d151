"""Reading a run's ``loadguard/*`` figures back from its TensorBoard event files, and the report on them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_loadguard.cli import CommandError
from lightning_loadguard.dashboard import METRICS
from lightning_loadguard.model.forecast import FACTS_TAG, ForecastFacts, WhatIf, forecast
from lightning_loadguard.report import METRIC_PREFIX, format_number, metric_unit, render_markdown, render_table

DIAGNOSIS_TAG = "loadguard/diagnosis"


@dataclass(frozen=True)
class Series:
    """One scalar tag of a run: its steps and values in step order."""

    tag: str
    steps: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def latest(self) -> float:
        return self.values[-1]

    @property
    def mean(self) -> float:
        finite = [v for v in self.values if math.isfinite(v)]
        return math.fsum(finite) / len(finite) if finite else math.nan


@dataclass(frozen=True)
class RunLog:
    """What a run's TensorBoard event files hold under ``loadguard/``.

    Attributes:
        name: the run's directory relative to the log directory (``.`` for the directory itself).
        path: the run's directory.
        scalars: every ``loadguard/*`` scalar tag, by tag.
        texts: the latest text of every ``loadguard/*`` text tag (the diagnosis, the tuner's decision),
            by tag as it was logged, with the step it was logged at.
        last_wall_time: when the run last wrote a ``loadguard/*`` event (seconds since the epoch).
    """

    name: str
    path: str
    scalars: dict[str, Series]
    texts: dict[str, tuple[int, str]]
    last_wall_time: float


def read_runs(logdir: str | Path) -> list[RunLog]:
    """Read every run under ``logdir`` that holds ``loadguard/*`` scalars, with TensorBoard's own reader.

    Returns the runs, the most recently written last.

    Raises:
        CommandError: ``logdir`` does not exist or holds no TensorBoard event files.

    Example:
        >>> runs = read_runs("loadguard_demo_logs")  # doctest: +SKIP
        >>> runs[-1].scalars["loadguard/wait_fraction"].latest  # doctest: +SKIP
        0.43
    """
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    root = Path(logdir)
    if not root.exists():
        raise CommandError(f"{root} does not exist")
    if not root.is_dir():
        raise CommandError(f"{root} is not a directory: give the directory that holds the event files")
    if not any(p.name.startswith("events.out.tfevents") for p in root.rglob("events.out.tfevents*")):
        raise CommandError(f"no TensorBoard event files (events.out.tfevents.*) under {root}")
    # 0 keeps every event: the mean, min and max are over the whole run, not a reservoir sample.
    multiplexer = EventMultiplexer(size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    multiplexer.AddRunsFromDirectory(str(root))
    multiplexer.Reload()
    paths = multiplexer.RunPaths()
    runs = []
    for name, tags in multiplexer.Runs().items():
        scalars: dict[str, Series] = {}
        last = 0.0
        for tag in tags.get(ea.SCALARS, []):
            if not tag.startswith(METRIC_PREFIX):
                continue
            events = sorted(multiplexer.Scalars(name, tag), key=lambda e: (e.step, e.wall_time))
            scalars[tag] = Series(tag, tuple(e.step for e in events), tuple(float(e.value) for e in events))
            last = max(last, max(e.wall_time for e in events))
        texts: dict[str, tuple[int, str]] = {}
        for tag in tags.get(ea.TENSORS, []):
            if not tag.startswith(METRIC_PREFIX):
                continue
            text = _latest_text(multiplexer.Tensors(name, tag))
            if text is not None:
                texts[tag] = text
        if scalars:
            runs.append(RunLog(name, paths.get(name, name), scalars, texts, last))
    return sorted(runs, key=lambda r: r.last_wall_time)


def _latest_text(events: Sequence[Any]) -> tuple[int, str] | None:
    from tensorboard.util import tensor_util

    if not events:
        return None
    event = max(events, key=lambda e: (e.step, e.wall_time))
    try:
        array = tensor_util.make_ndarray(event.tensor_proto)
    except (TypeError, ValueError):
        return None
    if array.dtype.kind not in "SUO":
        return None
    items = array.reshape(-1).tolist()
    text = "\n".join(i.decode("utf-8", "replace") if isinstance(i, bytes) else str(i) for i in items)
    return int(event.step), text


def select_run(runs: list[RunLog], logdir: str, wanted: str | None) -> RunLog:
    """The run called ``wanted`` (its name or path), else the most recently written one.

    Raises:
        CommandError: no run holds ``loadguard/*`` scalars, or none is called ``wanted``.
    """
    if not runs:
        raise CommandError(
            f"no loadguard/* scalars under {logdir}: was LoadGuard among the trainer's callbacks, with a "
            "TensorBoardLogger, for at least log_every_n_steps steps?"
        )
    if wanted is None:
        return runs[-1]
    for run in runs:
        if wanted in (run.name, run.path) or Path(run.path).resolve() == Path(wanted).resolve():
            return run
    names = ", ".join(r.name for r in runs)
    raise CommandError(f"no run named {wanted!r} with loadguard/* scalars under {logdir}; runs: {names}")


def format_report(run: RunLog, others: Sequence[RunLog] = ()) -> str:
    """The report on one run: a table of its ``loadguard/*`` scalars and its latest diagnosis."""
    order = {name: i for i, name in enumerate(METRICS)}
    tags = sorted(run.scalars, key=lambda t: (order.get(t, len(order)), t))
    rows = []
    for tag in tags:
        s = run.scalars[tag]
        figures = (s.latest, s.mean, min(s.values), max(s.values))
        rows.append([tag, *map(format_number, figures), metric_unit(tag), str(len(s.values))])
    steps = sorted({step for s in run.scalars.values() for step in s.steps})
    title = f"LoadGuard report: {run.path} (steps {steps[0]}..{steps[-1]})"
    headers = ["metric", "latest", "mean", "min", "max", "unit", "points"]
    parts = [render_table(title, rows, headers, numbers=True)]
    diagnosis = next((value for tag, value in run.texts.items() if _text_name(tag) == DIAGNOSIS_TAG), None)
    if diagnosis is not None:
        step, text = diagnosis
        parts.append(f"Diagnosis (logged at step {step}; logged again only when it changes):\n{render_markdown(text)}")
    else:
        parts.append(f"No diagnosis text ({DIAGNOSIS_TAG}) in this run.")
    for tag, (step, text) in sorted(run.texts.items()):
        if not tag.startswith(DIAGNOSIS_TAG):
            parts.append(f"{_text_name(tag)} (step {step}):\n{render_markdown(text)}")
    if others:
        parts.append("Other runs with LoadGuard metrics (choose one with --run): " + ", ".join(r.name for r in others))
    return "\n\n".join(parts)


def _text_name(tag: str) -> str:
    # SummaryWriter.add_text stores "tag" as "tag/text_summary".
    return tag.removesuffix("/text_summary")


def format_forecasts(run: RunLog, what_ifs: Sequence[WhatIf]) -> str:
    """Each what-if forecast from the facts the run logged at the end of its fit.

    Raises:
        CommandError: the run logged no forecast facts, or they do not read back.
    """
    logged = next((value for tag, value in run.texts.items() if _text_name(tag) == FACTS_TAG), None)
    if logged is None:
        raise CommandError(
            f"{run.path} holds no forecast facts ({FACTS_TAG}): LoadGuard logs them to TensorBoard at the end of fit; "
            "was the fit finished with this version?"
        )
    step, text = logged
    try:
        facts = ForecastFacts.from_text(text)
    except (TypeError, ValueError) as err:
        raise CommandError(f"the forecast facts logged at step {step} do not read back: {err}") from None
    parts = [f"Forecast from the facts logged at step {step}:"]
    parts += [str(forecast(facts, what_if)) for what_if in what_ifs]
    return "\n\n".join(parts)
