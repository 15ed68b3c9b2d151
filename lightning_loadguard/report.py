"""Readable text output, in one place: tables, markdown for a terminal, number formats, the end-of-fit summary."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.model.findings import Diagnosis

METRIC_PREFIX = "loadguard/"
"""What every metric LoadGuard logs starts with."""


def render_table(
    title: str,
    rows: Sequence[Sequence[str]],
    headers: Sequence[str] | None = None,
    *,
    numbers: bool = False,
    wrap: bool = False,
) -> str:
    """A table drawn with ``rich`` where it is installed, as aligned plain text otherwise.

    Args:
        title: shown above the table.
        rows: the cells, as text; the first column names the row.
        headers: the column names, or ``None`` for a table without a header row.
        numbers: the cells after the first are figures: right-aligned.
        wrap: the cells are sentences: rich draws a line between rows; plain text writes each row as a
            block (its first cell, then ``header: cell`` lines) instead of an aligned line. Needs ``headers``.

    Example:
        >>> print(render_table("t", [("a", "1"), ("bb", "22")], headers=("name", "value")))  # doctest: +SKIP
    """
    if wrap and headers is None:
        raise ValueError("render_table(wrap=True) needs headers: each cell is written after its column's name")
    columns = max((len(row) for row in rows), default=len(headers or ()))
    try:
        from rich.console import Console  # noqa: F401  (absent or blocked: plain text)
        from rich.table import Table
    except ImportError:
        if wrap:
            assert headers is not None
            return _plain_blocks(title, rows, headers)
        return _plain_grid(title, rows, headers, columns, numbers)
    table = Table(title=title, show_header=headers is not None, title_justify="left", show_lines=wrap)
    for i in range(columns):
        right = numbers and not wrap and i > 0
        table.add_column(
            headers[i] if headers else "", style="bold" if i == 0 else None, justify="right" if right else "left"
        )
    for row in rows:
        table.add_row(*row)
    return _rich_text(table)


def _rich_text(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=120, record=True, file=io.StringIO())
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")


def _plain_grid(
    title: str, rows: Sequence[Sequence[str]], headers: Sequence[str] | None, columns: int, numbers: bool
) -> str:
    body = [list(headers)] if headers else []
    body += [list(row) + [""] * (columns - len(row)) for row in rows]
    widths = [max(len(line[i]) for line in body) for i in range(columns)]
    lines = [title, "-" * len(title)]
    for n, line in enumerate(body):
        pairs = enumerate(zip(line, widths, strict=True))
        cells = [c.rjust(w) if numbers and i > 0 else c.ljust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
        if headers and n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _plain_blocks(title: str, rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    lines = [title, "-" * len(title)]
    for row in rows:
        lines.append(row[0])
        for name, cell in zip(headers[1:], row[1:], strict=True):
            if cell:
                lines += textwrap.wrap(f"{name}: {cell}", 100, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def plain_text(markdown: str) -> str:
    """The diagnosis's markdown (written for TensorBoard's text tab) as terminal text.

    Example:
        >>> plain_text("**Data path: bursty**")
        'Data path: bursty'
    """
    return markdown.replace("**", "")


def render_markdown(markdown: str) -> str:
    """Markdown (a diagnosis, a decision) for a terminal: through ``rich`` where installed, else :func:`plain_text`.

    Example:
        >>> "bursty" in render_markdown("**Data path: bursty**")
        True
    """
    try:
        from rich.console import Console  # noqa: F401  (absent or blocked: plain text)
        from rich.markdown import Markdown
    except ImportError:
        return plain_text(markdown)
    return _rich_text(Markdown(markdown))


def format_number(value: float | None) -> str:
    """A figure with as many digits as its size deserves; ``-`` when missing.

    Example:
        >>> format_number(1234.5), format_number(12.34), format_number(0.01234), format_number(None)
        ('1,234', '12.3', '0.0123', '-')
    """
    if value is None or math.isnan(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def metric_unit(name: str) -> str:
    """The unit of a ``loadguard/*`` metric, from the naming convention the metric names follow.

    Example:
        >>> metric_unit("loadguard/data_wait_ms"), metric_unit("loadguard/throughput")
        ('ms', 'batches/s')
        >>> metric_unit("loadguard/host_workers"), metric_unit("loadguard/inflight_host_mb_max")
        ('workers', 'MB')
    """
    short = name.removeprefix(METRIC_PREFIX).removesuffix("_max")  # the most of any host: the figure's unit
    if short.endswith("_ms"):
        return "ms"
    if short.endswith("_mb"):
        return "MB"
    if short.endswith("_fraction") or short == "gpu_util":
        return "0..1"
    if short.endswith("_rate") or short == "throughput":
        return "batches/s"
    if short in ("num_workers", "prefetch_factor"):
        return "setting"
    if short.startswith("host_"):
        return {"host_prefetch_capacity": "batches", "host_prefetch_queued": "batches"}.get(short, short[5:])
    if short == "hosts":
        return "hosts"
    if short == "retunes":
        return "re-tunes"
    return "rank" if short == "worst_rank" else ""


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """A :class:`~lightning_loadguard.Diagnosis` as a table: each finding with its cost and its fix.

    Example:
        >>> from lightning_loadguard import Diagnosis, Finding
        >>> d = Diagnosis("compute_bound", (Finding("compute_bound", 0.0, fix="Nothing.", summary="Fine."),))
        >>> "compute_bound" in format_diagnosis(d)
        True
    """
    rows = [[f.verdict, f"{f.severity:.0%}", f.summary, f.fix] for f in diagnosis.findings]
    if diagnosis.draining is not None:
        rows.append(["draining", "", diagnosis.draining.summary(), ""])
    headers = ["finding", "cost", "what the figures show", "fix"]
    return render_table(f"Diagnosis: {diagnosis.verdict}", rows, headers, wrap=True)


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
    stated: dict[str, float] | None = None,
) -> str:
    """The end-of-fit summary: the latest window, the whole run, and what could not be measured.

    ``stated``: the figures the diagnosis printed beside it states (``consumer_rate``, ``producer_rate``,
    ``wait_fraction``), shown in their place, so that one quantity reads one figure under one name.
    """
    loop_s = total_wait_s + total_step_s
    workers = max(1, settings.num_workers)
    run_capacity = workers * total_batches_made / total_busy_s if total_busy_s > 0 else None
    stated = stated or {}
    said = "as diagnosed" if stated else "last window"

    def get(name: str) -> float | None:
        value = stated.get(name.removeprefix("loadguard/"))
        return value if value is not None else metrics.get(name)

    alone = get("loadguard/consumer_rate")
    wait = get("loadguard/wait_fraction")
    producer = get("loadguard/producer_rate")
    rows = [
        (
            "loader",
            f"num_workers={settings.num_workers}, prefetch_factor={settings.prefetch_factor}, "
            f"persistent_workers={settings.persistent_workers}, pin_memory={settings.pin_memory}",
        ),
        ("steps measured", str(total_steps)),
        (
            "the loop waits for data (whole run)",
            f"{total_wait_s / loop_s:.1%} of its time" if loop_s > 0 else "not measured",
        ),
        (f"the loop waits for data ({said})", f"{wait:.1%} of its time" if wait is not None else "not measured"),
        ("data wait per step", _fmt(get("loadguard/data_wait_ms"), " ms")),
        ("throughput", _fmt(get("loadguard/throughput"), " steps/s")),
        (
            f"the step alone, never waiting ({said})",
            f"{alone:.3g} steps/s ({1e3 / alone:.3g} ms a step)" if alone else "not measured",
        ),
        (f"the loader can make ({said})", f"{producer:.3g} batches/s" if producer is not None else "not measured"),
        ("the loader can make (whole run)", _fmt(run_capacity, " batches/s")),
        ("batch ready at fetch", _fmt(get("loadguard/ready_fraction"), "", 2)),
        ("epoch start-up", _fmt(max(epoch_start_s) * 1e3 if epoch_start_s else None, " ms (slowest)")),
        ("host: training processes", _fmt(get("loadguard/host_processes"), "", 0)),
        ("host: loader workers", _fmt(get("loadguard/host_workers"), "", 0)),
        ("host: usable cores", _fmt(get("loadguard/host_cores"), "", 0)),
        ("host: prefetch capacity", _fmt(get("loadguard/host_prefetch_capacity"), " batches", 0)),
        ("host: batches queued", _fmt(get("loadguard/host_prefetch_queued"), " batches (mean)")),
        ("host: in-flight batch memory", _fmt(get("loadguard/inflight_host_mb"), " MB", 2)),
        ("host: queued batch memory", _fmt(get("loadguard/queued_host_mb"), " MB", 2)),
        ("host: RAM available", _fmt(get("loadguard/host_available_mb"), " MB", 0)),
        ("host: /dev/shm free", _fmt(get("loadguard/shm_free_mb"), " MB", 0)),
    ]
    if "loadguard/hosts" in metrics:
        rows += [
            ("hosts", _fmt(get("loadguard/hosts"), "", 0)),
            ("busiest host: in-flight batch memory", _fmt(get("loadguard/inflight_host_mb_max"), " MB", 2)),
        ]
    if "loadguard/device_step_ms" in metrics:
        rows += [
            ("device step (device clock)", _fmt(get("loadguard/device_step_ms"), " ms")),
            ("device idle between steps", _fmt(get("loadguard/device_idle_fraction"), "", 3)),
            ("  of it waiting for data", _fmt(get("loadguard/device_data_idle_fraction"), "", 3)),
            ("  of it waiting for the loop", _fmt(get("loadguard/device_loop_idle_fraction"), "", 3)),
            ("copy to the device (device clock)", _fmt(get("loadguard/device_transfer_ms"), " ms")),
        ]
    if "loadguard/gpu_util" in metrics:
        rows.append(("accelerator utilization", _fmt(metrics["loadguard/gpu_util"], "", 2)))
    if "loadguard/worst_rank" in metrics:
        rows.append(("worst rank (highest wait)", str(int(metrics["loadguard/worst_rank"]))))
    text = render_table("LoadGuard summary", rows)
    if notes:
        text += "\n" + "\n".join(f"note: {note}" for note in notes)
    return text
