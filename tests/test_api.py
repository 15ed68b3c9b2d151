"""The public API is what docs/api.md documents, each name with an example; the names 0.1.0 exported still import."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
import re
from pathlib import Path

import pytest

import lightning_loadguard

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()


def test_documented_names_are_the_exported_names() -> None:
    documented = re.findall(r"^## `(\w+)`$", API, flags=re.M)
    assert sorted(documented) == sorted(lightning_loadguard.__all__)
    assert len(set(documented)) == len(documented)


def _attribute_docstring(name: str) -> str | None:
    """The string literal right after ``NAME = ...`` at module level, wherever in the package it is assigned."""
    for info in pkgutil.walk_packages(lightning_loadguard.__path__, "lightning_loadguard."):
        spec = importlib.util.find_spec(info.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        body = ast.parse(Path(spec.origin).read_text()).body
        for node, after in itertools.pairwise(body):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            assigned = any(isinstance(t, ast.Name) and t.id == name for t in targets)
            if assigned and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                return str(after.value.value)
    return None


@pytest.mark.parametrize("name", sorted(lightning_loadguard.__all__))
def test_every_public_name_has_a_docstring_with_an_example(name: str) -> None:
    obj = getattr(lightning_loadguard, name)
    doc = inspect.getdoc(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else _attribute_docstring(name)
    assert doc, f"{name} has no docstring"
    assert "Example" in doc, f"{name}'s docstring has no example"


@pytest.mark.parametrize(
    ("module", "name", "home", "says"),
    [
        ("lightning_loadguard", "WindowSnapshot", "lightning_loadguard.meters.window", "is internal"),
        ("lightning_loadguard", "LoaderSettings", "lightning_loadguard.meters.settings", "is internal"),
        ("lightning_loadguard", "HostFacts", "lightning_loadguard.meters.window", "is internal"),
        ("lightning_loadguard.model", "workers_needed", "lightning_loadguard.model.capacity", "import it from"),
        ("lightning_loadguard.model", "simulate_buffer", "lightning_loadguard.model.buffer", "import it from"),
        ("lightning_loadguard.position", "shard", "lightning_loadguard.position.plan", "internal to the package"),
        ("lightning_loadguard.position", "STATE_VERSION", "lightning_loadguard.position.state", "internal"),
        ("lightning_loadguard.position", "resume_iterator", "lightning_loadguard.position", "use restart_iterator("),
    ],
)
def test_names_0_1_0_exported_still_import_with_a_warning(module: str, name: str, home: str, says: str) -> None:
    """docs/api.md: the capacity arithmetic and ``resume_iterator`` name their replacement, the rest say they are
    internal."""
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(module)}\.{name} is deprecated") as caught:
        value = getattr(importlib.import_module(module), name)
    message = str(caught[0].message)
    assert says in message, message
    if says == "import it from":
        assert f"import it from {home}" in message, message
    if name != "resume_iterator":
        assert value is getattr(importlib.import_module(home), name)
    assert name not in importlib.import_module(module).__all__


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = lightning_loadguard.no_such_name  # type: ignore[attr-defined]


_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").glob("*.py"))]


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in _PAGES])
def test_docs_and_examples_import_public_names_from_the_package_root(page: str) -> None:
    text = (ROOT / page).read_text()
    public = set(lightning_loadguard.__all__)
    for module, names in re.findall(r"from (lightning_loadguard[\w.]*) import ([\w, ]+)", text):
        if module == "lightning_loadguard":
            continue
        elsewhere = public & {n.strip() for n in names.split(",")}
        assert not elsewhere, f"{page} imports {sorted(elsewhere)} from {module}; import them from lightning_loadguard"


# docs/api.md: the public names, the `loadguard/*` metric names, the verdict names and the checkpoint formats keep
# their names and meaning across minor releases. What 0.1.0 has, written out here: a rename in the code (and
# the docs with it) fails this test, where the tests that compare the docs with the code would pass.
NAMES_0_1_0 = [
    "Diagnosis",
    "Finding",
    "Forecast",
    "LoadGuard",
    "LoadGuardWarning",
    "LoaderPosition",
    "METRICS",
    "NonReproducibleOrderError",
    "PositionMismatchError",
    "ResumableLoaderMixin",
    "TuneDecision",
    "TuneOptions",
    "VERDICTS",
    "WhatIf",
    "custom_scalars_layout",
]
METRICS_0_1_0 = [
    f"loadguard/{name}"
    for name in [
        "wait_fraction",
        "data_wait_ms",
        "step_ms",
        "throughput",
        "consumer_rate",
        "producer_rate",
        "ready_fraction",
        "epoch_start_ms",
        "host_processes",
        "host_workers",
        "host_prefetch_capacity",
        "host_prefetch_queued",
        "inflight_host_mb",
        "queued_host_mb",
        "inflight_budget_fraction",
        "host_cores",
        "host_available_mb",
        "shm_free_mb",
        "hosts",
        "inflight_host_mb_max",
        "inflight_budget_fraction_max",
        "transfer_ms",
        "device_idle_fraction",
        "device_data_idle_fraction",
        "device_loop_idle_fraction",
        "device_step_ms",
        "device_transfer_ms",
        "gpu_util",
        "worst_rank",
        "num_workers",
        "prefetch_factor",
        "retunes",
    ]
]
VERDICTS_0_1_0 = [
    "memory_risk",
    "producer_deficit",
    "straggler_rank",
    "host_oversubscribed",
    "bursty",
    "transfer_bound",
    "loop_overhead",
    "epoch_start_stall",
    "compute_bound",
]
# LoaderPosition.state_dict() as 0.1.0 writes it into the checkpoint (`loadguard_loader_position`).
POSITION_0_1_0 = {
    "epoch": 2,
    "batches_consumed": 5,
    "samples_consumed": 20,
    "seed": 7,
    "dataset_len": 40,
    "batch_size": 4,
    "drop_last": False,
    "drop_tail": False,
    "world_size": 1,
    "epoch_origin": 0,
    "origin_batches": 0,
    "dataset_state": None,
    "version": 1,
}


def test_the_names_of_0_1_0_are_kept() -> None:
    assert set(NAMES_0_1_0) <= set(lightning_loadguard.__all__)
    assert set(METRICS_0_1_0) <= set(lightning_loadguard.METRICS)
    # The verdicts' order breaks ties between findings: kept too.
    assert [v for v in lightning_loadguard.VERDICTS if v in VERDICTS_0_1_0] == VERDICTS_0_1_0
    assert len(VERDICTS_0_1_0) == 9 and len(METRICS_0_1_0) == 32


def test_a_loader_position_written_by_0_1_0_loads_and_is_written_the_same() -> None:
    from lightning_loadguard import LoaderPosition

    position = LoaderPosition.from_state_dict(dict(POSITION_0_1_0))
    assert (position.epoch, position.batches_consumed, position.seed) == (2, 5, 7)
    assert position.state_dict() == POSITION_0_1_0
