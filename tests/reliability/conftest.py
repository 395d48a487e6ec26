"""Shared helpers for the reliability suite."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` as a module (the scripts are not a package)."""
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tsg_script_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def private_dir(parent: Path | None = None) -> Path:
    """A fresh 0700 directory (tmp_path's ancestors are root-owned and private)."""
    path = Path(tempfile.mkdtemp(prefix="tsg-rel-", dir=parent))
    os.chmod(path, 0o700)
    return path


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ledger"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def db_path(ledger_dir: Path) -> Path:
    return ledger_dir / "tasks.sqlite"


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSG_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            user: int | None = None, cwd: str | None = None) -> tuple[int, str, str]:
    """Run the real CLI (``python -m task_state_guard``) in a subprocess."""
    kwargs: dict[str, object] = {}
    if user is not None:
        kwargs["user"] = user
        kwargs["group"] = user
        kwargs["extra_groups"] = []
    proc = subprocess.run(
        [sys.executable, "-m", "task_state_guard", *args],
        capture_output=True, text=True, env=env or cli_env(), timeout=timeout,
        stdin=subprocess.DEVNULL, cwd=cwd, check=False, **kwargs,  # type: ignore[arg-type]
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_json_line(stdout: str) -> dict[str, object]:
    """Assert the CLI contract's output shape and return the parsed object."""
    assert stdout.endswith("\n"), "output must end with a newline"
    lines = stdout.split("\n")
    assert len(lines) == 2 and lines[1] == "", "exactly one line expected"
    parsed = json.loads(lines[0])
    assert isinstance(parsed, dict)
    assert lines[0] == json.dumps(parsed, sort_keys=True, separators=(",", ":"))
    return parsed


def assert_cli_error(code: int, out: str, err: str, *, expected: tuple[str, ...] | None = None,
                     reason: str | None = None) -> str:
    """A bounded failure: exit 2, one fixed JSON error line, nothing on stderr. Without
    ``reason`` the line is exactly the specification's (no ``reason`` key); with it (the
    command ran with ``--explain``) it carries exactly that reason."""
    assert err == "", "nothing may be written to stderr"
    assert code == 2, f"expected exit 2, got {code}: {out!r}"
    parsed = one_json_line(out)
    keys = {"error", "ok"} if reason is None else {"error", "ok", "reason"}
    assert set(parsed) == keys and parsed["ok"] is False, parsed
    name = parsed["error"]
    assert name in ("InvalidInput", "TaskNotFound", "StateConflict")  # 0.1.0's categories
    if expected is not None:
        assert name in expected, name
    if reason is not None:
        assert parsed.get("reason") == reason, parsed
    return str(name)
