"""A pytest plugin that appends ``LoadGuard(print_summary=False)`` to the callbacks of every Trainer.

Used by ``scripts/lightning_suite.sh`` to run Lightning's own tests with LoadGuard in every Trainer::

    PYTHONPATH=scripts:$PYTHONPATH pytest -p loadguard_inject tests_pytorch/loops

Environment:
    LOADGUARD_INJECT: ``0`` loads the plugin but leaves every Trainer as it is (the baseline run).
    LOADGUARD_AUTO_TUNE: ``1`` makes the injected LoadGuard ``LoadGuard(print_summary=False, auto_tune=True)``.
    LOADGUARD_FAILURES_FILE: a path; the node id of every failed test (and of every module that failed to
        collect) is appended to it, one a line.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest


def _with_loadguard(callbacks: Any, auto_tune: bool) -> list[Any]:
    from lightning_loadguard import LoadGuard

    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    return [*callbacks, LoadGuard(print_summary=False, auto_tune=auto_tune)]


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("LOADGUARD_INJECT", "1") == "0":
        return
    import lightning.pytorch as pl

    auto_tune = os.environ.get("LOADGUARD_AUTO_TUNE", "0") == "1"
    original = pl.Trainer.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = _with_loadguard(kwargs.get("callbacks"), auto_tune)
        original(self, *args, **kwargs)

    pl.Trainer.__init__ = __init__  # type: ignore[method-assign]
    config.addinivalue_line("markers", "loadguard_injected: LoadGuard is appended to every Trainer")


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("LOADGUARD_INJECT", "1") == "0":
        return "loadguard_inject: off (Trainers unchanged)"
    tune = os.environ.get("LOADGUARD_AUTO_TUNE", "0") == "1"
    return f"loadguard_inject: LoadGuard(print_summary=False, auto_tune={tune}) appended to every Trainer"


def _record_failure(nodeid: str) -> None:
    path = os.environ.get("LOADGUARD_FAILURES_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(nodeid + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _record_failure(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record_failure(report.nodeid)
