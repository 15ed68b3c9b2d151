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
