"""One-step set-up and entry point for a fresh machine that only has python3 (>= 3.11).

    python3 scripts/dev.py demo    # set up, start Redis if needed, run the Celery crash demo
    python3 scripts/dev.py test    # set up, start Redis/RabbitMQ if needed, run every check

Set-up: installs uv into ./.tools (a private virtual environment) when it is not on PATH, then
``uv sync --all-packages --frozen`` builds ./.venv from uv.lock with the five packages and the
dev tools. ``test`` runs ruff, mypy --strict on the core, the adapters and the PostgreSQL
backend, then the support matrix (real Celery/Dramatiq workers against Redis and RabbitMQ, and
the PostgreSQL ledger, on 127.0.0.1; a service that cannot be started is an error, never a
skip). It also puts Prometheus (and promtool) from Debian's ``prometheus`` package into
./.tools/prometheus for the dashboard test, when they are not on PATH. The matrix:

* the conformance suite (tests/core, tests/contract) on the SQLite backend, and the tests of
  SQLite storage itself (tests/sqlite), on every other CPython >= 3.11 installed on this
  machine, each in its own ./.venv-py<version> built from uv.lock (interpreters are found,
  never downloaded; a supported minor version that is not installed is printed as not
  tested);
* each adapter's suite (and the PostgreSQL backend's, ``tests/postgres``) against the lowest
  framework (driver) versions its pyproject declares, on the newest interpreter found (uv's
  ``lowest-direct`` resolution into ./.venv-lowest-<name>; uv.lock is not touched), with a
  check that the resolved versions are exactly the declared lower bounds; there an adapter's
  suite runs on the SQLite ledger (``--backend sqlite``; its few rows that name a PostgreSQL
  ledger in their id run too);
* the whole suite on the interpreter running this script, with uv.lock's (newest) framework
  versions, every ledger-backed test on both backends, SQLite and PostgreSQL (``pytest
  --backend``, default ``all``; the test id names the backend: ``[sqlite]``,
  ``[postgresql]``): the conformance suite (tests/core, tests/contract), SQLite storage
  (tests/sqlite), the Celery, Dramatiq and LangGraph suites with their real workers (a
  PostgreSQL row's workers get a ledger URL
  naming a schema of the test's own), the crash-consistency audit of tests/reliability (which
  runs once, here; its SIGKILL soak on SQLite only until the PostgreSQL prune race it found is
  fixed) and the example projects; tests/fleet runs workers of several "hosts" on one
  PostgreSQL ledger, and tests/web loads ``tsg serve``'s pages in headless Chromium (Debian's
  ``chromium`` package, installed with ``apt-get`` when missing and this runs as root;
  otherwise the web tests fail).

Why the legs are split so: the whole suite on both backends is the long leg (the adapters'
real-worker rows wait out real broker and grace windows; PostgreSQL roughly doubles them), and
the machine has 2 cores. The ledger backend is the same code at both ends of a framework's
range, so the lowest-version legs prove the framework side on one backend (SQLite, the
default ledger) and the whole-suite leg proves both backends with the newest frameworks; the
other CPythons prove the interpreter-dependent part (the conformance suite) on SQLite, since
the PostgreSQL half depends on the driver, not on the interpreter. Measured wall times of each
leg are printed on its ``matrix:`` line.

How they run: the whole suite streams here while a second process (``legs-beside``, internal)
runs the other legs one after another, its output in ./.venv/tsg-matrix-beside.log (a failed
leg's pytest summary is printed at the end): the legs mostly wait on brokers and grace windows,
so two streams fill the two cores. Tests marked ``service_wide`` (a PostgreSQL restart, a
broker-wide RabbitMQ setting) would break whatever runs beside them: each leg runs them last,
alone.

Before its tests each environment's site-packages and the workspace's sources are compiled to
bytecode, so the many processes the suites start never compile their imports again.

Every leg prints a ``matrix:`` line with its pass count; the exit status is non-zero when any
leg fails. ``test`` with pytest arguments runs only the whole-suite leg with those arguments.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, ".tools")
#: Prometheus and promtool for the dashboard and alert-rule test (tests/examples).
PROMETHEUS_DIR = os.path.join(TOOLS, "prometheus")


def run(cmd: list[str], **kwargs: Any) -> int:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, **kwargs)


def uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    local = os.path.join(TOOLS, "bin", "uv")
    if not os.path.exists(local):
        if run([sys.executable, "-m", "venv", TOOLS]) != 0:
            sys.exit("could not create .tools (python3 -m venv)")
        if run([os.path.join(TOOLS, "bin", "python"), "-m", "pip", "install", "-q", "uv"]) != 0:
            sys.exit("could not install uv from the package index")
    return local


def sync() -> None:
    if run([uv(), "sync", "--all-packages", "--frozen", "--python", sys.executable]) != 0:
        sys.exit("uv sync failed")


# ------------------------------------------------------------------------------ support matrix
# CPython minor versions to look for; one that is not installed is printed, never hidden (the
# packages claim only what a run on the CI machine proved: 3.11-3.13).
KNOWN_PYTHONS = ("3.11", "3.12", "3.13", "3.14")
ADAPTERS = ("celery", "dramatiq", "langgraph")
# Storage backends with a package and a suite of their own (packages/backend-<name>).
BACKENDS = ("postgres",)
# What each adapter leg reports as its framework version set (distribution names).
FRAMEWORK_DISTS = {
    "celery": ("celery", "kombu", "redis"),
    "dramatiq": ("dramatiq", "redis", "pika"),
    "langgraph": ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint",
                  "langchain-core"),
    "postgres": ("psycopg", "psycopg-binary"),
}
# Dev-group test tools a leg leaves out: its own driver (resolved to its lowest) and tools
# that would pin it higher.
LEG_UNPINNED = {"postgres": {"psycopg", "langgraph-checkpoint-postgres"}}


def package_dir(name: str) -> str:
    """The package directory of an adapter or a backend."""
    return os.path.join(ROOT, "packages", f"backend-{name}" if name in BACKENDS
                        else f"adapter-{name}")
# The ledger backend of the adapters' lowest-version legs (the whole-suite leg runs both).
LOWEST_LEG_BACKEND = "sqlite"
# What each other CPython runs: the conformance suite on SQLite and the tests of SQLite storage
# itself (the interpreter-dependent part: sqlite3, file modes, locks, fork, signals, the CLI, the
# adapters' in-process contract). tests/reliability (faults, hostile input, privacy, load,
# release) runs once, in the whole-suite leg.
SUITE_CORE = ["tests/core", "tests/sqlite", "tests/contract"]
# Compiled into each environment before its tests: site-packages and these source trees. The
# suites start hundreds of CLI, worker and helper processes, and where bytecode is not written
# (PYTHONDONTWRITEBYTECODE, set for every CLI subprocess) each would compile its imports anew.
COMPILED_SOURCES = ("packages", "tests")
_COMPILE = (
    "import compileall, sys, sysconfig\n"
    "for d in [sysconfig.get_paths()['purelib'], *sys.argv[1:]]:\n"
    "    compileall.compile_dir(d, quiet=2, workers=0)\n"
)
LEG_PYTEST = ["-q", "-p", "no:cacheprovider"]
#: The marker of tests that change a service every test shares (a PostgreSQL restart, a
#: broker-wide RabbitMQ setting): each leg runs them alone, after the legs that run side by side.
ALONE = "service_wide"
NO_TESTS_COLLECTED = 5  # pytest's exit status when every test was deselected
#: The internal command that runs the other legs in a process beside the whole suite.
SIDE_COMMAND = "legs-beside"
SIDE_LOG = os.path.join(ROOT, ".venv", "tsg-matrix-beside.log")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
_PROBE = (
    "import json, os, platform, sys; print(json.dumps([platform.python_implementation(), "
    "list(sys.version_info[:3]), os.path.realpath(sys.executable), "
    "sys.prefix != sys.base_prefix, bool(getattr(sys, '_is_gil_enabled', lambda: 1)())]))"
)


def compile_bytecode(python: str) -> None:
    """Write the bytecode of ``python``'s site-packages and of the workspace's sources (best
    effort: a file that does not compile is left to the import that needs it)."""
    subprocess.call([python, "-c", _COMPILE, *(os.path.join(ROOT, d) for d in COMPILED_SOURCES)],
                    cwd=ROOT, env=_env())


class Leg:
    """One row of the matrix: what ran (an interpreter and its pytest arguments), the closing
    line of each pytest run, pytest's short summary of a failed run, and the exit status."""

    def __init__(self, label: str, python: str = "", args: list[str] | None = None) -> None:
        self.label, self.python, self.args = label, python, list(args or [])
        self.status, self.closing, self.seconds = 1, "", 0.0
        self.failures: list[str] = []

    def line(self) -> str:
        verdict = "ok" if self.status == 0 else "FAILED"
        counts = self.closing or "no pytest summary"
        return f"matrix: {self.label}: {counts} [{verdict}, {self.seconds:.0f} s wall]"

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Leg:
        leg = cls(str(data["label"]))
        vars(leg).update(data)
        return leg


def _env(**extra: str) -> dict[str, str]:
    # TSG_UV: the uv this script uses (./.tools/bin/uv on a fresh machine, not on PATH), for
    # the tests that build the packages' wheels.
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", TSG_UV=uv(), **extra)
    env.pop("VIRTUAL_ENV", None)
    return env


def _pytest(leg: Leg, args: list[str], alone: bool = False) -> None:
    """Run pytest on the leg's interpreter (``leg.args``: what the leg runs, set once its
    environment is ready), streaming its output; add its closing (counts) line, its short
    failure summary and its exit status to the leg. ``alone``: the leg's ``service_wide``
    tests, of which a leg may have none."""
    started = time.monotonic()
    cmd = [leg.python, "-m", "pytest", *args]
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=_env())
    assert proc.stdout is not None
    closing, summary, in_summary = "", list[str](), False
    for line in proc.stdout:
        sys.stdout.write(line)
        text = line.strip().strip("=").strip()
        in_summary = in_summary or "short test summary info" in line
        if in_summary and len(summary) < 200:
            summary.append(line.rstrip())
        if _COUNT.search(text) and " in " in text:
            closing = text
    sys.stdout.flush()
    status = proc.wait()
    leg.seconds += time.monotonic() - started
    if alone and status == NO_TESTS_COLLECTED:
        return  # none of this leg's tests changes a shared service
    if status == 0 and not closing:
        status = 1  # a run whose result cannot be read has not proved anything
    leg.status = status if not alone else leg.status or status
    leg.closing = f"{leg.closing}; alone: {closing}" if alone else closing
    leg.failures += summary


def _beside(args: list[str]) -> list[str]:
    """The arguments of a leg's run beside the others: its ``service_wide`` tests left out."""
    return [*args, "-m", f"not {ALONE}"]


def _alone(args: list[str]) -> list[str]:
    return [*args, "-m", ALONE]


def _probe(exe: str) -> tuple[str, tuple[int, int, int], str, bool, bool] | None:
    try:
        out = subprocess.run([exe, "-I", "-c", _PROBE], capture_output=True, text=True,
                             timeout=20, check=False)
        impl, version, real, in_venv, gil = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return impl, (version[0], version[1], version[2]), real, in_venv, gil


def find_pythons() -> list[tuple[str, str]]:
    """Installed CPython >= 3.11 interpreters other than this one: (version, executable).

    Candidates come from ``uv python list --only-installed`` (downloads disabled), pyenv's
    versions directory and python3.* on PATH and in /usr/bin and /usr/local/bin; each is asked
    for its own version, and one executable per exact version is kept.
    """
    candidates: list[str] = []
    try:
        listed = subprocess.run([uv(), "python", "list", "--only-installed", "--output-format",
                                 "json"], capture_output=True, text=True, timeout=60,
                                check=False, env=_env())
        candidates += [item["path"] for item in json.loads(listed.stdout or "[]")]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        pass
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions", "*", "bin", "python3")))
    for directory in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/local/bin",
                      "/usr/bin"]:
        candidates += sorted(glob.glob(os.path.join(directory, "python3.[0-9]*")))
    own = _probe(sys.executable)
    own_real = own[2] if own else os.path.realpath(sys.executable)
    seen_real, seen_version = {own_real}, {own[1] if own else sys.version_info[:3]}
    found: list[tuple[str, str]] = []
    for exe in candidates:
        if exe.endswith(("-config", "m-config")) or not os.access(exe, os.X_OK):
            continue
        info = _probe(exe)
        if info is None:
            continue
        impl, version, real, in_venv, gil = info
        if impl != "CPython" or version < (3, 11) or in_venv or not gil or real in seen_real:
            continue
        seen_real.add(real)
        label = ".".join(map(str, version))
        if version in seen_version:
            print(f"matrix: CPython {label} at {real}: this exact version is already in the "
                  "matrix: not tested twice", flush=True)
            continue
        seen_version.add(version)
        found.append((label, real))
    return sorted(found, key=lambda item: tuple(int(p) for p in item[0].split(".")))


def _installed(python: str, dists: tuple[str, ...]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({d: m.version(d) "
            "for d in sys.argv[1:]}))")
    out = subprocess.run([python, "-c", code, *dists], capture_output=True, text=True,
                         check=False, env=_env())
    try:
        return dict(json.loads(out.stdout))
    except ValueError:
        return {}


def _release(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def declared_lower_bounds(adapter: str) -> dict[str, str]:
    """The ``>=`` bound of each framework dependency in the adapter's pyproject."""
    path = os.path.join(package_dir(adapter), "pyproject.toml")
    with open(path, "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    bounds = {}
    for dep in deps:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(.*)", dep)
        if not match or match.group(1) == "task-state-guard":
            continue
        lower = re.search(r">=\s*([0-9][^,;\s]*)", match.group(2))
        if lower:
            bounds[match.group(1).lower()] = lower.group(1)
    return bounds


#: Dev-group tools the adapter suites do not import, or whose versions come with the framework
#: (the framework's own resolution decides those). Django, FastAPI and PyYAML serve only
#: tests/examples, websockets (the DevTools client) only tests/web, which run in the
#: whole-suite leg.
_NOT_TEST_TOOLS = {"ruff", "mypy", "build", "redis", "pika", "django", "fastapi", "pyyaml",
                   "websockets"}


def _locked_test_tools(unpinned: frozenset[str] = frozenset()) -> list[str]:
    """The dev group's test-only packages (pytest, the SQL result backend's driver, the ASGI
    server...) pinned to uv.lock's versions: only the frameworks go to their lowest
    (``unpinned``: tools left out of the leg)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        dev = tomllib.load(handle)["dependency-groups"]["dev"]
    pins = []
    for req in dev:
        match = re.match(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?", req)
        if match and match.group(1).lower() not in _NOT_TEST_TOOLS | unpinned:
            name, extras = match.group(1), match.group(2) or ""
            pins.append(f"{name}{extras}=={_lock_version(name.lower())}")
    return pins


def _lock_version(name: str) -> str:
    with open(os.path.join(ROOT, "uv.lock"), "rb") as handle:
        lock = tomllib.load(handle)
    return str(next(p["version"] for p in lock["package"] if p["name"] == name))


def python_leg(version: str, exe: str) -> Leg:
    env_dir = os.path.join(ROOT, f".venv-py{version}")
    leg = Leg(f"CPython {version} ({exe}) tests/core + tests/sqlite + tests/contract on the "
              "SQLite backend, uv.lock versions", os.path.join(env_dir, "bin", "python"))
    if run([uv(), "sync", "--quiet", "--all-packages", "--frozen", "--python", exe],
           env=_env(UV_PROJECT_ENVIRONMENT=env_dir)) != 0:
        leg.closing = "uv sync failed"
        return leg
    compile_bytecode(leg.python)
    # The PostgreSQL half of the conformance suite runs once, in the whole-suite leg.
    leg.args = [*LEG_PYTEST, "--backend", "sqlite", *SUITE_CORE]
    _pytest(leg, _beside(leg.args))
    return leg


def _venv_version(env_dir: str) -> str | None:
    try:
        with open(os.path.join(env_dir, "pyvenv.cfg"), encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() in ("version_info", "version"):
                    return value.strip()
    except OSError:
        pass
    return None


def lowest_leg(adapter: str, version: str, exe: str) -> Leg:
    """The adapter's suite against the lowest framework versions its pyproject declares."""
    on_backend = adapter in ADAPTERS  # tests/postgres is PostgreSQL's own suite
    env_dir = os.path.join(ROOT, f".venv-lowest-{adapter}")
    python = os.path.join(env_dir, "bin", "python")
    leg = Leg(f"{adapter} lowest declared versions on CPython {version}, tests/{adapter}"
              + (f" on the {LOWEST_LEG_BACKEND} ledger" if on_backend else ""), python)
    if _venv_version(env_dir) != version or not os.path.exists(python):
        shutil.rmtree(env_dir, ignore_errors=True)
        if run([uv(), "venv", "--quiet", "--python", exe, env_dir], env=_env()) != 0:
            leg.closing = "uv venv failed"
            return leg
    wanted = os.path.join(env_dir, "requirements.in")
    pinned = os.path.join(env_dir, "requirements.txt")
    with open(wanted, "w", encoding="utf-8") as handle:  # test tools as locked, not lowest
        # Every adapter suite runs rows on a PostgreSQL ledger too: its backend package is
        # installed beside the adapter (its driver pinned to uv.lock's, as a test tool).
        backends = "".join(f"-e {package_dir(b)}\n" for b in BACKENDS if b != adapter)
        handle.write(f"-e {os.path.join(ROOT, 'packages', 'core')}\n"
                     f"-e {package_dir(adapter)}\n" + backends
                     + "".join(f"{req}\n" for req in _locked_test_tools(
                         frozenset(LEG_UNPINNED.get(adapter, ())))))
    if run([uv(), "pip", "compile", "--quiet", "--resolution", "lowest-direct", "--python",
            python, "--no-header", "--output-file", pinned, wanted], env=_env()) != 0 or run(
            [uv(), "pip", "sync", "--quiet", "--python", python, pinned], env=_env()) != 0:
        leg.closing = "the lowest declared versions did not install"
        return leg
    compile_bytecode(python)
    installed = _installed(python, FRAMEWORK_DISTS[adapter])
    leg.label += " (" + ", ".join(f"{k} {v}" for k, v in installed.items()) + ")"
    wrong = [f"{name} {installed.get(name)} is not the declared lower bound {bound}"
             for name, bound in declared_lower_bounds(adapter).items()
             if name not in installed or _release(installed[name]) != _release(bound)]
    backend = ["--backend", LOWEST_LEG_BACKEND] if on_backend else []
    leg.args = [*LEG_PYTEST, *backend, f"tests/{adapter}"]
    _pytest(leg, _beside(leg.args))
    if wrong:
        leg.status = 1
        leg.closing += "; " + "; ".join(wrong)
        leg.args = []  # its versions are wrong: nothing more runs in it
    return leg


def case_backend(name: str) -> str:
    """The ledger backend a test id names (``test_x[postgresql]``, ``test_y[redis-broker-sqlite-
    ledger]``), or ``""`` for a test that takes no ledger backend."""
    params = name.partition("[")[2]
    return next((b for b in ("postgresql", "sqlite") if b in params), "")


def newest_lines(junits: list[str], python: str) -> list[str]:
    """Per-adapter pass counts of the whole-suite run (uv.lock's, i.e. the newest, versions;
    its JUnit files), with the rows that passed on each ledger backend; an adapter's suite that
    passed no row on one of the backends fails its line (both must be proven here)."""
    import xml.etree.ElementTree as ET

    counts = {a: {"passed": 0, "failed": 0, "skipped": 0, "sqlite": 0, "postgresql": 0}
              for a in (*ADAPTERS, *BACKENDS)}
    cases = []
    for junit in junits:
        with contextlib.suppress(OSError, ET.ParseError):
            cases += list(ET.parse(junit).getroot().iter("testcase"))
    for case in cases:
        parts = case.get("classname", "").split(".")
        adapter = parts[1] if len(parts) > 1 and parts[0] == "tests" else ""
        if adapter not in counts:
            continue
        if case.find("skipped") is not None:
            counts[adapter]["skipped"] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            counts[adapter]["failed"] += 1
        else:
            counts[adapter]["passed"] += 1
            backend = case_backend(case.get("name", ""))
            if backend:
                counts[adapter][backend] += 1
    lines = []
    for adapter in (*ADAPTERS, *BACKENDS):
        installed = _installed(python, FRAMEWORK_DISTS[adapter])
        versions = ", ".join(f"{k} {v}" for k, v in installed.items())
        c = counts[adapter]
        both = adapter not in ADAPTERS or (c["sqlite"] and c["postgresql"])
        verdict = ("ok" if c["passed"] and not c["failed"] and not c["skipped"] and both
                   else "FAILED")
        rows = (f" (ledger rows passed: sqlite {c['sqlite']}, postgresql {c['postgresql']})"
                if adapter in ADAPTERS else "")
        lines.append(f"matrix: {adapter} newest (uv.lock: {versions}), tests/{adapter} in the "
                     f"whole suite: {c['passed']} passed, {c['failed']} failed, "
                     f"{c['skipped']} skipped{rows} [{verdict}]")
    return lines


def test(extra: list[str]) -> int:
    """ruff, mypy and the support matrix; non-zero when any check or leg fails."""
    started = time.monotonic()
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    add_sbin_to_path()
    ensure_services()
    ensure_prometheus()
    ensure_browser()
    checks = run([os.path.join(ROOT, ".venv", "bin", "ruff"), "check", "."])
    checks |= run([os.path.join(ROOT, ".venv", "bin", "mypy"), "--strict", "packages/core/src",
                   *(f"packages/adapter-{a}/src" for a in ("celery", "dramatiq", "langgraph")),
                   *(f"packages/backend-{b}/src" for b in BACKENDS)])
    compile_bytecode(venv_python)
    own = ".".join(map(str, sys.version_info[:3]))
    whole = Leg(f"CPython {own} ({os.path.realpath(sys.executable)}) whole suite, uv.lock "
                "versions", venv_python)
    junits = [os.path.join(ROOT, ".venv", f"tsg-matrix-junit{part}.xml")
              for part in ("", "-alone")]
    for junit in junits:
        if os.path.exists(junit):
            os.unlink(junit)  # never count a previous run's results
    legs: list[Leg] = []
    notes: list[str] = []
    if extra:
        notes.append("matrix: pytest arguments given: only the whole-suite leg runs")
        _pytest(whole, ["-q", f"--junitxml={junits[0]}", *extra])
    else:
        pythons = find_pythons()
        present = {".".join(v.split(".")[:2]) for v, _ in pythons}
        present.add(f"{sys.version_info[0]}.{sys.version_info[1]}")
        notes += [f"matrix: CPython {minor} not installed: not tested"
                  for minor in KNOWN_PYTHONS if minor not in present]
        for line in notes:
            print(line, flush=True)
        # The lowest framework versions run on the newest interpreter, the newest (uv.lock's)
        # on this one: each adapter is proven at both ends of both ranges.
        newest = max([*pythons, (own, os.path.realpath(sys.executable))],
                     key=lambda item: tuple(int(p) for p in item[0].split(".")))
        legs = matrix(whole, junits, pythons, newest)
    print("", flush=True)
    for line in notes:
        print(line)
    for leg in legs:
        print(leg.line())
    by_adapter = newest_lines(junits, venv_python) if not extra else []
    for line in by_adapter:
        print(line)
    print(whole.line())
    failed = [leg for leg in [*legs, whole] if leg.status != 0]
    failed_by_adapter = [line for line in by_adapter if line.endswith("[FAILED]")]
    for leg in failed:
        if leg.failures and leg is not whole:  # the whole suite's summary is printed above
            print(f"\nmatrix: what failed in: {leg.label} (its whole output: {SIDE_LOG})")
            print("\n".join(leg.failures))
    minutes = (time.monotonic() - started) / 60
    print(f"matrix: {len(legs) + 1 + len(by_adapter)} lines, "
          f"{len(failed) + len(failed_by_adapter)} failed; ruff and mypy "
          f"{'ok' if checks == 0 else 'FAILED'}; {minutes:.1f} min in all", flush=True)
    return 1 if checks or failed or failed_by_adapter else 0


def matrix(whole: Leg, junits: list[str], pythons: list[tuple[str, str]],
           newest: tuple[str, str]) -> list[Leg]:
    """Run the whole suite here while another process runs the other legs one after another
    (their output goes to ``SIDE_LOG``); then, with nothing beside them, each leg's
    ``service_wide`` tests. Returns the other legs."""
    plan = json.dumps({"pythons": pythons, "newest": newest})
    results = SIDE_LOG + ".json"
    if os.path.exists(results):
        os.unlink(results)
    print(f"matrix: the other legs run beside the whole suite; their output: {SIDE_LOG}",
          flush=True)
    with open(SIDE_LOG, "w", encoding="utf-8") as log:
        beside = subprocess.Popen([sys.executable, os.path.abspath(__file__), SIDE_COMMAND,
                                   plan, results], cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            _pytest(whole, _beside(["-q", f"--junitxml={junits[0]}"]))
            if beside.poll() is None:
                print("matrix: waiting for the legs beside the whole suite", flush=True)
            beside.wait()
        finally:
            if beside.poll() is None:
                beside.kill()
    try:
        with open(results, encoding="utf-8") as handle:
            legs = [Leg.from_json(item) for item in json.load(handle)]
    except (OSError, ValueError, KeyError):
        legs = [Leg(f"the legs beside the whole suite (exit status {beside.returncode}; "
                    f"see {SIDE_LOG})")]
    for leg in legs:
        print(leg.line(), flush=True)
    _pytest(whole, _alone(["-q", f"--junitxml={junits[1]}"]), alone=True)
    for leg in legs:
        if leg.args:
            _pytest(leg, _alone(leg.args), alone=True)
    return legs


def legs_beside(plan: str, results: str) -> int:
    """The other legs, one after another (run by ``matrix`` in a process of its own); their
    results are written to ``results`` as JSON."""
    spec = json.loads(plan)
    version, exe = spec["newest"]
    legs = []
    for python_version, python_exe in spec["pythons"]:
        legs.append(python_leg(python_version, python_exe))
        print(legs[-1].line(), flush=True)
    for adapter in (*ADAPTERS, *BACKENDS):
        legs.append(lowest_leg(adapter, version, exe))
        print(legs[-1].line(), flush=True)
    with open(results, "w", encoding="utf-8") as handle:
        json.dump([leg.to_json() for leg in legs], handle)
    return 0


def add_sbin_to_path() -> None:
    """Append the sbin directories to PATH when missing: Debian installs rabbitmq-server and
    rabbitmqctl there, and both this script and the Dramatiq tests call them by name."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    parts += [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin")
              if d not in parts and os.path.isdir(d)]
    os.environ["PATH"] = os.pathsep.join(p for p in parts if p)


def ensure_prometheus() -> None:
    """Put ``prometheus`` and ``promtool`` into ./.tools/prometheus unless they are on PATH:
    the binaries of Debian's ``prometheus`` package (``apt-get download``, then ``dpkg-deb -x``;
    nothing is installed, configured or started). The dashboard test runs a real Prometheus on
    127.0.0.1 against ``tsg metrics``; without the binaries it fails in CI."""
    if shutil.which("prometheus") or os.path.exists(os.path.join(PROMETHEUS_DIR, "prometheus")):
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        def download() -> bool:
            print("+ apt-get download prometheus", flush=True)
            return subprocess.call(["apt-get", "download", "prometheus"], cwd=tmp) == 0

        if not download() and not (run(["apt-get", "update"]) == 0 and download()):
            print("prometheus: could not download Debian's package (the dashboard test will "
                  "fail)", flush=True)
            return
        (deb,) = glob.glob(os.path.join(tmp, "prometheus_*.deb"))
        tree = os.path.join(tmp, "tree")
        if run(["dpkg-deb", "-x", deb, tree]) != 0:
            return
        os.makedirs(PROMETHEUS_DIR, exist_ok=True)
        for name in ("prometheus", "promtool"):
            shutil.copy2(os.path.join(tree, "usr", "bin", name), PROMETHEUS_DIR)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_services(names: tuple[str, ...] = ("redis", "rabbitmq", "postgresql")) -> None:
    """Start the named services (Redis, RabbitMQ, PostgreSQL) on 127.0.0.1 when they are not
    running."""
    if "redis" in names and not _listening(6379):
        run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379",
             "--save", "", "--appendonly", "no"])
        for _ in range(50):
            if _listening(6379):
                break
            time.sleep(0.2)
    if "rabbitmq" in names and not _listening(5672):
        run(["rabbitmq-server", "-detached"])
        for _ in range(10):  # the node needs a moment before rabbitmqctl can even reach it
            if run(["rabbitmqctl", "-q", "await_startup", "--timeout", "120"],
                   stderr=subprocess.DEVNULL) == 0:
                break
            time.sleep(2)
        for _ in range(100):
            if _listening(5672):
                break
            time.sleep(0.5)
    # The PostgreSQL ledger's tests and the SQL result backend of the Celery tests (trust
    # auth, database "test").
    if "postgresql" in names and not _listening(5432) and shutil.which("pg_ctlcluster"):
        run(["pg_ctlcluster", "15", "main", "start"])
        for _ in range(100):
            if _listening(5432):
                break
            time.sleep(0.2)
    services = (("redis", 6379), ("rabbitmq", 5672), ("postgresql", 5432))
    missing = [name for name, port in services if name in names and not _listening(port)]
    if missing:
        print("services not reachable: " + ", ".join(missing) + " (tests will fail)", flush=True)


#: Debian packages of the browser tests/web drives (headless, over the DevTools protocol).
BROWSER_PACKAGES = ("chromium", "chromium-driver")


def ensure_browser() -> None:
    """Install headless Chromium from the system's packages when it is missing (as root, with
    apt-get, as on the CI machine); without it tests/web fails, never skips."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print("chromium not found and not installable here (needs root and apt-get): "
              "tests/web will fail", flush=True)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", *BROWSER_PACKAGES]
    if run(install, env=env) != 0:  # a fresh machine may have no package lists yet
        run(["apt-get", "update"], env=env)
        run(install, env=env)
    if not shutil.which("chromium"):
        print("chromium could not be installed: tests/web will fail", flush=True)


def main() -> int:
    command = sys.argv[1] if len(sys.argv) > 1 else "help"
    extra = sys.argv[2:]
    if command == SIDE_COMMAND:  # internal: test's matrix runs it, after set-up
        return legs_beside(*extra)
    if command not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    sync()
    venv_bin = os.path.join(ROOT, ".venv", "bin")
    python = os.path.join(venv_bin, "python")
    if command == "setup":
        ensure_prometheus()
        return 0
    if command == "demo":
        ensure_services(("redis",))  # the demo keeps Celery's task results in Redis
        return run([python, "examples/celery_crash_demo.py", *extra])
    return test(extra)


if __name__ == "__main__":
    raise SystemExit(main())
