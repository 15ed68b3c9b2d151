"""The diagnosis and the tuner budget a host's cores with one function: fed the same window, they agree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model.diagnosis import diagnose
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.session import tuner_budget


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
def test_the_diagnosis_and_the_tuner_never_disagree_on_the_worker_budget(
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
    finding = diagnose(window).finding("producer_deficit")
    assert finding is not None
    assert finding.evidence["worker_budget"] == tuner_budget(window, TuneOptions()).max_workers
