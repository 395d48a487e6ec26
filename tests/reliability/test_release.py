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


def _tar_with(path: Path, *members: tuple[str, bytes | int, int]) -> Path:
    """Write a tar holding ``(name, data or tarfile type, mode)`` members."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tf:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid = mode, 1_600_000_000, 4242, 4242
            if isinstance(data, bytes):
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                info.type = bytes([data])
                if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info.linkname = "../outside"
                tf.addfile(info)
    return path


def test_checked_extraction_refuses_unsafe_members(tmp_path: Path) -> None:
    """The fallback used where tarfile has no ``data`` filter (CPython < 3.11.4)."""
    import tarfile

    build = load_script("build_release")
    hostile = {
        "absolute": ("/tmp/tsg-escape", b"x", 0o644),
        "dotdot": ("pkg/../../escape", b"x", 0o644),
        "symlink": ("pkg/link", tarfile.SYMTYPE[0], 0o777),
        "hardlink": ("pkg/hard", tarfile.LNKTYPE[0], 0o644),
        "device": ("pkg/dev", tarfile.CHRTYPE[0], 0o644),
        "fifo": ("pkg/fifo", tarfile.FIFOTYPE[0], 0o644),
    }
    for label, member in hostile.items():
        archive = _tar_with(tmp_path / f"{label}.tar", ("pkg/ok.txt", b"fine", 0o644), member)
        dest = tmp_path / f"out-{label}"
        dest.mkdir()
        with tarfile.open(archive) as tf:
            try:
                build.extract_checked(tf, dest)
            except ValueError as exc:
                assert str(exc) == "refusing an unsafe archive member"
            else:
                raise AssertionError(f"{label} member was extracted")
        assert list(dest.iterdir()) == [], label  # refused before any byte was written
    assert not Path("/tmp/tsg-escape").exists()
    assert not (tmp_path / "escape").exists()


def test_checked_extraction_matches_the_data_filter(tmp_path: Path) -> None:
    import stat
    import tarfile

    build = load_script("build_release")
    archive = _tar_with(tmp_path / "good.tar", ("pkg/", tarfile.DIRTYPE[0], 0o775),
                        ("pkg/src/a.py", b"print(1)\n", 0o664),
                        ("pkg/run.sh", b"#!/bin/sh\n", 0o6777))
    outputs = {}
    extractors = {"checked": build.extract_checked}
    if hasattr(tarfile, "data_filter"):
        extractors["filter"] = lambda tf, dest: tf.extractall(dest, filter="data")
    for label, extractor in extractors.items():
        dest = tmp_path / label
        dest.mkdir()
        with tarfile.open(archive) as tf:
            extractor(tf, dest)
        outputs[label] = {
            str(p.relative_to(dest)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode),
                                       int(p.stat().st_mtime))
            for p in sorted(dest.rglob("*")) if p.is_file()
        }
    assert outputs["checked"] == {
        "pkg/src/a.py": (b"print(1)\n", 0o644, 1_600_000_000),
        "pkg/run.sh": (b"#!/bin/sh\n", 0o755, 1_600_000_000),
    }
    if "filter" in outputs:
        assert outputs["filter"] == outputs["checked"]
