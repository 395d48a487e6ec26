#!/usr/bin/env python3
"""Privacy audit of the runtime source of every package (packages/*/src).

Checks, without ever printing matched text (only relative path, category and count):

* ``network-import`` - the core's runtime imports a network or telemetry module (socket, http,
  urllib.request, requests, ...). The core is stdlib-only and offline by contract.
* ``telemetry-import`` - any package (adapters included) imports a telemetry/analytics/error
  reporting SDK. Adapters legitimately import their frameworks (celery, dramatiq, langgraph),
  which talk to brokers; that is not flagged.
* ``network-call`` - the core calls a network primitive by name (e.g. ``socket.create_connection``
  or ``urlopen``) even without importing its module at top level.
* ``secret`` - a string that looks like a credential (cloud keys, tokens, private keys,
  hard-coded password/secret/token assignments).
* ``unsafe-mode`` - a file-mode literal that grants group/other access (``os.chmod(p, 0o644)``,
  ``os.open(p, flags, 0o666)``, ``mkdir(mode=0o755)``), or ``os.umask`` loosening the umask.
* ``syntax`` - a file that does not parse (so the checks above could not run on it).

Exit 0 when clean, 1 on findings, 2 on usage errors. ``--self-test`` builds a temporary tree
with synthetic canaries, checks that every category is caught and that no canary text reaches
the report, then audits a clean tree.

    python scripts/privacy_audit.py [--root DIR] [--json]
    python scripts/privacy_audit.py --self-test
    python scripts/privacy_audit.py --sdist /path/to/extracted-sdist
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

NETWORK_MODULES = frozenset({
    "socket", "ssl", "http", "http.client", "http.server", "urllib.request", "urllib3",
    "requests", "httpx", "aiohttp", "ftplib", "smtplib", "poplib", "imaplib", "telnetlib",
    "xmlrpc", "xmlrpc.client", "socketserver", "asyncio.streams", "websocket", "websockets",
    "grpc", "paramiko", "pycurl", "webbrowser", "nntplib",
})
TELEMETRY_MODULES = frozenset({
    "sentry_sdk", "raven", "opentelemetry", "ddtrace", "datadog", "newrelic", "statsd",
    "posthog", "segment", "analytics", "mixpanel", "amplitude", "bugsnag", "rollbar",
    "honeycomb", "beeline", "logfire", "elasticapm", "scout_apm",
    "applicationinsights", "opencensus", "heap", "rudderstack", "launchdarkly", "wandb",
    "langsmith", "langfuse", "helicone", "traceloop", "openlit", "agentops",
})
#: The core modules of the opt-in ``tsg serve`` server (alias ``tsg metrics --serve``; loopback
#: by default, a token by default, read-only), imported only by that command: the server (its
#: listening socket and connections) and its request module (``http.server`` parses each
#: request). They may import these modules and nothing else of NETWORK_MODULES; network calls
#: stay flagged.
SERVER_MODULES = ("task_state_guard/web/server.py", "task_state_guard/web/request.py")
SERVER_ALLOWED = frozenset({"socket", "http"})
NETWORK_CALLS = frozenset({
    "create_connection", "urlopen", "getaddrinfo", "gethostbyname", "gethostname",
    "open_connection", "start_server", "create_server", "getfqdn",
})
SECRET_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}"),
    re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{35}"),
    re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}"),  # not "task-..." words
    re.compile(r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
    re.compile(r"(?i)(?:https?|amqp|redis|postgres(?:ql)?|mysql)://[^\s:/@]+:[^\s@/]+@"),
]
SECRET_NAMES = re.compile(r"(?i)(password|passwd|secret|api_?key|access_?key|auth_?token|"
                          r"private_?key|token)$")
MODE_FUNCS = {"chmod": 1, "fchmod": 1, "lchmod": 1, "open": 2, "mkdir": 1, "makedirs": 1,
              "mkfifo": 1, "mknod": 1, "touch": 0}


def _module_matches(name: str, banned: frozenset[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[: i + 1]) in banned for i in range(len(parts)))


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _mode_literal(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(
            node.value, bool) and 0 <= node.value <= 0o7777:
        return node.value
    return None


def audit_file(path: Path, *, core: bool) -> Counter[str]:
    found: Counter[str] = Counter()
    allowed = SERVER_ALLOWED if core and path.as_posix().endswith(SERVER_MODULES) else frozenset()
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        found["syntax"] += 1
        return found
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if _module_matches(name, TELEMETRY_MODULES):
                found["telemetry-import"] += 1
            elif core and _module_matches(name, NETWORK_MODULES) and not _module_matches(
                    name, allowed):
                found["network-import"] += 1
        if isinstance(node, ast.Call):
            fname = _call_name(node)
            if fname == "__import__" or fname == "import_module":
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if _module_matches(arg.value, TELEMETRY_MODULES):
                        found["telemetry-import"] += 1
                    elif core and _module_matches(arg.value, NETWORK_MODULES):
                        found["network-import"] += 1
            if core and fname in NETWORK_CALLS:
                found["network-call"] += 1
            if fname == "umask":
                value = _mode_literal(node.args[0] if node.args else None)
                if value is not None and value & 0o077 != 0o077:
                    found["unsafe-mode"] += 1
            elif fname in MODE_FUNCS:
                candidates = [kw.value for kw in node.keywords if kw.arg == "mode"]
                index = MODE_FUNCS[fname]
                if len(node.args) > index:
                    candidates.append(node.args[index])
                for cand in candidates:
                    value = _mode_literal(cand)
                    # open(path, flags, mode): only when it looks like a mode, not a flag set
                    if value is not None and value & 0o077 and value >= 0o100:
                        found["unsafe-mode"] += 1
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                p.search(node.value) for p in SECRET_PATTERNS):
            found["secret"] += 1
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and len(
                    value.value) >= 8 and " " not in value.value:
                for target in targets:
                    tname = target.id if isinstance(target, ast.Name) else (
                        target.attr if isinstance(target, ast.Attribute) else "")
                    if tname and SECRET_NAMES.search(tname):
                        found["secret"] += 1
    return found


def audit(root: Path) -> dict[str, object]:
    """Audit every packages/*/src tree under ``root``; report only path, category, count."""
    findings = []
    files = 0
    packages = sorted(p for p in (root / "packages").glob("*/src") if p.is_dir())
    for src in packages:
        core = src.parent.name == "core"
        for path in sorted(src.rglob("*.py")):
            files += 1
            for category, count in sorted(audit_file(path, core=core).items()):
                findings.append({"path": path.relative_to(root).as_posix(),
                                 "category": category, "count": count})
    return {"ok": not findings and files > 0, "packages": len(packages), "files_scanned": files,
            "findings": findings}


def audit_sdist(root: Path) -> dict[str, object]:
    """Audit an extracted source distribution (its src/ tree; the core strictly)."""
    findings = []
    src = root / "src"
    files = sorted(src.rglob("*.py")) if src.is_dir() else []
    core = (src / "task_state_guard").is_dir()
    for path in files:
        for category, count in sorted(audit_file(path, core=core).items()):
            findings.append({"path": path.relative_to(root).as_posix(), "category": category,
                             "count": count})
    return {"ok": not findings and bool(files), "files_scanned": len(files),
            "findings": findings}


def self_test() -> dict[str, object]:
    """Synthetic canaries for every category; the report must flag them without echoing."""
    # Built at run time so this script holds no literal secret.
    canaries = {
        "aws": "AKIA" + "Q" * 16,
        "pem": "-----BEGIN " + "RSA PRIVATE KEY-----",
        "gh": "ghp_" + "a1" * 18,
        "assign": "hunter2" + "canary" * 2,
    }
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="tsg-audit-") as tmp:
        root = Path(tmp)
        core = root / "packages" / "core" / "src" / "pkg"
        adapter = root / "packages" / "adapter-x" / "src" / "pkg_x"
        core.mkdir(parents=True)
        adapter.mkdir(parents=True)
        (core / "net.py").write_text("import socket\nfrom urllib.request import urlopen\n"
                                     "import requests\n")
        (core / "call.py").write_text("import importlib\nm = importlib.import_module('http.client')"
                                      "\nx = socket.create_connection(('h', 1))\n")
        (core / "modes.py").write_text("import os\nos.chmod('p', 0o644)\n"
                                       "os.open('p', os.O_CREAT, 0o666)\nos.umask(0)\n"
                                       "os.mkdir('d', mode=0o755)\n")
        (core / "keys.py").write_text(
            f"A = {canaries['aws']!r}\nB = {canaries['pem']!r}\nC = {canaries['gh']!r}\n"
            f"password = {canaries['assign']!r}\n")
        (core / "broken.py").write_text("def (:\n")
        (core / "clean.py").write_text("import os, sqlite3, urllib.parse\n"
                                       "os.chmod('p', 0o600)\nos.mkdir('d', 0o700)\n")
        (adapter / "framework.py").write_text("import celery\nimport socket\nimport redis\n")
        (adapter / "telemetry.py").write_text(
            "import sentry_sdk\nfrom opentelemetry import trace\n")
        report = audit(root)
        text = json.dumps(report)
        by = Counter()
        for f in report["findings"]:  # type: ignore[union-attr]
            by[(f["path"].rsplit("/", 1)[-1], f["category"])] += f["count"]
        checks["network imports caught"] = by[("net.py", "network-import")] >= 3
        checks["dynamic import and call caught"] = (by[("call.py", "network-import")] >= 1
                                                    and by[("call.py", "network-call")] >= 1)
        checks["unsafe modes caught"] = by[("modes.py", "unsafe-mode")] == 4
        checks["secrets caught"] = by[("keys.py", "secret")] >= 4
        checks["unparsable file reported"] = by[("broken.py", "syntax")] == 1
        checks["clean core file passes"] = not any(k[0] == "clean.py" for k in by)
        checks["adapter frameworks allowed"] = not any(k[0] == "framework.py" for k in by)
        checks["adapter telemetry caught"] = by[("telemetry.py", "telemetry-import")] >= 2
        checks["no canary echoed"] = not any(v in text for v in canaries.values()) and (
            "hunter2" not in text)
        checks["report has only path/category/count"] = all(
            set(f) == {"path", "category", "count"} for f in report["findings"])  # type: ignore[union-attr]
        checks["failing tree is not ok"] = report["ok"] is False
        for path in (core / "net.py", core / "call.py", core / "modes.py", core / "keys.py",
                     core / "broken.py", adapter / "telemetry.py"):
            os.unlink(path)
        clean = audit(root)
        checks["clean tree is ok"] = clean["ok"] is True and clean["findings"] == []
    return {"ok": all(checks.values()), "self_test": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Privacy audit of packages/*/src.")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--sdist", help="audit an extracted source distribution instead")
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        return 2
    if args.self_test:
        result = self_test()
    elif args.sdist:
        result = audit_sdist(Path(args.sdist))
    else:
        root = Path(args.root)
        if not (root / "packages").is_dir():
            print(json.dumps({"ok": False, "error": "no packages directory"}))
            return 2
        result = audit(root)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
