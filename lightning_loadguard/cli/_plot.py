"""Drawing a run's rates and wait fractions over steps (``loadguard report --plot``), with matplotlib."""

from __future__ import annotations

import itertools
from pathlib import Path

from lightning_loadguard.cli import CommandError
from lightning_loadguard.cli._runs import RunLog
from lightning_loadguard.report import METRIC_PREFIX

RATES = ("loadguard/producer_rate", "loadguard/consumer_rate", "loadguard/throughput")
FRACTIONS = ("loadguard/wait_fraction", "loadguard/ready_fraction")
WORKERS = "loadguard/num_workers"


def switches(run: RunLog) -> list[tuple[float, str]]:
    """The steps where the loader's ``num_workers`` changed (the auto-tuner's switches), with a label."""
    if WORKERS not in run.scalars:
        return []
    s = run.scalars[WORKERS]
    pairs = list(zip(s.steps, s.values, strict=False))
    return [
        (step, f"workers {int(before)} -> {int(value)}")
        for (_, before), (step, value) in itertools.pairwise(pairs)
        if value != before
    ]


def plot_run(run: RunLog, out: str | Path) -> Path:
    """Draw producer capacity, consumer rate, throughput and wait fraction over steps into an image file, with a
    dashed line where the loader's settings switched.

    Raises:
        CommandError: matplotlib is not installed, the run has none of the plotted metrics, or ``out``
            cannot be written.

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
    if not any(tag in run.scalars for tag in (*RATES, *FRACTIONS)):
        raise CommandError(f"run {run.name} has none of {', '.join(RATES + FRACTIONS)} to plot")
    path = Path(out)
    if not path.parent.is_dir():
        raise CommandError(f"cannot write {path}: {path.parent} is not a directory")
    fig, (rates, fractions) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), height_ratios=(3, 2))
    for axes, tags in ((rates, RATES), (fractions, FRACTIONS)):
        for tag in tags:
            if tag in run.scalars:
                s = run.scalars[tag]
                axes.plot(s.steps, s.values, marker=".", label=tag.removeprefix(METRIC_PREFIX))
        for step, label in switches(run):
            axes.axvline(step, color="grey", linestyle="--", linewidth=1)
            if axes is rates:
                axes.annotate(label, (step, 0), xytext=(3, 3), textcoords="offset points", fontsize=8, color="grey")
        axes.legend(loc="best")
        axes.grid(alpha=0.3)
    rates.set_ylabel("batches / s")
    rates.set_ylim(bottom=0)
    rates.set_title(f"LoadGuard: {run.path}")
    fractions.set_ylabel("share (0..1)")
    fractions.set_ylim(-0.02, 1.02)
    fractions.set_xlabel("step")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except ValueError as err:  # an extension matplotlib has no writer for
        raise CommandError(f"cannot write {path}: {err}") from err
    finally:
        plt.close(fig)
    return path
