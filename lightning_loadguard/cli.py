"""The ``loadguard`` command: a self-contained demo, and reports on a run's TensorBoard logs.

Example:
    .. code-block:: console

        $ loadguard demo                         # a data-bound run: figures and diagnosis
        $ loadguard demo --auto-tune             # the same run, fixed while it trains
        $ loadguard report ./loadguard_demo_logs --plot rates.png
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_loadguard.dashboard import METRICS
from lightning_loadguard.report import _NullFile

DEMO_LOGDIR = "loadguard_demo_logs"
"""Where ``loadguard demo`` writes its TensorBoard logs unless ``--logdir`` says otherwise."""

DEMO_LOAD_MS = 30.0
"""Time the demo's loader takes to make one batch (sleeping, like reading files)."""

DEMO_STEP_MS = 40.0
"""Time the demo's training step takes."""

_DEMO_BATCH = 8
_DEMO_WINDOW = 40
_DEMO_LOG_EVERY = 10
_PREFIX = "loadguard/"
_DIAGNOSIS_TAG = "loadguard/diagnosis"
_PLOT_RATES = ("loadguard/producer_rate", "loadguard/consumer_rate", "loadguard/throughput")
_PLOT_FRACTIONS = ("loadguard/wait_fraction", "loadguard/ready_fraction")


class CommandError(Exception):
    """A problem the user can fix (a missing directory, no logs, a missing package): exit status 1."""


# -- tables ---------------------------------------------------------------------------------------------


def render_grid(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, wrap: bool = False) -> str:
    """A table with a header row, drawn with ``rich`` where it is installed, as aligned plain text otherwise.

    Args:
        title: shown above the table.
        header: the column names.
        rows: the cells, as text; the first column names the row.
        wrap: the cells are sentences rather than numbers: left-aligned, and in plain text each row is a
            block (first cell, then ``column: cell`` lines) instead of an aligned line.

    Example:
        >>> print(render_grid("Rates", ["metric", "value"], [["throughput", "12.5"]]))  # doctest: +SKIP
    """
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return _plain_blocks(title, header, rows) if wrap else _plain_grid(title, header, rows)
    table = Table(title=title, title_justify="left", show_lines=wrap)
    for i, name in enumerate(header):
        table.add_column(name, style="bold" if i == 0 else None, justify="left" if i == 0 or wrap else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(width=120, record=True, file=_NullFile())
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")


def _plain_grid(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [title, "-" * len(title)]
    for i, row in enumerate([header, *rows]):
        cells = [f"{c:<{w}}" if j == 0 else f"{c:>{w}}" for j, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _plain_blocks(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [title, "-" * len(title)]
    for row in rows:
        lines.append(row[0])
        for name, cell in zip(header[1:], row[1:], strict=True):
            if cell:
                lines += textwrap.wrap(f"{name}: {cell}", 100, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def _markdown(text: str) -> str:
    """The diagnosis is markdown (TensorBoard renders it); a terminal gets it through rich, or as text."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown
    except ImportError:
        return text.replace("**", "")
    console = Console(width=120, record=True, file=_NullFile())
    console.print(Markdown(text))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _unit(name: str) -> str:
    """The unit of a ``loadguard/*`` metric, from the naming convention the metric names follow."""
    short = name.removeprefix(_PREFIX)
    if short.endswith("_ms"):
        return "ms"
    if short.endswith("_mb"):
        return "MB"
    if short.endswith("_fraction") or short == "gpu_util":
        return "0..1"
    if short.endswith("_rate") or short == "throughput":
        return "batches/s"
    return "rank" if short == "worst_rank" else ""


# -- report ---------------------------------------------------------------------------------------------


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
            if not tag.startswith(_PREFIX):
                continue
            events = sorted(multiplexer.Scalars(name, tag), key=lambda e: (e.step, e.wall_time))
            scalars[tag] = Series(tag, tuple(e.step for e in events), tuple(float(e.value) for e in events))
            last = max(last, max(e.wall_time for e in events))
        texts: dict[str, tuple[int, str]] = {}
        for tag in tags.get(ea.TENSORS, []):
            if not tag.startswith(_PREFIX):
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


def _select_run(runs: list[RunLog], logdir: str, wanted: str | None) -> RunLog:
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
        rows.append(
            [
                tag,
                _fmt(s.latest),
                _fmt(s.mean),
                _fmt(min(s.values)),
                _fmt(max(s.values)),
                _unit(tag),
                str(len(s.values)),
            ]
        )
    steps = sorted({step for s in run.scalars.values() for step in s.steps})
    title = f"LoadGuard report: {run.path} (steps {steps[0]}..{steps[-1]})"
    parts = [render_grid(title, ["metric", "latest", "mean", "min", "max", "unit", "points"], rows)]
    diagnosis = _diagnosis_text(run)
    if diagnosis is not None:
        step, text = diagnosis
        parts.append(f"Diagnosis (logged at step {step}; logged again only when it changes):\n{_markdown(text)}")
    else:
        parts.append(f"No diagnosis text ({_DIAGNOSIS_TAG}) in this run.")
    for tag, (step, text) in sorted(run.texts.items()):
        if not tag.startswith(_DIAGNOSIS_TAG):
            parts.append(f"{_text_name(tag)} (step {step}):\n{_markdown(text)}")
    if others:
        parts.append("Other runs with LoadGuard metrics (choose one with --run): " + ", ".join(r.name for r in others))
    return "\n\n".join(parts)


def _diagnosis_text(run: RunLog) -> tuple[int, str] | None:
    for tag, value in run.texts.items():
        if _text_name(tag) == _DIAGNOSIS_TAG:
            return value
    return None


def _text_name(tag: str) -> str:
    # SummaryWriter.add_text stores "tag" as "tag/text_summary".
    return tag.removesuffix("/text_summary")


def plot_run(run: RunLog, out: str | Path) -> Path:
    """Draw producer capacity, consumer rate, throughput and wait fraction over steps into an image file.

    Raises:
        CommandError: matplotlib is not installed, or the run has none of the plotted metrics.

    Example:
        >>> plot_run(read_runs("loadguard_demo_logs")[-1], "rates.png")  # doctest: +SKIP
        PosixPath('rates.png')
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise CommandError(
            "--plot needs matplotlib, which is not installed: pip install 'lightning-loadguard[plot]' "
            f"(or pip install matplotlib). ({err})"
        ) from err
    if not any(tag in run.scalars for tag in (*_PLOT_RATES, *_PLOT_FRACTIONS)):
        raise CommandError(f"run {run.name} has none of {', '.join(_PLOT_RATES + _PLOT_FRACTIONS)} to plot")
    path = Path(out)
    if not path.parent.is_dir():
        raise CommandError(f"cannot write {path}: {path.parent} is not a directory")
    fig, (rates, fractions) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), height_ratios=(3, 2))
    for tag in _PLOT_RATES:
        if tag in run.scalars:
            rates.plot(run.scalars[tag].steps, run.scalars[tag].values, marker=".", label=tag.removeprefix(_PREFIX))
    rates.set_ylabel("batches / s")
    rates.set_ylim(bottom=0)
    rates.set_title(f"LoadGuard: {run.path}")
    rates.legend(loc="best")
    rates.grid(alpha=0.3)
    for tag in _PLOT_FRACTIONS:
        if tag in run.scalars:
            s = run.scalars[tag]
            fractions.plot(s.steps, s.values, marker=".", label=tag.removeprefix(_PREFIX))
    fractions.set_ylabel("share (0..1)")
    fractions.set_ylim(-0.02, 1.02)
    fractions.set_xlabel("step")
    fractions.legend(loc="best")
    fractions.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except ValueError as err:  # an extension matplotlib has no writer for
        raise CommandError(f"cannot write {path}: {err}") from err
    finally:
        plt.close(fig)
    return path


def _report(args: argparse.Namespace) -> int:
    runs = read_runs(args.logdir)
    run = _select_run(runs, args.logdir, args.run)
    print(format_report(run, [r for r in runs if r is not run]))
    if args.plot:
        print(f"\nPlot written to {plot_run(run, args.plot)}")
    return 0


# -- demo -----------------------------------------------------------------------------------------------


def _timeline_callback(guard: Any) -> Any:
    """A callback that keeps every window LoadGuard publishes, to show the run's first and last figures."""
    from lightning_loadguard._lightning import pl

    class Timeline(pl.Callback):
        def __init__(self) -> None:
            self.windows: list[tuple[int, dict[str, float]]] = []
            self._last: Any = None

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if guard.metrics and guard.metrics is not self._last:
                self._last = guard.metrics
                self.windows.append((trainer.global_step, dict(guard.metrics)))

    return Timeline()


def _make_guard(auto_tune: bool) -> tuple[Any, str | None]:
    from lightning_loadguard.callback import LoadGuard

    kwargs: dict[str, Any] = {"window": _DEMO_WINDOW, "log_every_n_steps": _DEMO_LOG_EVERY, "print_summary": False}
    if not auto_tune:
        return LoadGuard(**kwargs), None
    try:
        return LoadGuard(auto_tune=True, **kwargs), None
    except (ImportError, TypeError) as err:
        return LoadGuard(**kwargs), f"auto-tuning is not available in this installation ({err}); running without it"


def _demo_diagnosis(guard: Any, steps_per_epoch: int) -> Any:
    existing = getattr(guard, "diagnosis", None)
    if existing is not None:
        return existing
    if guard.snapshot is None or not guard.snapshot.step_s:
        return None
    from lightning_loadguard.model import diagnose

    return diagnose(guard.snapshot, steps_per_epoch=steps_per_epoch)


def format_diagnosis(diagnosis: Any) -> str:
    """A :class:`~lightning_loadguard.model.Diagnosis` as a table: each finding with its cost and its fix.

    Example:
        >>> from lightning_loadguard.model import Diagnosis, Finding
        >>> d = Diagnosis("compute_bound", (Finding("compute_bound", 0.0, fix="Nothing.", summary="Fine."),))
        >>> "compute_bound" in format_diagnosis(d)
        True
    """
    rows = [[f.verdict, f"{f.severity:.0%}", f.summary, f.fix] for f in diagnosis.findings]
    if diagnosis.draining is not None:
        rows.append(["draining", "", diagnosis.draining.summary(), ""])
    title = f"Diagnosis: {diagnosis.verdict}"
    return render_grid(title, ["finding", "cost", "what the figures show", "fix"], rows, wrap=True)


def _comparison(first: dict[str, float], last: dict[str, float]) -> str:
    names = [n for n in METRICS if n in first or n in last]
    rows = [[n, _fmt(first.get(n)), _fmt(last.get(n)), _unit(n)] for n in names]
    return render_grid("First window vs last window", ["metric", "first", "last", "unit"], rows)


def _decision_text(decision: Any) -> str:
    table = getattr(decision, "table", None)
    if callable(table):
        return str(table())
    text = getattr(decision, "to_text", None)
    return _markdown(str(text())) if callable(text) else str(decision)


def _demo(args: argparse.Namespace) -> int:
    from lightning_loadguard._lightning import pl
    from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

    logdir = Path(args.logdir)
    if logdir.exists() and not logdir.is_dir():
        raise CommandError(f"--logdir {logdir} exists and is not a directory")
    # The demo's story is told by LoadGuard; Lightning's own hint about num_workers would pre-empt it.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)`.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    samples = args.batches * _DEMO_BATCH
    dataset = TimedDataset(samples, sample_s=DEMO_LOAD_MS / 1e3 / _DEMO_BATCH)
    loader = timed_loader(dataset, batch_size=_DEMO_BATCH, num_workers=0)
    module = TimedModule(step_s=DEMO_STEP_MS / 1e3, features=dataset.features, record=False)
    guard, note = _make_guard(args.auto_tune)
    timeline = _timeline_callback(guard)
    logger = pl.loggers.TensorBoardLogger(save_dir=str(logdir), name="demo")

    print(
        f"LoadGuard demo: each batch takes {DEMO_LOAD_MS:.0f} ms to load and each training step "
        f"{DEMO_STEP_MS:.0f} ms to compute.\nThe loader runs with num_workers=0 (PyTorch's default), so "
        f"every step also waits for its batch to be made. {args.epochs} epoch(s) x {args.batches} batches"
        f"{', auto-tuning on' if guard.auto_tune else ''}.\n"
    )
    if note:
        print(f"note: {note}\n")
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        callbacks=[guard, timeline],
        logger=logger,
        log_every_n_steps=_DEMO_LOG_EVERY,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=not args.no_progress,
    )
    trainer.fit(module, loader)

    diagnosis = _demo_diagnosis(guard, args.batches)
    summary = guard.summary()
    if diagnosis is not None:
        # The summary may end with the diagnosis as markdown; it is shown below as a table instead.
        summary = summary.removesuffix("\n\n" + diagnosis.to_text())
    print("\n" + summary)
    if diagnosis is not None:
        print("\n" + format_diagnosis(diagnosis))
        if not hasattr(guard, "diagnosis"):
            # LoadGuard does not log its diagnosis itself here: log it so `loadguard report` shows it.
            logger.experiment.add_text(_DIAGNOSIS_TAG, diagnosis.to_text(), trainer.global_step)
    if guard.auto_tune:
        decision = getattr(guard, "decision", None)
        if decision is None:
            print("\nThe auto-tuner made no decision in this run (too few steps?).")
        else:
            print("\nAuto-tuner decision:\n" + _decision_text(decision))
        if len(timeline.windows) >= 2:
            print("\n" + _comparison(timeline.windows[0][1], timeline.windows[-1][1]))
    logger.experiment.flush()
    print(
        f"\nTensorBoard logs: {Path(logger.log_dir).resolve()}\n"
        f"  see them:   tensorboard --logdir {logdir}   (Custom Scalars tab: LoadGuard)\n"
        f"  or:         loadguard report {logdir} --plot loadguard.png"
    )
    if not args.auto_tune:
        print("  the fix:    loadguard demo --auto-tune")
    return 0


# -- entry point ----------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``loadguard`` argument parser (``loadguard --help``)."""
    parser = argparse.ArgumentParser(
        prog="loadguard",
        description="Find out what limits your Lightning training: data wait, producer capacity, host budgets.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    demo = commands.add_parser(
        "demo",
        help="train a slow synthetic pipeline and show LoadGuard's figures and diagnosis",
        description=(
            "Train a tiny model on a synthetic pipeline whose loader is slower than its step (CPU, under a "
            "minute), with LoadGuard attached, and show the figures, the diagnosis and, with --auto-tune, the "
            "fix. Writes TensorBoard logs."
        ),
    )
    demo.add_argument("--auto-tune", action="store_true", help="let LoadGuard fix the loader while it trains")
    demo.add_argument(
        "--logdir", default=DEMO_LOGDIR, help=f"where to write TensorBoard logs (default: ./{DEMO_LOGDIR})"
    )
    demo.add_argument("--epochs", type=_positive, default=3, help="epochs to train (default: 3)")
    demo.add_argument("--batches", type=_positive, default=100, help="batches per epoch (default: 100)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(handler=_demo)

    report = commands.add_parser(
        "report",
        help="summarise the loadguard/* metrics and diagnosis of a run's TensorBoard logs",
        description=(
            "Read the TensorBoard event files under LOGDIR with TensorBoard's own reader and print the "
            "loadguard/* metrics (latest, mean, min, max) and the latest diagnosis of the most recent run."
        ),
    )
    report.add_argument("logdir", metavar="LOGDIR", help="a TensorBoard log directory (searched recursively)")
    report.add_argument("--run", help="the run to report, as listed (default: the most recently written)")
    report.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw producer capacity, consumer rate, throughput and wait fraction over steps (matplotlib)",
    )
    report.set_defaults(handler=_report)
    return parser


def _version() -> str:
    from lightning_loadguard import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``loadguard`` command; returns the exit status (0 done, 1 failed, 2 bad arguments).

    Example:
        >>> main(["report", "loadguard_demo_logs"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except CommandError as err:
        print(f"loadguard {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``loadguard report DIR | head``): not an error, and nothing left to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
