"""Release artifacts: the core's wheel and sdist build byte-identically twice, and the wheel,
installed offline into a fresh venv, runs a real lifecycle through its installed CLI.

The adapters' part (their frameworks come from the package index) runs in the long run:
``python scripts/build_release.py && python scripts/release_smoke.py`` (see RELEASING.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import load_script


def test_core_builds_reproducibly_and_installs_offline(tmp_path: Path) -> None:
    build = load_script("build_release")
    smoke = load_script("release_smoke")
    dist = tmp_path / "dist"
    built = build.run(["core"], dist, epoch=1_700_000_000)
    print(json.dumps(built, sort_keys=True))
    assert built["ok"], built
    assert built["reproducible"] and built["mismatches"] == []
    assert sorted(a["file"] for a in built["artifacts"]) == [
        "task_state_guard-0.2.0-py3-none-any.whl", "task_state_guard-0.2.0.tar.gz"]
    result = smoke.run(dist, ["core"])
    print(json.dumps(result, sort_keys=True))
    assert result["ok"], result
    assert result["results"][0]["cli_steps"] >= 18


def test_artifact_inspection_is_not_vacuous(tmp_path: Path) -> None:
    import zipfile

    build = load_script("build_release")
    bad = tmp_path / "bad-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/__pycache__/x.cpython-311.pyc", b"")
        zf.writestr("other/__init__.py", "")
        zf.writestr("bad-0.1.0.dist-info/METADATA", "")
    problems = build.inspect_artifact(bad)
    assert "artifact holds bytecode, caches or tests" in problems
    assert "wheel holds more than one top-level package" in problems
    assert "wheel lacks py.typed" in problems
    assert "wheel lacks RECORD" in problems
