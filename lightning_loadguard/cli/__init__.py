"""The ``loadguard`` command: a self-contained demo, and reports on a run's TensorBoard logs.

The work is done elsewhere (:mod:`._demo` trains the demo, :mod:`._runs` reads event files and writes the
report, :mod:`._plot` draws, :mod:`lightning_loadguard.report` renders every table); this module parses the
arguments and turns the problems a user can fix into exit status 1.

Example:
    .. code-block:: console

        $ loadguard demo                         # a data-bound run: figures and diagnosis
        $ loadguard demo --auto-tune             # the same run, fixed while it trains
        $ loadguard report ./loadguard_demo_logs --plot rates.png
        $ loadguard report ./loadguard_demo_logs --what-if ranks_per_node=8,step_speedup=2
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_loadguard._moved import moved_names

DEMO_LOGDIR = "loadguard_demo_logs"
"""Where ``loadguard demo`` writes its TensorBoard logs by default (here, so that ``--help`` needs no Lightning)."""


class CommandError(Exception):
    """A problem the user can fix (a missing directory, no logs, a missing package): exit status 1."""


def _demo_command(args: argparse.Namespace) -> None:
    from lightning_loadguard.cli._demo import run_demo

    run_demo(
        Path(args.logdir),
        auto_tune=args.auto_tune,
        epochs=args.epochs,
        batches=args.batches,
        progress=not args.no_progress,
    )


def _report_command(args: argparse.Namespace) -> None:
    from lightning_loadguard.cli._runs import format_report, read_runs, select_run

    runs = read_runs(args.logdir)
    run = select_run(runs, args.logdir, args.run)
    print(format_report(run, [r for r in runs if r is not run]))
    if args.what_if:
        from lightning_loadguard.cli._runs import format_forecasts

        print("\n" + format_forecasts(run, args.what_if))
    if args.plot:
        from lightning_loadguard.cli._plot import plot_run

        print(f"\nPlot written to {plot_run(run, args.plot)}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _what_if(text: str) -> object:
    from lightning_loadguard.model.forecast import parse_what_if

    try:
        return parse_what_if(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The ``loadguard`` argument parser (``loadguard --help``)."""
    from lightning_loadguard import __version__

    parser = argparse.ArgumentParser(
        prog="loadguard",
        description="Find out what limits your Lightning training: data wait, producer capacity, host budgets.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    demo = commands.add_parser(
        "demo",
        help="train a slow synthetic pipeline and show LoadGuard's figures and diagnosis",
        description=(
            "Train a tiny model on a synthetic pipeline (CPU, under a minute) whose loader makes each batch in "
            "the training process (num_workers=0, 30 ms a batch) before each 40 ms step, so loading and the step "
            "run in series; LoadGuard is attached. Shows the figures, the diagnosis and, with --auto-tune, the "
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
    demo.set_defaults(handler=_demo_command)

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
    report.add_argument(
        "--what-if",
        metavar="NAME=VALUE,...",
        type=_what_if,
        action="append",
        help=(
            "also forecast a change from the run's logged facts (repeat for several), e.g. "
            "ranks_per_node=8,step_speedup=2; names: ranks_per_node, usable_cores, other_cores, available_ram_bytes, "
            "shm_free_bytes, step_speedup, batch_scale, num_workers, prefetch_factor, pin_memory (docs/forecast.md)"
        ),
    )
    report.set_defaults(handler=_report_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``loadguard`` command; returns the exit status (0 done, 1 failed, 2 bad arguments, the message on
    stderr). ``--help`` and ``--version`` print and raise ``SystemExit(0)``, as argparse does.

    Example:
        >>> main(["report", "loadguard_demo_logs"])  # doctest: +SKIP
        0
        >>> main(["frobnicate"])  # doctest: +SKIP
        2
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        # argparse exits 2 on bad arguments, after printing why: a caller in Python gets the status instead. Its
        # --help and --version exit 0 once printed, which stays an exit.
        if exit_.code in (0, None):
            raise
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        args.handler(args)
    except CommandError as err:
        print(f"loadguard {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``loadguard report DIR | head``): not an error, and nothing left to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# Importable from here in 0.1.0.
__getattr__ = moved_names(
    __name__,
    {
        "read_runs": (f"{__name__}._runs:read_runs", "it is internal; use the loadguard command"),
        "format_report": (f"{__name__}._runs:format_report", "it is internal; use the loadguard command"),
        "plot_run": (f"{__name__}._plot:plot_run", "it is internal; use the loadguard command"),
    },
)
