"""Fixtures shared across test modules."""

from __future__ import annotations

import pytest
from scripted_tuning import scripted_window

from lightning_loadguard.tuning.session import TuningSession


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner measures :func:`scripted_tuning.scripted_window` instead of the run: every run probes alike."""
    monkeypatch.setattr(TuningSession, "_measured", scripted_window)
