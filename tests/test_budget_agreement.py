"""The diagnosis and the tuner budget a host's cores the way docs/concepts.md states it: fed the same window,
both give that count."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model.diagnosis import diagnose
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.reach import tuner_budget


@settings(max_examples=150, deadline=None)
@given(
    cpu_count=st.integers(1, 256),
    processes=st.integers(1, 16),
    busy_s=st.floats(0.2, 2.0),
    cpu_fraction=st.floats(0.0, 1.0),
    queued_fraction=st.floats(0.0, 0.9),
    loop_cores=st.one_of(st.none(), st.floats(0.0, 8.0)),
    workers=st.integers(0, 8),
)
def test_the_diagnosis_and_the_tuner_give_the_documented_worker_budget(
    cpu_count: int,
    processes: int,
    busy_s: float,
    cpu_fraction: float,
    queued_fraction: float,
    loop_cores: float | None,
    workers: int,
) -> None:
    # A producer far slower than the 10 ms step: the diagnosis names a deficit and states its worker budget.
    queued = busy_s * queued_fraction
    window = WindowSnapshot(
        wait_s=(busy_s,) * 20,
        step_s=(0.01,) * 20,
        settings=LoaderSettings(num_workers=workers),
        host=HostFacts(cpu_count=cpu_count, processes_on_host=processes),
        production_s=(busy_s,) * 20,
        production_cpu_s=((busy_s - queued) * cpu_fraction,) * 20,
        production_queued_s=(queued,) * 20,
        cpu=None if loop_cores is None else CpuUse(1.0, cpu_count, cpu_count, loop_cores=loop_cores, worker_cores=0.0),
    )
    # docs/concepts.md, "Host-wide budgets": each process keeps one core for its loop; the rest of its share of
    # the host's cores goes to workers, each needing only its CPU share of a core, never less than a tenth.
    # (The window's loop cores do not enter: they are judged apart, as a hypothesis the tuner measures.)
    share = max(0.1, cpu_fraction)
    documented = math.floor(max(0.0, cpu_count / processes - 1) / share + 1e-9)
    finding = diagnose(window).finding("producer_deficit")
    assert finding is not None
    assert finding.evidence["worker_budget"] == documented
    assert tuner_budget(window, TuneOptions()).max_workers == documented
