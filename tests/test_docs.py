"""The docs name every metric, verdict and argument that exists, and their links resolve."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from lightning_loadguard import LoadGuard
from lightning_loadguard.dashboard import METRICS
from lightning_loadguard.model import VERDICTS
from lightning_loadguard.tuning.options import TuneOptions

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _text(name: str) -> str:
    return (DOCS / name).read_text()


def test_every_metric_is_in_the_reference() -> None:
    rows = re.findall(r"^\| `(loadguard/\w+)` \| ([^|]+) \|", _text("metrics.md"), flags=re.M)
    assert [name for name, _ in rows] == list(METRICS)
    assert all(unit.strip() for _, unit in rows)


def test_every_verdict_is_in_the_catalogue() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", _text("verdicts.md"), flags=re.M)
    assert rows == list(VERDICTS)


def test_every_argument_is_in_the_api_reference() -> None:
    api = _text("api.md")
    for name in inspect.signature(LoadGuard).parameters:
        assert f"| `{name}` |" in api, name
    for field in dataclasses.fields(TuneOptions):
        assert f"`{field.name}`" in api, field.name


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_links_resolve(page: str) -> None:
    for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", _text(page)):
        if "://" not in target:
            assert (DOCS / target).exists(), f"{page} links to {target}, which does not exist"
