"""Every private name of torch's data loading the package reads or writes is in ``_torch.py``, nowhere else, and
the installed torch has each of them."""

from __future__ import annotations

from pathlib import Path

import torch.utils.data
from test_lightning_seam import _defined_privates, _uses
from torch.utils.data import DataLoader

from lightning_loadguard import _torch

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_loadguard"


def _torch_internals() -> set[str]:
    # Less the names the package defines too (its probed loader class overrides `_get_iterator`): those are
    # left to the tests of what reads them.
    return _defined_privates(Path(torch.utils.data.__file__).parent) - _defined_privates(PACKAGE)


def test_torch_data_internals_are_touched_only_in_the_seam() -> None:
    internals = _torch_internals()
    assert {"_task_info", "_rcvd_idx", "_send_idx", "_next_data", "_dataset_fetcher", "_num_yielded"} <= internals
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("_torch.py", "_lightning.py"):  # Lightning's loaders wrap torch's: its seam reads them
            continue
        hits = _uses(path, internals)
        if hits:
            outside[path.relative_to(PACKAGE).as_posix()] = hits
    assert not outside, f"torch's private names outside _torch.py: {outside}"


def test_the_names_read_exist_in_the_installed_torch() -> None:
    """What ``_torch`` says it reads is there in this torch, on both kinds of iterator."""
    with_workers = iter(DataLoader(list(range(8)), batch_size=2, num_workers=1))
    try:
        assert next(with_workers).tolist() == [0, 1]
        for name in _torch.ITERATOR_ATTRIBUTES:
            assert hasattr(with_workers, name), name
        task_info, received, sent = _torch.fetch_state(with_workers)
        assert isinstance(task_info, dict) and received == 1 and sent >= 2
        assert len(_torch.workers(with_workers)) == 1 and not _torch.is_shut_down(with_workers)
        assert _torch.batches_yielded(with_workers) == 1
        assert _torch.watch_worker_deaths(with_workers, False) and _torch.watch_worker_deaths(with_workers, True)
    finally:
        _torch.shutdown_workers(with_workers)
    assert _torch.is_shut_down(with_workers)
    loader = DataLoader(list(range(8)), batch_size=2)
    in_process = _torch.new_iterator(loader)
    for name in _torch.IN_PROCESS_ATTRIBUTES:
        assert hasattr(in_process, name), name
    assert _torch.in_process_fetcher(in_process) is not None and _torch.workers(in_process) is None
    for method in (_torch.NEXT_DATA, _torch.RESET):
        assert callable(getattr(type(in_process), method)), method
    assert _torch.cached_iterator(loader) is None  # _get_iterator does not cache
    fetchers = _torch.fetcher_classes()
    assert all(callable(getattr(cls, "fetch", None)) for cls in fetchers)
