"""The code's shape, read statically from a source tree; prints its counts as JSON.

``tests/core/test_code_shape.py`` asserts the invariants below on this checkout and
``benchmarks/targets.py`` reports the same figures per variant tree. Static (``ast``), so it
reads any checkout without importing it. Every scan covers the five packages
(:data:`PACKAGES`):

- ``store_protocol_members``: the members of the protocol class the backends implement (the
  first of :data:`PROTOCOLS` found in the core package; a method's ``typing.overload``
  signatures and its implementation are one member); ``store_protocol_callables``: every
  member a backend must provide, the members of its sub-protocols included (a member whose
  type is another ``Protocol`` of the core, such as ``queries: Queries``, counts once itself
  and adds that protocol's members, recursively), with each sub-protocol's members in
  ``store_sub_protocols``;
- ``ledger_code_lines`` and ``ledger_statements``: the code of ``class Ledger`` in the core
  package, as lines that carry code (docstrings, comments and blank lines not counted) and as
  statements; ``ledger_lines`` is its full length, for information only. A bound on these is a
  smell detector: it must never be met by cutting documentation;
- ``import_cycles``: circles among the modules of each package (imports at any level: a
  module's top, a function's body, ``TYPE_CHECKING`` blocks; a circle a type checker needs is
  still one), by package in ``import_cycles_by_package``; ``runtime_import_cycles`` without
  the ``TYPE_CHECKING`` blocks;
- ``private_names_outside_module``: uses of a ``_name`` outside the module that defines it:
  an import of another module's ``_name`` (a package's own ``_module`` excepted), and
  ``obj._name`` read or assigned where ``obj`` is not ``self``, ``cls``, ``super()`` or the
  module itself, unless a class of the using module defines ``_name`` (in its body or on
  ``self``/``cls``: that object is most likely one of the module's own). Assigning
  ``obj._name = ...`` does not make ``_name`` the module's. Not counted: a namedtuple's
  ``_replace``, ``_asdict``, ``_fields`` and ``_make`` (public API, underscored only so they
  cannot clash with field names), and the frameworks' own privates
  (:data:`FRAMEWORK_PRIVATES`), reported apart as ``framework_private_names``;
- ``sql_text_edits``: a ``.replace(...)``, ``re.sub(...)``/``pattern.sub(...)`` (``subn``
  too) or ``%``-formatting applied to SQL text, each as ``path:line`` in
  ``sql_text_edit_sites``. SQL text is: a string literal (or an f-string, a concatenation or a
  ``.format``/``.join`` of one) holding SQL (:data:`SQL_TEXT`); a name bound, in the same
  function or at the module's top, to SQL text or to a call of a function of the module that
  returns SQL text; a parameter or variable named as SQL (:data:`SQL_NAMES`); an attribute
  named as SQL (``rules.TASK_KIND_SQL``). An edit is one whose receiver or any argument is SQL
  text. Filling a template's named slots with ``str.format`` is composition and not counted;
- ``core_root_modules``: the ``.py`` files directly in the core package, against
  :data:`CORE_ROOT_ALLOWED` (``core_root_unexpected``, ``core_root_missing``);
- ``module_lines``: every module's length in lines, all of them (docstrings, comments and
  blank lines count: a module outgrows a bound by being split by concern, never by cutting
  its documentation), by path; ``longest_module_by_package``: each package's longest module;
- ``adapter_classes``: for each adapter class of :data:`ADAPTER_CLASSES`, every definition
  of a class of that name in its package (``path:line``) with its bases and keywords, as
  written.

    .venv/bin/python scripts/code_shape.py [TREE]
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

#: The five packages, by short name: their source folder in the tree.
PACKAGES = {
    "core": "packages/core/src/task_state_guard",
    "postgres": "packages/backend-postgres/src/task_state_guard_postgres",
    "celery": "packages/adapter-celery/src/task_state_guard_celery",
    "dramatiq": "packages/adapter-dramatiq/src/task_state_guard_dramatiq",
    "langgraph": "packages/adapter-langgraph/src/task_state_guard_langgraph",
}
#: The modules the core's root may hold: the domain, the facade and the entry points.
CORE_ROOT_ALLOWED = frozenset({
    "__init__", "__main__", "model", "rules", "reasons", "ledger", "writes", "durations",
    "process", "heartbeat",
})
PROTOCOLS = ("Store", "StoreSession", "Database")
#: The class an adapter's users hold, by package: its definitions and bases are reported.
ADAPTER_CLASSES = {"langgraph": "GuardedGraph"}
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

#: Text that is SQL: a statement's or a clause's opening words, upper case as the project
#: writes its SQL (an English sentence rarely holds two upper-case keywords in this order).
SQL_TEXT = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TEMP\s+|UNIQUE\s+)?(TABLE|INDEX|TRIGGER|VIEW)|ALTER\s+TABLE|"
    r"DROP\s+(TABLE|INDEX|TRIGGER|VIEW)|WITH\b[\s\S]*\bAS\s*\(|PRAGMA\s+\w+|"
    r"WHERE\b[\s\S]*(=|\bIN\b|\bIS\b|EXISTS)|UNION\s+ALL|ON\s+CONFLICT|RETURNING\s+\w+)\b")
#: Names (of a parameter, a variable or an attribute) that hold SQL text.
SQL_NAMES = re.compile(r"^_?(sql|ddl|stmt|statement|statements)$|_sql$|^_?sql_|_SQL$|^_?SQL_",
                       re.IGNORECASE)
_EDIT_METHODS = frozenset({"replace", "sub", "subn"})


def _modules(tree: Path) -> dict[str, Path]:
    """Every module of the five packages, by dotted name."""
    out: dict[str, Path] = {}
    for rel in PACKAGES.values():
        pkg_dir = tree / rel
        if not pkg_dir.is_dir():
            continue
        for path in sorted(pkg_dir.rglob("*.py")):
            parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


_PARSED: dict[Path, ast.Module] = {}
_NODES: dict[int, list[ast.AST]] = {}


def _parse(path: Path) -> ast.Module:
    if path not in _PARSED:
        _PARSED[path] = ast.parse(path.read_text(), filename=str(path))
    return _PARSED[path]


def _walk(node: ast.AST) -> list[ast.AST]:
    """``ast.walk(node)`` as a list, kept (the trees are read many times)."""
    if id(node) not in _NODES:
        _NODES[id(node)] = list(ast.walk(node))
    return _NODES[id(node)]


def _package_of(module: str) -> str:
    top = module.split(".")[0]
    for short, rel in PACKAGES.items():
        if rel.rsplit("/", 1)[-1] == top:
            return short
    return top


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# ----------------------------------------------------------------------------- protocol


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(getattr(b, "id", getattr(b, "attr", "")) == "Protocol" for b in node.bases)


def _core_protocols(modules: dict[str, Path]) -> dict[str, tuple[str, ast.ClassDef]]:
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for name, path in modules.items():
        if _package_of(name) != "core":
            continue
        for node in _walk(_parse(path)):
            if isinstance(node, ast.ClassDef) and _is_protocol(node):
                found.setdefault(node.name, (name, node))
    return found


def _members(node: ast.ClassDef) -> list[tuple[str, ast.expr | None]]:
    """A protocol's members in order with their type (a property's return type), overloads
    once."""
    members: dict[str, ast.expr | None] = {}
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            is_property = any(getattr(d, "id", "") == "property" for d in item.decorator_list)
            members.setdefault(item.name, item.returns if is_property else None)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.setdefault(item.target.id, item.annotation)
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name):
                    members.setdefault(target.id, None)
    return list(members.items())


def _type_name(annotation: ast.expr | None) -> str | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.Name):
        return annotation.id
    if isinstance(annotation, ast.Attribute):
        return annotation.attr
    return None


def _callables(cls: ast.ClassDef, protocols: dict[str, tuple[str, ast.ClassDef]],
               subs: dict[str, Any], prefix: str = "", seen: tuple[str, ...] = ()) -> int:
    """How many members ``cls`` and its sub-protocols have; each sub-protocol's members go to
    ``subs`` under the member's dotted name."""
    total = 0
    for member, annotation in _members(cls):
        total += 1
        sub = _type_name(annotation)
        if sub in protocols and sub not in seen and sub != cls.name:
            sub_module, sub_node = protocols[sub]
            names = [m for m, _ in _members(sub_node)]
            key = f"{prefix}{member}"
            subs[key] = {"class": f"{sub_module}.{sub}", "members": len(names),
                         "member_names": names}
            total += _callables(sub_node, protocols, subs, f"{key}.", (*seen, cls.name))
    return total


def _protocol(modules: dict[str, Path]) -> dict[str, Any]:
    protocols = _core_protocols(modules)
    for wanted in PROTOCOLS:
        if wanted in protocols:
            module, node = protocols[wanted]
            subs: dict[str, Any] = {}
            total = _callables(node, protocols, subs)
            members = [m for m, _ in _members(node)]
            return {"class": f"{module}.{wanted}", "count": len(members), "members": members,
                    "callables": total, "subs": subs}
    return {"class": None, "count": None, "members": [], "callables": None, "subs": {}}


# ----------------------------------------------------------------------------- Ledger


def _docstring_lines(node: ast.AST) -> set[int]:
    """The lines of every docstring in ``node`` (a module's, a class's, a function's)."""
    lines: set[int] = set()
    for item in ast.walk(node):
        if isinstance(item, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = item.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def _ledger(modules: dict[str, Path]) -> dict[str, int | None]:
    for name, path in modules.items():
        if _package_of(name) != "core":
            continue
        for node in _parse(path).body:
            if not (isinstance(node, ast.ClassDef) and node.name == "Ledger"):
                continue
            end = node.end_lineno or node.lineno
            text = path.read_text().splitlines()[node.lineno - 1:end]
            docs = _docstring_lines(node)
            code = sum(1 for i, line in enumerate(text, node.lineno)
                       if i not in docs and line.strip() and not line.strip().startswith("#"))
            statements = sum(1 for n in ast.walk(node) if isinstance(n, ast.stmt)
                             and not (n.lineno in docs and isinstance(n, ast.Expr)))
            return {"lines": end - node.lineno + 1, "code_lines": code,
                    "statements": statements - 1}  # not the class statement itself
    return {"lines": None, "code_lines": None, "statements": None}


# ----------------------------------------------------------------------------- imports


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _type_checking_lines(mod: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in _walk(mod):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(modules: dict[str, Path], typing_too: bool = True) -> dict[str, set[str]]:
    """Each module's imports of other modules of the five packages (at any level)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        mod = _parse(path)
        skip = set() if typing_too else _type_checking_lines(mod)
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _walk(mod):
            if getattr(node, "lineno", 0) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node.level, node.module)
                for alias in node.names:  # a submodule, else a name of the module itself
                    sub = f"{base}.{alias.name}"
                    deps.add(sub if sub in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name}
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
        for w in sorted(graph.get(v, ())):
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


def _by_package(cycles: list[list[str]]) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {short: [] for short in PACKAGES}
    for cycle in cycles:
        owners = {_package_of(m) for m in cycle}
        out.setdefault(owners.pop() if len(owners) == 1 else "across packages", []).append(cycle)
    return out


# ----------------------------------------------------------------------------- private names


def _own_private_attributes(mod: ast.Module) -> set[str]:
    """The ``_names`` the module's classes define: in a class body, or on ``self``/``cls``."""
    own: set[str] = set()
    for cls in (n for n in _walk(mod) if isinstance(n, ast.ClassDef)):
        for item in cls.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(item.name)
            elif isinstance(item, ast.Assign):
                own.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                own.add(item.target.id)
        for node in ast.walk(cls):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(
                        target.value, ast.Name) and target.value.id in ("self", "cls"):
                    own.add(target.attr)
    return {n for n in own if n.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(modules: dict[str, Path], tree: Path) -> dict[str, Any]:
    uses: Counter[str] = Counter()
    sites: list[str] = []
    framework: Counter[str] = Counter()
    for name, path in modules.items():
        mod = _parse(path)
        own = _own_private_attributes(mod)
        is_pkg = path.name == "__init__.py"
        here = f"{path.relative_to(tree)}"
        # The module itself, as a name bound to it (``import x.y as me`` of itself: rare).
        selves = {a.asname or a.name for n in _walk(mod) if isinstance(n, ast.Import)
                  for a in n.names if a.name == name}
        for node in _walk(mod):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node.level, node.module)
                if not _in(base, tuple(modules)) and not node.level:
                    continue  # another distribution's names are not the project's
                for alias in node.names:
                    if not _is_private(alias.name):
                        continue
                    sub = f"{base}.{alias.name}"
                    if sub in modules and _package_of(sub) == _package_of(name):
                        continue  # a package's own private module
                    uses[f"import {alias.name}"] += 1
                    sites.append(f"{here}:{node.lineno}: import {alias.name}")
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                base_expr = node.value
                if isinstance(base_expr, ast.Name) and base_expr.id in ("self", "cls", *selves):
                    continue
                if isinstance(base_expr, ast.Call) and getattr(base_expr.func, "id", "") == "super":
                    continue
                if node.attr in own or node.attr in NAMEDTUPLE_API:
                    continue
                if _in(name, (FRAMEWORK_PRIVATES.get(node.attr, ""),)):
                    framework[node.attr] += 1
                    continue
                uses[node.attr] += 1
                sites.append(f"{here}:{node.lineno}: {ast.unparse(node)}")
    return {"count": sum(uses.values()), "top": dict(uses.most_common(15)), "sites": sites,
            "framework": dict(framework.most_common())}


# ----------------------------------------------------------------------------- SQL text edits


_Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_SCOPES: dict[int, list[tuple[_Scope, list[ast.AST]]]] = {}


def _scopes(mod: ast.Module) -> list[tuple[_Scope, list[ast.AST]]]:
    """The module and each function or lambda in it, with its own nodes (those outside its
    nested functions and lambdas)."""
    if id(mod) not in _SCOPES:
        scopes: list[_Scope] = [mod, *(n for n in _walk(mod) if isinstance(
            n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))]
        out = []
        for scope in scopes:
            own: list[ast.AST] = []
            stack = list(ast.iter_child_nodes(scope))
            while stack:
                node = stack.pop()
                own.append(node)
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    stack.extend(ast.iter_child_nodes(node))
            out.append((scope, own))
        _SCOPES[id(mod)] = out
    return _SCOPES[id(mod)]


class _SqlText:
    """Decides whether an expression of one module is SQL text (see the module docstring)."""

    def __init__(self, mod: ast.Module) -> None:
        self.globals: set[str] = set()
        self.locals: dict[ast.AST, set[str]] = {}
        self.functions: set[str] = set()  # module functions that return SQL text
        defs = {n for n in mod.body if isinstance(n, ast.FunctionDef)}
        changed = True
        while changed:  # to a fixed point: a name bound to a name bound to SQL is SQL
            before = (len(self.globals), sum(map(len, self.locals.values())),
                      len(self.functions))
            for scope, own in _scopes(mod):
                names = self.globals if isinstance(scope, ast.Module) else \
                    self.locals.setdefault(scope, set())
                for node in own:
                    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None \
                            and self.is_sql(node.value, names):
                        for target in (node.targets if isinstance(node, ast.Assign)
                                       else [node.target]):
                            names.update(n.id for n in ast.walk(target)
                                         if isinstance(n, ast.Name))
                    elif isinstance(node, ast.For | ast.comprehension) and self.is_sql(
                            node.iter, names):
                        names.update(n.id for n in ast.walk(node.target)
                                     if isinstance(n, ast.Name))
            for scope, own in _scopes(mod):
                if not (isinstance(scope, ast.FunctionDef) and scope in defs):
                    continue
                names = self.locals.get(scope, set())
                if any(isinstance(n, ast.Return) and n.value is not None
                       and self.is_sql(n.value, names) for n in own):
                    self.functions.add(scope.name)
            changed = before != (len(self.globals), sum(map(len, self.locals.values())),
                                 len(self.functions))

    def is_sql(self, node: ast.expr, names: set[str]) -> bool:
        """Whether ``node`` (in a scope whose SQL names are ``names``) is SQL text."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and bool(SQL_TEXT.search(node.value))
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value for v in node.values
                              if isinstance(v, ast.Constant) and isinstance(v.value, str))
            return bool(SQL_TEXT.search(literal)) or any(
                self.is_sql(v.value, names) for v in node.values
                if isinstance(v, ast.FormattedValue))
        if isinstance(node, ast.Name):
            return node.id in names or node.id in self.globals or bool(SQL_NAMES.search(node.id))
        if isinstance(node, ast.Attribute):
            return bool(SQL_NAMES.search(node.attr))
        if isinstance(node, ast.BinOp):
            return self.is_sql(node.left, names) or self.is_sql(node.right, names)
        if isinstance(node, ast.IfExp):
            return self.is_sql(node.body, names) or self.is_sql(node.orelse, names)
        if isinstance(node, ast.Subscript):
            return self.is_sql(node.value, names)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self.is_sql(e, names) for e in node.elts)
        if isinstance(node, ast.Dict):
            return any(self.is_sql(v, names) for v in node.values)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            return self.is_sql(node.elt, names)
        if isinstance(node, ast.DictComp):
            return self.is_sql(node.value, names)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                return func.id in self.functions
            if isinstance(func, ast.Attribute) and func.attr in (
                    "format", "join", "strip", "replace", "sub", "upper", "lower"):
                return self.is_sql(func.value, names) or any(
                    self.is_sql(a, names) for a in node.args)
        return False


def _sql_edits(modules: dict[str, Path], tree: Path) -> list[str]:
    sites: list[str] = []
    for path in modules.values():
        mod = _parse(path)
        sql = _SqlText(mod)
        here = f"{path.relative_to(tree)}"
        for scope, own in _scopes(mod):
            names = sql.globals if isinstance(scope, ast.Module) else sql.locals.get(scope, set())
            for node in own:
                edit = False
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in _EDIT_METHODS:
                    operands = [node.func.value, *node.args, *(k.value for k in node.keywords)]
                    edit = any(sql.is_sql(o, names) for o in operands)
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                    edit = sql.is_sql(node.left, names)
                if edit:
                    text = ast.unparse(node)
                    sites.append(f"{here}:{getattr(node, 'lineno', 0)}: "
                                 f"{text if len(text) <= 80 else text[:77] + '...'}")
    return sorted(set(sites), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


# ----------------------------------------------------------------------------- core root


def _core_root(tree: Path) -> dict[str, list[str]]:
    root = tree / PACKAGES["core"]
    present = sorted(p.stem for p in root.glob("*.py"))
    return {"modules": present,
            "unexpected": [m for m in present if m not in CORE_ROOT_ALLOWED],
            "missing": sorted(CORE_ROOT_ALLOWED - set(present))}


# ----------------------------------------------------------------------------- sizes, classes


def _line_count(path: Path) -> int:
    """Every line of the file, as ``wc -l`` counts them (plus a last line without newline)."""
    text = path.read_text()
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _module_lines(modules: dict[str, Path], tree: Path) -> dict[str, Any]:
    lines = {str(path.relative_to(tree)): _line_count(path) for path in modules.values()}
    longest: dict[str, dict[str, Any]] = {}
    for name, path in modules.items():
        rel = str(path.relative_to(tree))
        best = longest.get(_package_of(name))
        if best is None or lines[rel] > best["lines"]:
            longest[_package_of(name)] = {"path": rel, "lines": lines[rel]}
    return {"lines": dict(sorted(lines.items())), "longest": longest}


def _adapter_classes(modules: dict[str, Path], tree: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for package, cls in ADAPTER_CLASSES.items():
        found = []
        for name, path in modules.items():
            if _package_of(name) != package:
                continue
            for node in _walk(_parse(path)):
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    found.append({
                        "at": f"{path.relative_to(tree)}:{node.lineno}",
                        "bases": [ast.unparse(b) for b in node.bases],
                        "keywords": [ast.unparse(k) for k in node.keywords],
                    })
        out[package] = {"class": cls, "definitions": sorted(found, key=lambda d: d["at"])}
    return out


def measure(tree: Path) -> dict[str, Any]:
    """The shape figures of the source tree at ``tree``."""
    tree = tree.resolve()
    modules = _modules(tree)
    proto = _protocol(modules)
    cycles = _cycles(_imports(modules))
    runtime_cycles = _cycles(_imports(modules, typing_too=False))
    private = _private_uses(modules, tree)
    edits = _sql_edits(modules, tree)
    ledger = _ledger(modules)
    root = _core_root(tree)
    sizes = _module_lines(modules, tree)
    return {
        "packages": sorted({_package_of(m) for m in modules}),
        "store_protocol": proto["class"],
        "store_protocol_members": proto["count"],
        "store_protocol_member_names": proto["members"],
        "store_protocol_callables": proto["callables"],
        "store_sub_protocols": proto["subs"],
        "ledger_lines": ledger["lines"],
        "ledger_code_lines": ledger["code_lines"],
        "ledger_statements": ledger["statements"],
        "import_cycles": len(cycles),
        "import_cycles_by_package": _by_package(cycles),
        "runtime_import_cycles": len(runtime_cycles),
        "private_names_outside_module": private["count"],
        "private_names_top": private["top"],
        "private_name_sites": private["sites"],
        "framework_private_names": private["framework"],
        "sql_text_edits": len(edits),
        "sql_text_edit_sites": edits,
        "core_root_modules": root["modules"],
        "core_root_unexpected": root["unexpected"],
        "core_root_missing": root["missing"],
        "module_lines": sizes["lines"],
        "longest_module_by_package": sizes["longest"],
        "adapter_classes": _adapter_classes(modules, tree),
    }


if __name__ == "__main__":
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print(json.dumps(measure(here), sort_keys=True, indent=1))
