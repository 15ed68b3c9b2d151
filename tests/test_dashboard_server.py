"""The dashboard in a real TensorBoard: the server serves LoadGuard's custom-scalars layout and metrics."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tensorboard_run import fit_with_tensorboard

from lightning_loadguard.dashboard import custom_scalars_layout

_START_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tensorboard_command() -> list[str]:
    script = Path(sys.executable).with_name("tensorboard")
    if script.exists():
        return [str(script)]
    found = shutil.which("tensorboard")
    if found is None:
        pytest.fail("the tensorboard program is not installed beside this Python")
    return [found]


def _get(base: str, path: str, **query: str) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[int, dict[str, float]]]]:
    logdir = tmp_path_factory.mktemp("tb")
    _, logged = fit_with_tensorboard(logdir)
    port = _free_port()
    log = (logdir / "server.log").open("w")
    command = [
        *_tensorboard_command(),
        "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
        "--load_fast", "false", "--reload_interval", "1",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"tensorboard exited with {process.returncode}: {(logdir / 'server.log').read_text()}")
            try:
                # Served once the first load of the log directory has found the run's scalars.
                if any(
                    t.startswith("loadguard/")
                    for tags in _get(base, "/data/plugin/scalars/tags").values()
                    for t in tags
                ):
                    break
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tensorboard served no loadguard scalars within {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.3)
        yield base, logged
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def test_custom_scalars_layout_is_served(server: tuple[str, dict[int, dict[str, float]]]) -> None:
    base, _ = server
    layout = _get(base, "/data/plugin/custom_scalars/layout")
    served = {
        chart["title"]: chart["multiline"]["tag"]
        for category in layout["category"]
        if category["title"] == "LoadGuard"
        for chart in category["chart"]
    }
    expected = {title: chart[1] for title, chart in custom_scalars_layout()["LoadGuard"].items()}
    # TensorBoard serves each series as a regular expression matching its tag.
    assert {title: [t.replace("\\", "") for t in tags] for title, tags in served.items()} == expected


def test_loadguard_scalars_are_served_with_the_logged_values(server: tuple[str, dict[int, dict[str, float]]]) -> None:
    base, logged = server
    tags = _get(base, "/data/plugin/scalars/tags")
    assert list(tags) == ["run/version_0"]
    served = {t for t in tags["run/version_0"] if t.startswith("loadguard/")}
    last = logged[max(logged)]
    assert served == {t for t in last if t.startswith("loadguard/")}
    for tag in ("loadguard/wait_fraction", "loadguard/producer_rate", "loadguard/consumer_rate"):
        points = _get(base, "/data/plugin/scalars/scalars", run="run/version_0", tag=tag)
        # Each point is [wall_time, step, value].
        assert [p[1] for p in points] == sorted(logged)
        assert [p[2] for p in points] == pytest.approx([logged[s][tag] for s in sorted(logged)], rel=1e-5)


def test_diagnosis_text_is_served(server: tuple[str, dict[int, dict[str, float]]]) -> None:
    base, _ = server
    tags = _get(base, "/data/plugin/text/tags")
    # SummaryWriter.add_text stores a tag under "<tag>/text_summary".
    assert "loadguard/diagnosis/text_summary" in tags["run/version_0"]
    entries = _get(base, "/data/plugin/text/text", run="run/version_0", tag="loadguard/diagnosis/text_summary")
    # Served as HTML rendered from the markdown.
    assert "<strong>Data path:" in entries[-1]["text"]
