"""Readable text output: the end-of-fit summary table."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_loadguard.meters.window import LoaderSettings


def render_table(title: str, rows: Sequence[Sequence[str]], headers: Sequence[str] | None = None) -> str:
    """A table drawn with ``rich`` where it is installed, as aligned plain text otherwise.

    Example:
        >>> print(render_table("t", [("a", "1"), ("bb", "22")], headers=("name", "value")))  # doctest: +SKIP
    """
    columns = max((len(row) for row in rows), default=len(headers or ()))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return _plain_table(title, rows, headers, columns)
    table = Table(title=title, show_header=headers is not None, title_justify="left")
    for i in range(columns):
        table.add_column(headers[i] if headers else "", style="bold" if i == 0 else None)
    for row in rows:
        table.add_row(*row)
    console = Console(width=120, record=True, file=_NullFile())
    console.print(table)
    return console.export_text().rstrip()


def _plain_table(title: str, rows: Sequence[Sequence[str]], headers: Sequence[str] | None, columns: int) -> str:
    body = [list(headers)] if headers else []
    body += [list(row) + [""] * (columns - len(row)) for row in rows]
    widths = [max(len(line[i]) for line in body) for i in range(columns)]
    lines = [title, "-" * len(title)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in body]
    return "\n".join(lines)


def plain_text(markdown: str) -> str:
    """The diagnosis's markdown (written for TensorBoard's text tab) as terminal text.

    Example:
        >>> plain_text("**Data path: bursty**")
        'Data path: bursty'
    """
    return markdown.replace("**", "")


class _NullFile:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "not measured"
    return f"{value:.{digits}f}{unit}"


def format_summary(
    metrics: dict[str, float],
    settings: LoaderSettings,
    total_steps: int,
    total_wait_s: float,
    total_step_s: float,
    total_batches_made: int,
    total_busy_s: float,
    epoch_start_s: Sequence[float],
    notes: Sequence[str] = (),
) -> str:
    """The end-of-fit summary: the latest window, the whole run, and what could not be measured."""
    loop_s = total_wait_s + total_step_s
    workers = max(1, settings.num_workers)
    run_capacity = workers * total_batches_made / total_busy_s if total_busy_s > 0 else None
    get = metrics.get
    rows = [
        ("loader", f"num_workers={settings.num_workers}, prefetch_factor={settings.prefetch_factor}, "
         f"persistent_workers={settings.persistent_workers}, pin_memory={settings.pin_memory}"),
        ("steps measured", str(total_steps)),
        ("wait fraction (run)", _fmt(total_wait_s / loop_s if loop_s > 0 else None, "", 3)),
        ("wait fraction (last window)", _fmt(get("loadguard/wait_fraction"), "", 3)),
        ("data wait per step", _fmt(get("loadguard/data_wait_ms"), " ms")),
        ("rest of step", _fmt(get("loadguard/step_ms"), " ms")),
        ("throughput", _fmt(get("loadguard/throughput"), " batches/s")),
        ("consumer rate (never waiting)", _fmt(get("loadguard/consumer_rate"), " batches/s")),
        ("producer capacity", _fmt(get("loadguard/producer_rate"), " batches/s")),
        ("producer capacity (run)", _fmt(run_capacity, " batches/s")),
        ("batch ready at fetch", _fmt(get("loadguard/ready_fraction"), "", 2)),
        ("epoch start-up", _fmt(max(epoch_start_s) * 1e3 if epoch_start_s else None, " ms (slowest)")),
        ("in-flight batch memory on host", _fmt(get("loadguard/inflight_host_mb"), " MB")),
        ("host RAM available", _fmt(get("loadguard/host_available_mb"), " MB", 0)),
        ("/dev/shm free", _fmt(get("loadguard/shm_free_mb"), " MB", 0)),
    ]
    if "loadguard/gpu_util" in metrics:
        rows.append(("accelerator utilization", _fmt(metrics["loadguard/gpu_util"], "", 2)))
    if "loadguard/worst_rank" in metrics:
        rows.append(("worst rank (highest wait)", str(int(metrics["loadguard/worst_rank"]))))
    text = render_table("LoadGuard summary", rows)
    if notes:
        text += "\n" + "\n".join(f"note: {note}" for note in notes)
    return text
