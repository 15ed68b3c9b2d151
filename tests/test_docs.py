"""The docs name every metric, verdict and argument that exists, and their links resolve."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from lightning_loadguard import LoadGuard
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.model import VERDICTS
from lightning_loadguard.model.forecast import WhatIf
from lightning_loadguard.tuning.options import TuneOptions

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _text(name: str) -> str:
    return (DOCS / name).read_text()


def test_every_metric_is_in_the_reference() -> None:
    rows = re.findall(r"^\| `(loadguard/\w+)` \| ([^|]+) \|", _text("metrics.md"), flags=re.M)
    assert [name for name, _ in rows] == list(METRICS)
    assert all(unit.strip() for _, unit in rows)


def test_the_dashboards_documented_charts_are_the_layouts() -> None:
    section = _text("metrics.md").split("## The TensorBoard dashboard", 1)[1].split("\n## ", 1)[0]
    documented = {
        title: re.findall(r"`(loadguard/\w+)`", metrics)
        for title, metrics in re.findall(r"^- \*\*(.+?)\*\*: (.+)$", section, flags=re.M)
    }
    layout = {title: chart[1] for title, chart in custom_scalars_layout()["LoadGuard"].items()}
    assert len(documented) >= 10
    assert set(documented) - set(layout) == set() and set(layout) - set(documented) == set()
    assert documented == layout


def test_the_constants_the_verdicts_page_names_live_in_the_modules_it_names() -> None:
    """docs/verdicts.md: "module constants of `module` (`NAME`, ...)": each name is an attribute of that module."""
    import importlib

    text = " ".join(_text("verdicts.md").split())
    groups = re.findall(r"`(lightning_loadguard\.[\w.]+)` \(((?:`[A-Z_]+`(?:, )?)+)\)", text)
    assert len(groups) >= 3, groups
    for module, names in groups:
        found = importlib.import_module(module)
        for name in re.findall(r"`([A-Z_]+)`", names):
            assert hasattr(found, name), f"{module} has no {name}"


def test_every_verdict_is_in_the_catalogue() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", _text("verdicts.md"), flags=re.M)
    assert rows == list(VERDICTS)


def test_the_readme_names_every_verdict() -> None:
    section = README.read_text().split("## What it tells you", 1)[1].split("\n## ", 1)[0]
    listed = section.split("evidence and fix:", 1)[1].split(";", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", listed)) == sorted(VERDICTS)


def test_every_argument_is_in_the_api_reference() -> None:
    api = _text("api.md")
    for name in inspect.signature(LoadGuard).parameters:
        assert f"| `{name}` |" in api, name
    for field in dataclasses.fields(TuneOptions):
        assert f"`{field.name}`" in api, field.name


@pytest.mark.parametrize("page", [*sorted(f"docs/{p.name}" for p in DOCS.glob("*.md")), "README.md"])
def test_links_resolve(page: str) -> None:
    path = DOCS.parent / page
    for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", path.read_text()):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{page} links to {target}, which does not exist"


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
    # ... and names all there is: every module of the package (a folder named whole covers its modules), every
    # public function and class of the Lightning seam.
    for module in sorted(package.rglob("*.py")):
        relative = module.relative_to(package).as_posix()
        folder = relative.split("/")[0] + "/"
        if module.name != "__init__.py" and relative not in paths and folder not in paths:
            raise AssertionError(f"architecture.md does not name {relative}")
    seam = ast.parse(inspect.getsource(_lightning))
    defined = {n.name for n in seam.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name[0] != "_"}
    assert defined <= set(names), f"architecture.md's seam table lacks {sorted(defined - set(names))}"


README = DOCS.parent / "README.md"


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def test_the_readmes_metric_table_names_logged_metrics_and_points_to_the_rest() -> None:
    """README's table holds metric names that exist; every other metric is named by a pattern README gives."""
    from fnmatch import fnmatch

    text = README.read_text()
    rows = re.findall(r"^\| (`loadguard/[^|]+) \|", text, flags=re.M)
    in_table = {name for row in rows for name in re.findall(r"`(loadguard/\w+)`", row)}
    assert in_table and in_table <= set(METRICS), in_table - set(METRICS)
    patterns = set(re.findall(r"`(loadguard/[\w*]*\*[\w*]*)`", text))
    missing = [name for name in METRICS if name not in in_table and not any(fnmatch(name, p) for p in patterns)]
    assert missing == [], f"README neither lists nor names by a pattern: {missing}"


def test_the_readmes_first_snippet_prints_a_documented_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's opening snippet as written, its default Trainer cut to a few steps of a tiny module."""
    import lightning.pytorch

    from lightning_loadguard.synthetic import TimedDataset, TimedModule

    snippet = _code_blocks(README.read_text())[0]
    assert "print(trainer.callbacks[0].diagnosis.verdict)" in snippet

    class ShortTrainer(lightning.pytorch.Trainer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(max_steps=24, accelerator="cpu", devices=1, **kwargs)

    monkeypatch.setattr(lightning.pytorch, "Trainer", ShortTrainer)
    monkeypatch.chdir(tmp_path)
    datamodule = lightning.pytorch.LightningDataModule.from_datasets(TimedDataset(96), batch_size=4)
    exec(snippet, {"model": TimedModule(), "datamodule": datamodule})
    printed = capsys.readouterr().out.strip().splitlines()[-1].strip()
    assert printed in VERDICTS, printed


def _extras_with(package: str) -> set[str]:
    import tomllib

    extras = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name for name, needs in extras.items() if any(re.match(rf"{package}\b", need) for need in needs)}


# A documented command's option -> the package it needs beyond the base install.
_NEEDS = {"--plot": "matplotlib"}


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_a_documented_command_names_the_extra_it_needs(page: Path) -> None:
    """A page whose commands use an option that needs an extra installs that extra or names it."""
    text = page.read_text()
    commands = "\n".join(_code_blocks(text))
    for option, package in _NEEDS.items():
        if re.search(rf"\bloadguard\b.*{option}\b", commands):
            extras = _extras_with(package)
            installs = re.findall(r"pip install [^\n]*\[([\w,]+)\]", text)
            named = any(re.search(rf"`{extra}` extra|\[{extra}\]", text) for extra in extras)
            assert named or any(set(group.split(",")) & extras for group in installs), (
                f"{page.name} runs `{option}`, which needs {package}: install or name one of the extras {extras}"
            )


def test_docs_name_no_internal_type_as_a_public_one() -> None:
    """The types that left the root namespace are internal: of the user's pages only api.md names them, to say
    so (architecture.md describes the internals)."""
    import lightning_loadguard

    for page in [README, *DOCS.glob("*.md")]:
        if page.name in ("api.md", "architecture.md"):
            continue
        for name in lightning_loadguard._MOVED:
            assert f"`{name}`" not in page.read_text(), f"{page.name} names the internal type {name}"


def test_examples_use_only_the_stable_api() -> None:
    """The examples import from the package's root only, and only the names it exports."""
    import lightning_loadguard

    for example in sorted((DOCS.parent / "examples").glob("*.py")):
        text = example.read_text()
        assert not re.search(r"(?:from|import) lightning_loadguard\.", text), f"{example.name} imports a submodule"
        for names in re.findall(r"from lightning_loadguard import ([^\n]+)", text):
            for name in re.split(r",\s*", names.strip("() ")):
                assert name in lightning_loadguard.__all__, f"{example.name} imports {name}, not a public name"


# Rows of docs/resume.md's table that name no test yet: each is a promise without a check, listed so that a new
# one fails here and a test written for one of them must strike it out.
_RESUME_ROWS_WITHOUT_A_TEST: set[str] = set()


def test_every_row_of_the_resume_table_names_tests_that_exist() -> None:
    """Each row's test cell names test files in tests/ and, in them, test functions (or name patterns) or the
    scenario names a file's parametrized test runs; CI runs every test file (`.ci/run`)."""
    from fnmatch import fnmatch

    tests = DOCS.parent / "tests"
    text = _text("resume.md")
    table = text[text.index("## What is supported") :]
    lines = [line.strip().strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
    rows = [(cells[0].strip(), cells[-1].strip()) for cells in lines[2:]]  # past the header and its rule
    assert len(rows) > 20
    untested = set()
    for setup, cell in rows:
        names = re.findall(r"`([^`]+)`", cell)
        if not names:
            untested.add(setup)
            continue
        source = ""
        for name in names:
            path, _, function = name.partition("::")
            if path.endswith(".py") or path == ".ci/run":
                where = DOCS.parent / path if path.startswith(".ci") else tests / path
                if not where.exists() and (DOCS.parent / "lightning_loadguard" / path).exists():
                    where = DOCS.parent / "lightning_loadguard" / path
                assert where.exists(), f"resume.md names {path}, which does not exist ({setup})"
                source = where.read_text()
            else:
                function = name
            if function:
                defined = re.findall(r"^def (test_\w+)|\"name\": \"(\w+)\"", source, flags=re.M)
                known = {a or b for a, b in defined}
                assert any(fnmatch(k, function) for k in known), f"resume.md names {name}, not found ({setup})"
    assert untested == _RESUME_ROWS_WITHOUT_A_TEST


def test_the_loaders_table_names_tests_that_exist() -> None:
    """Each cell of docs/loaders.md names the test that checks it: every name there is a test of that file."""
    tests = (DOCS.parent / "tests" / "test_loader_libraries.py").read_text()
    rows = [line for line in _text("loaders.md").splitlines() if line.startswith("| ") and "`" in line]
    names = {n.split("[")[0] for row in rows for n in re.findall(r"`([a-z_]+(?:\[[a-z_]+\])?)`", row)}
    named = {n for n in names if f"def test_{n}(" in tests}
    assert len(named) >= 10, named
    words = {"with_format", "split_by_worker", "state_dict", "num_workers", "decode_jpeg", "keep_random_draws"}
    unknown = {n for n in names - named if "_" in n and n not in words}
    assert not unknown, f"docs/loaders.md names tests that do not exist: {sorted(unknown)}"


# Test files of Lightning's own suite, named where docs/index.md reports running it with LoadGuard injected.
_LIGHTNING_TEST_FILES = {"test_dataloaders.py", "test_hooks.py", "test_restore.py"}


def test_every_test_the_docs_name_exists() -> None:
    """README and every page name the tests behind their claims (`tests/test_x.py::test_name`, or `::test_name` after
    a file in the same line): each such file is in tests/ and defines each such test, so a renamed or removed test
    fails here instead of leaving a claim unbacked. CI runs every test file, slow ones included (`.ci/run`)."""
    tests = DOCS.parent / "tests"
    pages = [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]
    named = 0
    missing = []
    for page in pages:
        for line in page.read_text().splitlines():
            current: Path | None = None
            for token in re.findall(r"`([^`]+)`", line):
                found = re.fullmatch(r"(?:tests/)?(test_\w+\.py)(?:::(\w+))?(?:\[[^\]]*\])?", token)
                if found:
                    file, function = found.groups()
                    if file in _LIGHTNING_TEST_FILES:
                        current = None
                        continue
                    current = tests / file
                    if not current.exists():
                        missing.append(f"{page.name}: {token}")
                        current = None
                        continue
                elif (also := re.fullmatch(r"::(\w+)(?:\[[^\]]*\])?", token)) and current is not None:
                    function = also.group(1)
                else:
                    continue
                named += 1
                if function and not re.search(rf"^(?:async )?def {function}\(", current.read_text(), flags=re.M):
                    missing.append(f"{page.name}: {token} (in {current.name})")
    assert named > 50, named
    assert not missing, missing


# Standard-library names newer than Python 3.10 (3.11 and 3.12), by module.
_NEWER_THAN_3_10 = {
    "tomllib": None,
    "typing": {
        "Self",
        "LiteralString",
        "Never",
        "assert_never",
        "assert_type",
        "reveal_type",
        "Required",
        "NotRequired",
        "TypeVarTuple",
        "Unpack",
        "dataclass_transform",
        "override",
        "TypeAliasType",
    },
    "enum": {"StrEnum", "verify", "EnumCheck", "ReprEnum", "member", "nonmember", "global_enum"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "operator": {"call"},
    "itertools": {"batched"},
    "math": {"cbrt", "exp2"},
}


def test_the_package_is_python_3_10_as_pyproject_and_readme_say() -> None:
    """No syntax and no standard-library name newer than 3.10 (the grammar as 3.10 parses it; names by a list of
    what 3.11 and 3.12 added to the modules a package like this one uses)."""
    root = DOCS.parent
    assert re.search(r'^requires-python = ">=3\.10"$', (root / "pyproject.toml").read_text(), flags=re.M)
    assert "Python 3.10+" in (root / "README.md").read_text()
    newer = []
    for path in sorted((root / "lightning_loadguard").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                newer += [f"{path.name}: {a.name}" for a in node.names if _NEWER_THAN_3_10.get(a.name, ...) is None]
            elif isinstance(node, ast.ImportFrom) and node.module in _NEWER_THAN_3_10:
                names = _NEWER_THAN_3_10[node.module]
                found = [a.name for a in node.names if names is None or a.name in names]
                newer += [f"{path.name}: {node.module}.{name}" for name in found]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names = _NEWER_THAN_3_10.get(node.value.id)
                if names is not None and node.attr in names:
                    newer.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert newer == []


def test_the_readme_names_every_benchmark_script() -> None:
    root = DOCS.parent
    section = (root / "README.md").read_text().split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    scripts = [p.name for p in sorted((root / "benchmarks").glob("*.py")) if "__main__" in p.read_text()]
    assert len(scripts) >= 10
    assert [name for name in scripts if f"`{name}`" not in section] == []


def test_ci_installs_the_loader_libraries_at_the_releases_the_loaders_page_names() -> None:
    """docs/loaders.md: "Checked with datasets X, webdataset Y, litdata Z": CI pins each, so a newer release does not
    skip the tests of one release's behaviour (test_hf_stream_claims.py) or change what the page states."""
    text = " ".join(_text("loaders.md").split())
    named = dict(re.findall(r"(datasets|webdataset|litdata) (\d+\.\d+\.\d+)", text.split("Checked with", 1)[1][:120]))
    assert set(named) == {"datasets", "webdataset", "litdata"}, named
    ci = (DOCS.parent / ".ci" / "run").read_text()
    for library, release in named.items():
        assert f"{library}=={release}" in ci, f".ci/run does not install {library}=={release}"


def test_the_readmes_account_of_ci_is_what_ci_runs() -> None:
    """README's Development section and quick start, against `.ci/run` and pyproject.toml as written."""
    root = DOCS.parent
    ci = (root / ".ci" / "run").read_text()
    readme = (root / "README.md").read_text()
    pyproject = (root / "pyproject.toml").read_text()
    # "each step and the whole run under a time limit": the script re-runs itself under `timeout`, and every
    # pip, pytest and ruff command goes through `limited` or `tests`.
    assert re.search(r'exec timeout -k \d+ "\$\{LOADGUARD_CI_LIMIT_S:-\d+\}" bash "\$0"', ci)
    commands = [line.strip() for line in ci.splitlines() if re.match(r"\s*(pip|pytest|ruff|python -m pip) ", line)]
    assert not commands, f"commands without a time limit: {commands}"
    # The quick start's two commands as written (torch pinned beside them where CI installs the project).
    assert "limited 300 loadguard demo" in ci and 'pip install -q "torch==2.13.0" -e .\n' in ci
    assert 'pip install "torch==2.13.0" -e . && loadguard demo' in readme
    assert 'pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]" && pytest' in readme
    # Every slow test; the timing tests beside spinners; ruff, both ways; the torchvision environment.
    assert re.search(r"\ntests \d+ -q -m slow\n", ci) and "-m slow" in readme
    assert "python scripts/cpu_load.py pytest" in ci and "scripts/cpu_load.py" in readme
    assert "ruff check ." in ci and "ruff format --check ." in ci
    assert '"torch==2.14.1" "torchvision==0.29.1"' in ci and "`torchvision==0.29.1`" in readme
    # The oldest and newest Lightning are the ends of the declared range, and README names the oldest.
    lower, upper = re.search(r'"lightning>=([\d.]+),<([\d.]+)"', pyproject).groups()  # type: ignore[union-attr]
    oldest, newest = re.search(r"OLDEST=([\d.]+)\nNEWEST=([\d.]+)", ci).groups()  # type: ignore[union-attr]
    assert oldest == f"{lower}.0" and f"Lightning {oldest}" in readme and f"lightning>={lower},<{upper}" in readme
    assert tuple(map(int, newest.split(".")[:2])) < tuple(map(int, upper.split(".")[:2])), (newest, upper)
    # pyproject's default run leaves the slow tests out, as README says ("pytest -m slow runs the long tail").
    assert "addopts = \"-m 'not slow'" in pyproject


def test_ci_names_test_files_and_ids_that_exist() -> None:
    """A test CI names that was renamed would select nothing (CI fails then too); here it fails first."""
    root = DOCS.parent
    ci = (root / ".ci" / "run").read_text()
    for path, name in re.findall(r"(tests/test_\w+\.py)(?:::(\w+))?", ci):
        assert (root / path).exists(), path
        if name:
            assert f"def {name}(" in (root / path).read_text(), f"{path}::{name}"


def test_the_tuning_page_opens_with_the_procedure_in_five_sentences_and_stays_short() -> None:
    text = (DOCS / "tuning.md").read_text()
    assert len(text.splitlines()) < 200
    procedure = text.split("## How it decides", 1)[1].split("\n\n")[2]
    assert re.findall(r"^(\d)\. \*\*", procedure, re.M) == ["1", "2", "3", "4", "5"]


def test_the_tuning_pages_options_table_has_every_option_at_its_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", _text("tuning.md"), re.MULTILINE)
    documented = {name: default.strip() for name, default in rows if name in TuneOptions.__dataclass_fields__}
    defaults = {f.name: repr(f.default) for f in dataclasses.fields(TuneOptions)}
    assert documented == defaults


def test_loadguard_forecast_takes_the_what_ifs_arguments() -> None:
    # api.md: "`LoadGuard.forecast` takes the same arguments" as WhatIf, with the same defaults.
    parameters = inspect.signature(LoadGuard.forecast).parameters
    taken = {name: p.default for name, p in parameters.items() if name != "self"}
    assert taken == {f.name: f.default for f in dataclasses.fields(WhatIf)}


def _case_ids(test: Any) -> list[str]:
    """The ids pytest gives a test's parametrized cases (a string value is its own id)."""
    ids = []
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            for case in mark.args[1]:
                values = getattr(case, "values", (case,))
                ids.append(getattr(case, "id", None) or "-".join(map(str, values)))
    return ids


def test_the_loaders_ddp_tests_are_slow_and_ci_runs_torchvisions_in_its_own_environment() -> None:
    """docs/loaders.md, Under DDP: "These tests are marked slow (two processes each); CI runs them in its slow step,
    torchvision's in its own environment"."""
    # The module pytest collects: its functions carry the marks pytest selects by.
    import test_loader_libraries as suite

    section = _text("loaders.md").split("## Under DDP", 1)[1].split("\n## ", 1)[0]
    assert "These tests are marked slow" in section
    lines = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    fit = "under_ddp_each_rank_trains_on_its_own_part_and_loadguard_gathers_both"
    named: dict[str, set[str]] = {}
    for line in lines[1:]:  # past the header
        library, *cells = (cell.strip() for cell in line.split("|")[1:-1])
        names = {n for cell in cells for n in re.findall(r"`(\w+)`", cell) if hasattr(suite, f"test_{n}")}
        named[library] = names | ({fit} if cells[0] == "same test" else set())
    tests = set().union(*named.values())
    assert fit in tests and len(tests) >= 3, named
    unmarked = [n for n in tests if "slow" not in {m.name for m in getattr(suite, f"test_{n}").pytestmark}]
    assert not unmarked, f"not marked slow: {unmarked}"
    # Each test of torchvision's row has a torchvision case: the one `-k torchvision` selects.
    assert named["torchvision"]
    for name in named["torchvision"]:
        assert any("torchvision" in case for case in _case_ids(getattr(suite, f"test_{name}"))), name
    # CI's steps by the environment active: every slow test in the first, where torchvision is not installed (its
    # cases skip), and the torchvision cases, slow ones included, in the second.
    steps: dict[str, list[str]] = {}
    environment = None
    for line in (DOCS.parent / ".ci" / "run").read_text().splitlines():
        if activated := re.fullmatch(r"\. (\.venv-[\w-]+)/bin/activate", line.strip()):
            environment = activated.group(1)
        elif line.strip() == "deactivate":
            environment = None
        elif environment is not None:
            steps.setdefault(environment, []).append(line.strip())
    first, vision = steps[".venv-ci"], steps[".venv-vision"]
    assert any(re.fullmatch(r"tests \d+ -q -m slow", line) for line in first), first
    assert not [line for line in first if "pip install" in line and ("torchvision" in line or "vision]" in line)]
    step = r'tests \d+ -q -m "slow or not slow" -k torchvision (\S+ )*tests/test_loader_libraries\.py( \S+)*'
    assert any(re.fullmatch(step, line) for line in vision), vision
    assert any("pip install" in line and '"torchvision==' in line for line in vision), vision


CORE_TESTS = (
    "test_diagnosis.py",
    "test_position.py",
    "test_tuning_core.py",
    "test_tuning_watch.py",
    "test_forecast.py",
)


@pytest.mark.parametrize("name", CORE_TESTS)
def test_the_core_is_unit_tested_without_a_trainer(name: str) -> None:
    # README and architecture.md: the core is plain Python, unit-tested without a Trainer.
    tree = ast.parse((Path(__file__).parent / name).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m.split(".")[0] for m in imported} & {"lightning", "pytorch_lightning", "pipelines"}, imported
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & {"Trainer", "quiet_trainer", "fit", "pl"}, used & {"Trainer", "quiet_trainer", "fit", "pl"}
