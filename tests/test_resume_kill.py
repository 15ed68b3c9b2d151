"""Exact resume across real crashes: processes killed with SIGKILL, resumed from the checkpoint they named.

One driver process (``resume_chain.py``) runs every scenario: the uninterrupted run and each segment of the
interrupted one are forked processes, so a scenario costs fits, not interpreter start-ups. Every comparison
is sample by sample (per rank under DDP) against the uninterrupted run over all its epochs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from programs import run_program

from lightning_loadguard.position import PositionMismatchError

CHAIN = Path(__file__).with_name("resume_chain.py")
# 20 samples, batch 4: 5 batches an epoch; global step 5 is epoch 0's last batch, 10 epoch 1's.
BASE = {"n": 20, "batch_size": 4, "epochs": 3, "seed": 5}


def _step(at: int) -> dict[str, Any]:
    return {"kill": {"kind": "step", "at": at}}


AFTER_FIT_CHECKPOINTS = {"save": "after_fit", "every_step_checkpoint": True, "epoch_end_checkpoint": True}

SCENARIOS: list[dict[str, Any]] = [
    # Case 1: a crash on an epoch's last batch, then further crashes in the resumed process.
    {"name": "last_batch_then_mid_epoch", "case": BASE, "segments": [_step(5), _step(8), {}]},
    {
        "name": "three_crashes",
        "case": dict(BASE, epochs=4),
        "segments": [_step(5), _step(10), _step(12), {}],
    },
    {
        "name": "last_batch_then_epoch_end",
        "case": dict(BASE, epochs=4),
        "segments": [_step(5), {"kill": {"kind": "epoch_end", "at": 1}}, {}],
    },
    {
        "name": "model_checkpoint_every_5_then_8",
        "case": BASE,
        "segments": [{"kill": {"kind": "mcp", "at": 5}}, {"kill": {"kind": "mcp", "at": 8}}, {}],
    },
    # 24 samples, batch 3 on 2 ranks: 4 batches an epoch per rank; step 4 is epoch 0's last batch.
    {
        "name": "ddp_last_batch_then_mid_epoch",
        "case": {"n": 24, "batch_size": 3, "epochs": 3, "seed": 5, "devices": 2},
        "segments": [_step(4), _step(6), {}],
    },
    # Case 2: train longer with a larger max_steps after a fit that ended mid-epoch (step 7 = epoch 1, batch 2).
    {
        "name": "max_steps_from_save_checkpoint_after_fit",
        "case": dict(BASE, epochs=30),
        "reference": {"max_steps": 13},
        "segments": [{"max_steps": 7, "save": "after_fit"}, {"max_steps": 13}],
    },
    {
        "name": "max_steps_from_epoch_end_checkpoint",
        "case": dict(BASE, epochs=30),
        "reference": {"max_steps": 13},
        "segments": [{"max_steps": 7, "save": "epoch_end"}, {"max_steps": 13}],
    },
    {
        "name": "max_steps_extension_then_crash",
        "case": dict(BASE, epochs=30),
        "reference": {"max_steps": 18},
        "segments": [{"max_steps": 7, "save": "after_fit"}, {"max_steps": 18, **_step(9)}, {"max_steps": 18}],
    },
    # Issue 28: a DataModule hierarchy whose override returns super().train_dataloader(), killed mid-epoch 1 and
    # mid-epoch 2 (each position was applied twice: samples silently skipped).
    {
        "name": "hierarchy_override_calling_super",
        "case": dict(BASE, shape="override_super"),
        "segments": [_step(7), _step(12), {}],
    },
    # Issue 28: max_steps ends the fit inside epoch 1 (batch 6 of 14), with max_epochs=-1, Lightning's step and
    # epoch-end checkpoints, then trainer.save_checkpoint() after fit and a fit with a larger max_steps from it.
    {
        "name": "after_fit_with_lightning_checkpoints_hierarchy",
        "case": {"n": 27, "batch_size": 2, "epochs": -1, "seed": 5, "shape": "override_super"},
        "reference": {"max_steps": 36},
        "segments": [dict(AFTER_FIT_CHECKPOINTS, max_steps=20), dict(AFTER_FIT_CHECKPOINTS, max_steps=36, save=None)],
    },
    {
        "name": "after_fit_with_lightning_checkpoints",
        "case": {"n": 27, "batch_size": 2, "epochs": -1, "seed": 5},
        "reference": {"max_steps": 36},
        "segments": [dict(AFTER_FIT_CHECKPOINTS, max_steps=20), dict(AFTER_FIT_CHECKPOINTS, max_steps=36, save=None)],
    },
    # A fit that max_epochs ended, saved after fit, continued with max_steps (Lightning restarts the epoch loop
    # from the finished epoch's batch counters: refused before, as the trainer's batch index was past the end).
    {
        "name": "after_fit_at_max_epochs_then_max_steps",
        "case": dict(BASE, epochs=-1),
        "reference": {"max_steps": 13},
        "segments": [{"max_epochs": 1, "max_steps": -1, "save": "after_fit"}, {"max_steps": 13}],
    },
    # The same with Lightning's step and epoch-end checkpoints written in both fits (docs/resume.md's row on a
    # larger max_steps from an epoch's end).
    {
        "name": "after_fit_at_max_epochs_with_lightning_checkpoints_then_max_steps",
        "case": dict(BASE, epochs=-1),
        "reference": {"max_steps": 13},
        "segments": [
            dict(AFTER_FIT_CHECKPOINTS, max_epochs=1, max_steps=-1),
            dict(AFTER_FIT_CHECKPOINTS, max_steps=13, save=None),
        ],
    },
    # Case 3: samplers drawing from numpy.
    {"name": "numpy_global_sampler", "case": dict(BASE, sampler="numpy_global"), "segments": [_step(7), {}]},
    {
        "name": "numpy_own_generator_sampler",
        "case": dict(BASE, sampler="numpy_own"),
        "segments": [_step(5), _step(12), {}],
    },
    # Case 4: two loaders in a dict (20 and 10 samples, batch 4: the second one's pass ends at steps 3 and 6).
    {
        "name": "several_loaders",
        "case": dict(BASE, sampler="dict"),
        "segments": [_step(3), _step(5), _step(8), {}],
    },
    {
        "name": "several_loaders_workers",
        "case": dict(BASE, sampler="list", workers=1),
        "segments": [_step(4), _step(12), {}],
    },
    # Two loaders in a dict on 2 ranks (24 and 12 samples, batch 3: 4 steps an epoch, the second loader's pass
    # of 2 batches per rank cycled twice); killed inside the second loader's second pass, then on its boundary.
    {
        "name": "ddp_several_loaders",
        "case": {"n": 24, "batch_size": 3, "epochs": 2, "seed": 5, "devices": 2, "sampler": "dict"},
        "segments": [_step(3), _step(6), {}],
    },
    # Case 5: a loader with its own state (torchdata's StatefulDataLoader), with and without workers.
    {
        # Step 5 is epoch 0's last batch: torchdata's own state would resume into an empty epoch 1.
        "name": "stateful_dataloader",
        "case": dict(BASE, sampler="stateful_loader", seed_everything=3),
        "segments": [_step(5), _step(8), {}],
    },
    {
        "name": "stateful_dataloader_workers",
        "case": dict(BASE, sampler="stateful_loader", seed_everything=3, workers=2),
        "segments": [_step(8), {}],
    },
    # Case 7: what docs/resume.md says is refused at fit start on several ranks, fitted on 2 ranks: the reference
    # fit stops before its first step (no segment follows).
    {
        "name": "ddp_custom_batch_sampler_refused",
        "case": {"n": 24, "batch_size": 3, "epochs": 1, "seed": 5, "devices": 2, "sampler": "batch_sampler"},
        "segments": [],
    },
    {
        "name": "ddp_stateful_iterable_refused",
        "case": {"n": 24, "batch_size": 3, "epochs": 1, "devices": 2, "sampler": "stateful_iterable"},
        "segments": [],
    },
    # Case 6: a plain mid-epoch resume, exact before too, but Lightning warned that it was unreliable.
    {"name": "mid_epoch", "case": BASE, "segments": [_step(7), {}]},
    # Case 6, the control: a loader the mixin cannot rebuild keeps Lightning's warning (and is not exact).
    {
        "name": "subclass_not_guaranteed",
        "case": dict(BASE, sampler="subclass", allow_inexact=True),
        "segments": [_step(7), {}],
    },
]
SLOW = {
    "three_crashes",
    "last_batch_then_epoch_end",
    "model_checkpoint_every_5_then_8",
    "ddp_last_batch_then_mid_epoch",
    "max_steps_extension_then_crash",
    "numpy_global_sampler",
    "stateful_dataloader_workers",
    "several_loaders_workers",
    "ddp_custom_batch_sampler_refused",  # 2-rank fits: ~4 s each on 2 cores
    "ddp_stateful_iterable_refused",
}
REFUSED = {
    "ddp_custom_batch_sampler_refused": r"ValueError: a custom batch sampler \(Alternating\) cannot be sharded over "
    r"world_size=2 ranks exactly",
    "ddp_stateful_iterable_refused": r"ValueError: a stateful IterableDataset cannot be resumed exactly with "
    r"world_size > 1",
}
"""Scenarios whose fit the mixin refuses at its start, with the error's words."""
EXACT = [
    pytest.param(s["name"], marks=[pytest.mark.slow] if s["name"] in SLOW else [])
    for s in SCENARIOS
    if s["name"] != "subclass_not_guaranteed" and s["name"] not in REFUSED
]


def _run_chains(tmp: Path, names: set[str]) -> dict[str, Any]:
    scenarios = tmp / "scenarios.json"
    scenarios.write_text(json.dumps([s for s in SCENARIOS if s["name"] in names]))
    out = tmp / "results.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = run_program([CHAIN, scenarios, out], timeout=600, env=env, cwd=CHAIN.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: dict[str, Any] = json.loads(out.read_text())
    results["_stderr"] = proc.stderr
    return results


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The default scenarios, run by one driver process."""
    return _run_chains(tmp_path_factory.mktemp("chains"), {s["name"] for s in SCENARIOS} - SLOW)


@pytest.fixture(scope="module")
def slow_chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_chains(tmp_path_factory.mktemp("slow_chains"), SLOW)


@pytest.mark.parametrize("name", EXACT)
def test_killed_and_resumed_run_sees_the_uninterrupted_samples(name: str, request: pytest.FixtureRequest) -> None:
    chains = request.getfixturevalue("slow_chains" if name in SLOW else "chains")
    scenario = next(s for s in SCENARIOS if s["name"] == name)
    result = chains[name]
    segments = scenario["segments"]
    expected = ["exit 0"] + ["SIGKILL" if "kill" in s else "exit 0" for s in segments]
    assert result["ended"] == expected, chains["_stderr"][-3000:]
    for rank, full in result["reference"].items():
        assert result["resumed"][rank] == full, f"rank {rank}"
        assert len(full) > 0
    # Every resumed segment ran without Lightning's "dataloader is not resumable" warning.
    assert result["warned"] == [[] for _ in segments]


@pytest.mark.slow
def test_ddp_ranks_shard_every_epoch(slow_chains: dict[str, Any]) -> None:
    ref = slow_chains["ddp_last_batch_then_mid_epoch"]["reference"]
    for epoch in range(3):
        union = sorted(i for r in ("0", "1") for i in ref[r][epoch * 12 : (epoch + 1) * 12])
        assert union == list(range(24))


def test_ddp_several_loaders_shard_each_loader(chains: dict[str, Any]) -> None:
    ref = chains["ddp_several_loaders"]["reference"]
    for epoch in range(2):
        seen = [i for r in ("0", "1") for i in ref[r][epoch * 24 : (epoch + 1) * 24]]
        assert sorted(i for i in seen if i < 1000) == list(range(24)), "each rank its own shard of loader a"
        second = [i - 1000 for i in seen if i >= 1000]
        assert sorted(second) == sorted(list(range(12)) * 2), "loader b cycled twice, each pass sharded"


def test_several_loaders_on_another_world_size_are_refused(chains: dict[str, Any]) -> None:
    # A checkpoint of the 2-rank run (3 steps into epoch 0) resumed on one process: each loader's pass
    # would need re-sharding, which the mixin does for a single loader only.
    from resume_harness import run

    case = dict(next(s for s in SCENARIOS if s["name"] == "ddp_several_loaders")["case"], devices=1)
    with pytest.raises(PositionMismatchError, match=r"several loaders were positioned with world_size=\[2\], this"):
        run(case, ckpt_in=chains["ddp_several_loaders"]["checkpoints"][0])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_fit_on_two_ranks_is_refused_at_its_start(name: str, slow_chains: dict[str, Any]) -> None:
    # docs/resume.md: a custom batch sampler, or a stateful IterableDataset, on more than one rank is refused at
    # fit start: a real 2-rank fit (ddp_fork) ends with the error before any rank trained a batch.
    import re

    result = slow_chains[name]
    assert result["ended"] == ["exit 1"]
    assert result["reference"] == {"0": [], "1": []}
    assert re.search(REFUSED[name], slow_chains["_stderr"]), slow_chains["_stderr"][-3000:]


def test_the_comparison_catches_an_inexact_loader(chains: dict[str, Any]) -> None:
    # A DataLoader subclass (its __iter__ a generator), resumed mid-epoch with allow_inexact_resume: training
    # runs, Lightning still warns, and the same comparison finds the samples that differ.
    result = chains["subclass_not_guaranteed"]
    assert result["ended"] == ["exit 0", "SIGKILL", "exit 0"]
    assert result["resumed"]["0"] != result["reference"]["0"]
    assert result["warned"][1], "Lightning's warning must reach the resumed run when nothing guarantees the order"


def test_the_resume_tables_slow_notes_are_the_tests_marks() -> None:
    # docs/resume.md: "Tests marked (slow) run with pytest -m slow; the others run in the default pytest". Every
    # test or scenario a row names carries "(slow)" exactly where its mark (or this file's SLOW set) makes it slow.
    import importlib
    import re

    def param_is_slow(function: Any, name: str) -> bool:
        """Whether the case ``name`` (its id or first value) of ``function``'s parametrization is slow."""
        marks = getattr(function, "pytestmark", [])
        cases = [c for m in marks if m.name == "parametrize" for c in m.args[1] if name in (c.id, c.values[0])]
        assert cases, f"{function.__name__} has no case {name}"
        return slow_mark(function) or any(m.name == "slow" for m in cases[0].marks)

    def slow_mark(obj: Any) -> bool:
        """Marked slow itself, or every case of one of its parametrizations is."""
        marks = getattr(obj, "pytestmark", [])
        marks = marks if isinstance(marks, list) else [marks]  # a module's may be one mark
        for mark in marks:
            if mark.name == "slow":
                return True
            if mark.name == "parametrize":
                cases = list(mark.args[1])
                if cases and all(any(m.name == "slow" for m in getattr(c, "marks", ())) for c in cases):
                    return True
        return False

    text = (Path(__file__).resolve().parents[1] / "docs" / "resume.md").read_text()
    table = text[text.index("## What is supported") :]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    assert len(rows) > 20
    scenarios = {s["name"] for s in SCENARIOS}
    checked = 0
    for row in rows:
        cell = row.strip().strip("|").split("|")[-1]
        module: Any = None
        function: Any = None
        for token, noted in re.findall(r"`([^`]+)`( \(slow\))?", cell):
            path, _, name = token.partition("::")
            if path.endswith(".py"):
                module = importlib.import_module(path.removesuffix(".py"))
            else:
                name = token
            if not name or "*" in name:
                continue
            assert module is not None, row
            if module.__name__ == __name__ and name in scenarios:
                slow = name in SLOW
            elif hasattr(module, name):
                function = getattr(module, name)
                slow = slow_mark(function) or slow_mark(module)
            else:  # a case of the test named before it
                assert function is not None, row
                slow = param_is_slow(function, name) or slow_mark(module)
            assert slow == bool(noted), f"{token}: marked slow {slow}, noted (slow) {bool(noted)}"
            checked += 1
    assert checked > 30, checked
