"""The store protocol's shape, read from a source tree (the last row of the targets table).

Static (``ast``), so it reads any checkout without importing it:

- ``store_protocol_members``: members defined in the body of the protocol class the backends
  implement (the first of :data:`PROTOCOLS` found in the core package), with their names (a
  method's ``typing.overload`` signatures and its implementation are one member);
- ``ledger_lines``: lines of ``class Ledger`` in the core package;
- ``import_cycles``: cycles among the modules of the core and PostgreSQL packages (imports at
  any level, ``TYPE_CHECKING`` blocks included: a circle a type checker needs is still one),
  each as a list of modules; ``runtime_import_cycles`` without the ``TYPE_CHECKING`` blocks;
- ``private_names_outside_module``: uses of a ``_name`` of another module of the project (an
  import of it, ``module._name``, or ``obj._name`` on anything but ``self``/``cls`` where no
  class of the using module defines ``_name``), with the most used names. Not counted: a
  namedtuple's ``_replace``, ``_asdict``, ``_fields`` and ``_make`` (public API, underscored
  only so they cannot clash with field names), and the frameworks' own privates
  (:data:`FRAMEWORK_PRIVATES`), which are reported apart as ``framework_private_names`` with
  their uses: the target is no private *project* name used outside its module, and a
  framework's private is kept only where the framework has no public way to do the same.
- ``placeholder_rewriting``: whether the PostgreSQL package rewrites SQLite placeholders
  (a regex over ``?`` in SQL text).

    .venv/bin/python benchmarks/code_shape.py [TREE]
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

PROTOCOLS = ("Store", "StoreSession", "Database")
#: A namedtuple's public methods and attributes (underscored so they cannot clash with fields).
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
#: Private attributes of a framework's objects an adapter uses: the name, and the package whose
#: uses of it are the framework's (elsewhere the name counts as the project's), with why no
#: public API does the same in the framework versions the adapter supports:
FRAMEWORK_PRIVATES = {
    # LangGraph's PostgresSaver / AsyncPostgresSaver (langgraph-checkpoint-postgres): recover()
    # lists thread ids with one skip scan. ``_cursor()`` is the saver's only way to a cursor
    # that honours its lock, its connection pool and its pipeline; ``conn``, ``lock`` and
    # ``pipe`` are public, but choosing a pooled connection goes through the package's
    # private ``_internal.get_connection``, so rebuilding it would use privates too.
    "_cursor": "task_state_guard_langgraph",
}
# Not kept: Celery's ``current_task._get_current_object()`` (a proxy's private) is the public
# ``Celery.current_task`` property (the task running in this thread, or None; Celery >= 5.7).
CORE = "packages/core/src/task_state_guard"
POSTGRES = "packages/backend-postgres/src/task_state_guard_postgres"


def _modules(tree: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg_dir in sorted((tree / "packages").glob("*/src/*")):
        if not pkg_dir.is_dir():
            continue
        for path in pkg_dir.rglob("*.py"):
            rel = path.relative_to(pkg_dir.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _protocol(tree: Path, modules: dict[str, Path]) -> dict[str, Any]:
    for wanted in PROTOCOLS:
        for name, path in modules.items():
            if not name.startswith("task_state_guard") or name.startswith("task_state_guard_"):
                continue
            for node in ast.walk(_parse(path)):
                if isinstance(node, ast.ClassDef) and node.name == wanted and any(
                    getattr(b, "id", getattr(b, "attr", "")) == "Protocol" for b in node.bases
                ):
                    members: list[str] = []
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            names = [item.name]
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target,
                                                                           ast.Name):
                            names = [item.target.id]
                        elif isinstance(item, ast.Assign):
                            names = [t.id for t in item.targets if isinstance(t, ast.Name)]
                        else:
                            names = []
                        members += [n for n in names if n not in members]  # overloads: one
                    return {"class": f"{name}.{wanted}", "count": len(members),
                            "members": members}
    return {"class": None, "count": None, "members": []}


def _ledger_lines(modules: dict[str, Path]) -> int | None:
    for name, path in modules.items():
        if name.startswith("task_state_guard.") or name == "task_state_guard":
            for node in _parse(path).body:
                if isinstance(node, ast.ClassDef) and node.name == "Ledger":
                    return (node.end_lineno or node.lineno) - node.lineno + 1
    return None


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _type_checking_lines(mod: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(mod):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports(modules: dict[str, Path], scope: tuple[str, ...],
             typing_too: bool = True) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not _in(name, scope):
            continue
        mod = _parse(path)
        skip = set() if typing_too else _type_checking_lines(mod)
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(mod):
            if getattr(node, "lineno", 0) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node.level, node.module)
                for alias in node.names:  # a submodule, else a name of the module itself
                    sub = f"{base}.{alias.name}"
                    deps.add(sub if sub in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name and _in(d, scope)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _private_uses(modules: dict[str, Path]) -> dict[str, Any]:
    uses: Counter[str] = Counter()
    framework: Counter[str] = Counter()
    for name, path in modules.items():
        mod = _parse(path)
        own = {n.name for n in ast.walk(mod)
               if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        own |= {t.attr for n in ast.walk(mod) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
        own |= {n.target.attr for n in ast.walk(mod)
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Attribute)}
        own |= {t.id for n in ast.walk(mod) if isinstance(n, ast.Assign | ast.AnnAssign)
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name)}
        for node in ast.walk(mod):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "task_state_guard")) or (isinstance(node, ast.ImportFrom) and node.level):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        uses[f"import {alias.name}"] += 1
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if isinstance(base, ast.Call) and getattr(base.func, "id", "") == "super":
                    continue
                if node.attr in own or node.attr in NAMEDTUPLE_API:
                    continue
                if _in(name, (FRAMEWORK_PRIVATES.get(node.attr, ""),)):
                    framework[node.attr] += 1
                    continue
                uses[node.attr] += 1
    return {"count": sum(uses.values()), "top": dict(uses.most_common(15)),
            "framework": dict(framework.most_common())}


def _rewrites(tree: Path) -> bool:
    for path in (tree / POSTGRES).rglob("*.py"):
        text = path.read_text()
        if 're.compile(r"\\?' in text or "re.compile(r'\\?" in text:
            return True
    return False


def measure(tree: Path) -> dict[str, Any]:
    """The shape figures of the source tree at ``tree``."""
    modules = _modules(tree)
    proto = _protocol(tree, modules)
    scope = ("task_state_guard", "task_state_guard_postgres")
    cycles = _cycles(_imports(modules, scope))
    runtime_cycles = _cycles(_imports(modules, scope, typing_too=False))
    private = _private_uses({k: v for k, v in modules.items()
                             if k.startswith("task_state_guard")})
    return {
        "store_protocol": proto["class"],
        "store_protocol_members": proto["count"],
        "store_protocol_member_names": proto["members"],
        "ledger_lines": _ledger_lines(modules),
        "import_cycles": len(cycles),
        "import_cycle_modules": cycles,
        "runtime_import_cycles": len(runtime_cycles),
        "private_names_outside_module": private["count"],
        "private_names_top": private["top"],
        "framework_private_names": private["framework"],
        "placeholder_rewriting": _rewrites(tree),
    }


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(json.dumps(measure(root), sort_keys=True))
