"""Fixtures shared across test modules."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest
from scripted_tuning import scripted_window

from lightning_loadguard.tuning.session import TuningSession


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner measures :func:`scripted_tuning.scripted_window` instead of the run: every run probes alike."""
    monkeypatch.setattr(TuningSession, "_measured", scripted_window)


@pytest.fixture(autouse=True)
def _reap_loader_workers() -> Iterator[None]:
    """Stop the DataLoader workers a test leaves behind. An iterator whose worker raised (a test of the user's
    errors passing through) keeps its workers until it is collected, and torch's shutdown then waits up to 5 s
    for each to join: that wait would fall on whichever test collects it."""
    yield
    left = [p for p in multiprocessing.active_children() if p.daemon]  # torch starts its workers as daemons
    for worker in left:
        worker.terminate()
    for worker in left:
        worker.join(timeout=5)
