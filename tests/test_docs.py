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


def test_architecture_names_what_exists() -> None:
    """docs/architecture.md stays true: the modules it names exist, and so do the seam functions it lists."""
    from lightning_loadguard import _lightning

    text = _text("architecture.md")
    package = DOCS.parent / "lightning_loadguard"
    paths = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py|[a-z_]+/)`", text))
    assert {"meters/monitor.py", "_lightning.py", "position/switch.py"} <= paths
    for path in paths:
        where = DOCS.parent / path if path.startswith(("docs/", "tests/", "lightning_loadguard/")) else package / path
        assert where.exists(), f"architecture.md names {path}, which does not exist"
    seam_rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", text, flags=re.M)
    names = [n for row in seam_rows for n in re.findall(r"`(\w+)`", row)]
    assert "FetchTimingProfiler" in names and "train_iterator" in names
    for name in names:
        assert hasattr(_lightning, name), f"architecture.md lists _lightning.{name}, which does not exist"
