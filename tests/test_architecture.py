"""docs/architecture.md: "The adapters are siblings: the callback creates the tuner's adapter and forwards hooks to
it; neither reads the other's state", read from the two modules' syntax trees.

The rule, each side:

- ``_tuner_adapter.py`` has no way to the callback: it imports nothing of ``callback.py``, never names ``LoadGuard``
  or ``trainer.callbacks`` (where a callback finds another), and reads none of the callback's state (a name
  ``LoadGuard`` assigns on itself or in its class body) except the same name on ``self`` in a class of its own
  that assigns it. What the callback hands it on purpose (the monitor, a way to say something) arrives as
  constructor arguments.
- ``callback.py`` creates ``TunerAdapter`` once, as ``self._tuner``, and uses it only as
  ``self._tuner.<member>`` for a public method or property defined on ``TunerAdapter`` (its hooks, ``decision``,
  ``every_step``), besides asking whether it ``is None``; it never hands ``self._tuner`` on, and every public
  method of the adapter is a hook the callback forwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_loadguard"
CALLBACK = PACKAGE / "callback.py"
ADAPTER = PACKAGE / "_tuner_adapter.py"


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name]
    assert len(found) == 1, f"{name}: {len(found)} classes"
    return found[0]


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _assigned_on_self(cls: ast.ClassDef) -> set[str]:
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value)
    }


def _state(cls: ast.ClassDef) -> set[str]:
    """What a class keeps: names it assigns on ``self`` and names assigned in its body (not its methods)."""
    body: set[str] = set()
    for node in cls.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        body.update(t.id for t in targets if isinstance(t, ast.Name))
    return _assigned_on_self(cls) | body


def _public_members(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """The public methods and the public properties defined on a class."""
    methods, properties = set(), set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
            (properties if is_property else methods).add(node.name)
    return methods, properties


def _callback_state(callback_source: str) -> set[str]:
    return _state(_class(ast.parse(callback_source), "LoadGuard"))


def adapter_reaches(adapter_source: str, callback_state: set[str]) -> list[str]:
    """Where the adapter's source could read the callback or its state, as ``line: what``."""
    tree = ast.parse(adapter_source)
    own: set[int] = set()  # self.<name> in a class that assigns self.<name> itself
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        mine = _assigned_on_self(cls)
        own.update(
            id(n) for n in ast.walk(cls) if isinstance(n, ast.Attribute) and _is_self(n.value) and n.attr in mine
        )
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            (node.module or "").endswith(".callback")
            or (node.module == "lightning_loadguard" and any(a.name == "callback" for a in node.names))
        ):
            hits.append(f"{node.lineno}: imports {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.endswith(".callback") for a in node.names):
            hits.append(f"{node.lineno}: imports {[a.name for a in node.names]}")
        elif isinstance(node, ast.Name) and node.id == "LoadGuard":
            hits.append(f"{node.lineno}: names LoadGuard")
        elif isinstance(node, ast.Attribute) and node.attr == "callbacks":
            hits.append(f"{node.lineno}: reads .callbacks")
        elif isinstance(node, ast.Attribute) and node.attr in callback_state and id(node) not in own:
            hits.append(f"{node.lineno}: reads .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in callback_state and str(node.value).startswith("_"):
            hits.append(f"{node.lineno}: spells {node.value!r}")
    return hits


def callback_reaches(callback_source: str, adapter_source: str) -> list[str]:
    """Where the callback's source uses its tuner adapter otherwise than through a public method or property."""
    methods, properties = _public_members(_class(ast.parse(adapter_source), "TunerAdapter"))
    tree = ast.parse(callback_source)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "_tuner":
            hits.append(f"{node.lineno}: spells '_tuner'")
        if not (isinstance(node, ast.Attribute) and node.attr == "_tuner" and _is_self(node.value)):
            continue
        parent = parents[id(node)]
        if isinstance(parent, ast.Attribute):
            if parent.attr not in methods | properties:
                hits.append(f"{node.lineno}: reads self._tuner.{parent.attr}")
        elif isinstance(parent, ast.Compare):
            if not (
                all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops)
                and all(isinstance(c, ast.Constant) and c.value is None for c in parent.comparators)
            ):
                hits.append(f"{node.lineno}: compares self._tuner")
        elif not isinstance(node.ctx, ast.Store):
            hits.append(f"{node.lineno}: hands self._tuner on")
    return hits


def test_the_tuner_adapter_never_reaches_the_callback_or_its_state() -> None:
    state = _callback_state(CALLBACK.read_text())
    assert {"_monitor", "_said", "metrics", "snapshot", "_tuner"} <= state  # the rule reads the real class
    assert adapter_reaches(ADAPTER.read_text(), state) == []


def test_the_callback_creates_the_tuner_adapter_and_forwards_every_hook_to_it() -> None:
    tree = ast.parse(CALLBACK.read_text())
    made = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TunerAdapter"
    ]
    assert len(made) == 1
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    assignment = parents[id(made[0])]
    assert isinstance(assignment, ast.Assign) and [ast.unparse(t) for t in assignment.targets] == ["self._tuner"]
    methods, _ = _public_members(_class(ast.parse(ADAPTER.read_text()), "TunerAdapter"))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self._tuner"
    }
    assert methods and methods <= used, f"adapter methods the callback never forwards to: {methods - used}"


def test_the_callback_uses_the_tuner_adapter_only_through_its_public_methods() -> None:
    assert callback_reaches(CALLBACK.read_text(), ADAPTER.read_text()) == []


def _by_line(hits: list[str]) -> list[str]:
    return sorted(hits, key=lambda hit: (int(hit.split(":")[0]), hit))


def test_the_sibling_rules_find_what_they_are_meant_to_find() -> None:
    state = {"_monitor", "_said", "metrics", "_trainer"}
    adapter = (
        "from lightning_loadguard.callback import LoadGuard\n"
        "import lightning_loadguard.callback\n"
        "class Port:\n"
        "    def __init__(self, trainer):\n"
        "        self._trainer = trainer\n"  # its own attribute of the same name: allowed
        "    def guard(self):\n"
        "        return [c for c in self._trainer.callbacks if isinstance(c, LoadGuard)][0]\n"
        "    def peek(self, guard):\n"
        "        return guard._monitor, guard.metrics, getattr(guard, '_said'), guard._trainer\n"
    )
    assert _by_line(adapter_reaches(adapter, state)) == [
        "1: imports lightning_loadguard.callback",
        "2: imports ['lightning_loadguard.callback']",
        "7: names LoadGuard",
        "7: reads .callbacks",
        "9: reads ._monitor",
        "9: reads ._trainer",
        "9: reads .metrics",
        "9: spells '_said'",
    ]
    adapter_class = (
        "class TunerAdapter:\n"
        "    def __init__(self):\n"
        "        self.session = None\n"
        "    @property\n"
        "    def decision(self):\n"
        "        return None\n"
        "    def on_train_batch_end(self, trainer):\n"
        "        pass\n"
    )
    callback = (
        "class LoadGuard:\n"
        "    def __init__(self):\n"
        "        self._tuner = TunerAdapter()\n"
        "    def hook(self, trainer):\n"
        "        if self._tuner is not None:\n"
        "            self._tuner.on_train_batch_end(trainer)\n"
        "        decision = self._tuner.decision\n"
        "        reach = self._tuner.session.reach()\n"
        "        keep(self._tuner)\n"
        "        tuner = self._tuner\n"
        "        return self._tuner == decision, getattr(self, '_tuner')\n"
    )
    assert _by_line(callback_reaches(callback, adapter_class)) == [
        "8: reads self._tuner.session",
        "9: hands self._tuner on",
        "10: hands self._tuner on",
        "11: compares self._tuner",
        "11: spells '_tuner'",
    ]
