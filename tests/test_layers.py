"""The layers: the core imports no Lightning and no adapter, and no module imports itself back in a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lightning_loadguard"
CORE = ("meters", "model", "position", "tuning")


def test_the_core_imports_with_lightning_blocked() -> None:
    script = textwrap.dedent(
        """
        import sys
        for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
            sys.modules[name] = None  # importing any of them now raises ImportError
        import importlib, pkgutil
        import lightning_loadguard.meters, lightning_loadguard.model
        import lightning_loadguard.position, lightning_loadguard.tuning
        for package in ("meters", "model", "position", "tuning"):
            root = importlib.import_module(f"lightning_loadguard.{package}")
            for info in pkgutil.iter_modules(root.__path__):
                importlib.import_module(f"lightning_loadguard.{package}.{info.name}")
        adapters = [m for m in sys.modules if m in (
            "lightning_loadguard.callback", "lightning_loadguard._lightning", "lightning_loadguard._tuner_adapter",
            "lightning_loadguard.datamodule")]
        assert not adapters, adapters
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _imports(path: Path, modules: frozenset[str] = frozenset()) -> set[str]:
    """The ``lightning_loadguard`` modules a module imports at any level (``TYPE_CHECKING`` blocks excluded).

    ``from package import name`` imports ``package.name`` where that is a module (one of ``modules``), else
    ``package``.
    """
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_loadguard"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("lightning_loadguard"))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_modules() -> None:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    names = frozenset(modules)
    graph = {name: {m for m in _imports(path, names) if m in modules and m != name} for name, path in modules.items()}
    # A package's __init__ importing its own modules is how packages work, not a cycle.
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name.count(".") and m.startswith(name + "."))}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(name: str, path: list[str]) -> bool:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                cycle.extend([*path[path.index(nxt) :], nxt] if nxt in path else [name, nxt])
                return True
            if nxt not in state and visit(nxt, [*path, nxt]):
                return True
        state[name] = 2
        return False

    for name in sorted(graph):
        if name not in state and visit(name, [name]):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_core_never_imports_an_adapter() -> None:
    adapters = {"lightning_loadguard.callback", "lightning_loadguard._lightning", "lightning_loadguard._tuner_adapter"}
    names = frozenset(_module_name(p) for p in PACKAGE.rglob("*.py"))
    for package in CORE:
        for path in (PACKAGE / package).rglob("*.py"):
            assert not (_imports(path, names) & adapters), path
            source = path.read_text()
            assert "import lightning" not in source and "pytorch_lightning" not in source, path


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _defined_at_top_level(path: Path) -> set[str]:
    """The names a module binds at its top level: assignments, classes and functions."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


# docs/architecture.md: each fact has one home.
HOMES = {
    "LoaderSettings": "meters/settings.py",
    "SWITCHABLE": "meters/settings.py",
    "DEFAULT_PREFETCH": "meters/settings.py",
    "RAM_BUDGET_SHARE": "model/budget.py",
    "SHM_BUDGET_SHARE": "model/budget.py",
    "VERDICTS": "model/findings.py",
    "METRICS": "dashboard.py",
}


def test_each_fact_is_defined_in_its_one_home() -> None:
    defined_in: dict[str, list[str]] = {name: [] for name in HOMES}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _defined_at_top_level(path) & set(HOMES):
            defined_in[name].append(_relative(path))
    assert defined_in == {name: [home] for name, home in HOMES.items()}


def _calls(path: Path, name: str) -> list[ast.Call]:
    """Calls of ``name`` in a module, as ``name(...)`` or ``something.name(...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if called == name:
                found.append(node)
    return found


def _iter_not_over_a_dict(path: Path) -> list[str]:
    """The builtin ``iter()`` calls of a module whose argument is not a dict's ``values()``, ``keys()`` or
    ``items()``, as ``line: call``."""
    listed = []
    for call in _calls(path, "iter"):
        if not isinstance(call.func, ast.Name):
            continue
        argument = call.args[0] if call.args else None
        over_a_dict = (
            isinstance(argument, ast.Call)
            and isinstance(argument.func, ast.Attribute)
            and argument.func.attr in ("values", "keys", "items")
        )
        if not over_a_dict:
            listed.append(f"{call.lineno}: {ast.unparse(call)}")
    return listed


def test_only_restart_iterator_makes_a_loader_iterator_mid_fit() -> None:
    # docs/architecture.md: restart_iterator (position/switch.py) is the one way to restart a loader. torch's
    # iterator constructor (_torch.new_iterator) is called there only; outside position/ (the order's samplers
    # and taps), iter() is called only on a dict's values, keys or items, never on a loader.
    callers = sorted(_relative(p) for p in PACKAGE.rglob("*.py") if _calls(p, "new_iterator"))
    assert callers == ["position/switch.py"]
    outside_position = [p for p in sorted(PACKAGE.rglob("*.py")) if not _relative(p).startswith("position/")]
    listed = {_relative(p): calls for p in outside_position if (calls := _iter_not_over_a_dict(p))}
    assert listed == {}


def test_the_restart_rule_finds_what_it_is_meant_to_find(tmp_path: Path) -> None:
    # The rule above is not vacuous: it sees the datamodule's iter() over a dict's values (and lets it pass), and
    # lists a module calling iter() on a loader or torch's constructor.
    assert [ast.unparse(c) for c in _calls(PACKAGE / "datamodule.py", "iter")] == ["iter(loaded.loaders.values())"]
    assert _iter_not_over_a_dict(PACKAGE / "datamodule.py") == []
    module = tmp_path / "restarts.py"
    module.write_text("it = iter(trainer.train_dataloader)\nother = _torch.new_iterator(loader)\n")
    assert _iter_not_over_a_dict(module) == ["1: iter(trainer.train_dataloader)"]
    assert len(_calls(module, "new_iterator")) == 1
