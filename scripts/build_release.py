#!/usr/bin/env python3
"""Build wheel + sdist of every package reproducibly and prove it by building twice.

Each package under packages/ (core and the adapters) is built twice, into two separate
temporary directories, with the same SOURCE_DATE_EPOCH (default: the commit time of HEAD); every
artifact must be byte-identical between the two builds. The artifacts are also inspected: no
bytecode, caches or test files, the wheel holds only its import package and its .dist-info (whose
METADATA carries the project URLs and a README whose links are all absolute), and
the sdist holds only its pyproject, README and src/, and scripts/privacy_audit.py passes on each
extracted sdist (what is shipped, not just what is checked in). The first build is copied to
--out.

    python scripts/build_release.py [--out dist] [--packages core adapter-celery ...]
    python scripts/build_release.py --ref v0.2.0      # from the tag, not the working tree

Prints one JSON line. Uses ``uv build`` when uv is on PATH, else ``python -m build``; hatchling
is the backend either way (fetched into an isolated build environment from the package index).
"""

from __future__ import annotations

import argparse
import email
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["core", "adapter-celery", "adapter-dramatiq", "adapter-langgraph", "backend-postgres"]
FALLBACK_EPOCH = 315532800  # 1980-01-01, the earliest date a zip file can hold


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return FALLBACK_EPOCH


def build_command(package_dir: Path, out: Path) -> list[str]:
    if shutil.which("uv"):
        return ["uv", "build", "--quiet", "--sdist", "--wheel", "--out-dir", str(out),
                str(package_dir)]
    return [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out),
            str(package_dir)]


def extract_checked(tf: tarfile.TarFile, dest: Path) -> None:
    """Extract ``tf`` into ``dest``, refusing anything but plain files and directories.

    This is the fallback for interpreters whose tarfile has no extraction filters (CPython
    before 3.11.4, e.g. Debian 12's 3.11.2). A member with an absolute path, a ``..`` component,
    a target outside ``dest``, or that is a link, device or FIFO raises ValueError before any
    byte is written. Files get mode 0644 (0755 when the owner could execute), no
    set-id bits and no owner from the archive, like the ``data`` filter.
    """
    root = dest.resolve()
    members = tf.getmembers()
    for member in members:
        parts = PurePosixPath(member.name).parts
        if (member.name.startswith("/") or ".." in parts
                or not (member.isfile() or member.isdir())):
            raise ValueError("refusing an unsafe archive member")
        target = (root / member.name).resolve()
        if target != root and root not in target.parents:
            raise ValueError("refusing an unsafe archive member")
    for member in members:
        target = root / member.name
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        source = tf.extractfile(member)
        assert source is not None  # a regular file always has data
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        mode = 0o755 if member.mode & 0o100 else 0o644
        with source, os.fdopen(os.open(target, flags, mode), "wb") as handle:
            shutil.copyfileobj(source, handle)
        os.chmod(target, mode)
        os.utime(target, (member.mtime, member.mtime))


def extract(tf: tarfile.TarFile, dest: Path) -> None:
    """Extract safely: tarfile's ``data`` filter where it exists, else :func:`extract_checked`."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")
    else:
        extract_checked(tf, dest)


def export_ref(ref: str, dest: Path) -> Path:
    """Export ``packages/`` at a git ref (tag or commit) into ``dest``; return the new root."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "packages"],
                             capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    tar = dest / "src.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as tf:
        extract(tf, dest)
    tar.unlink()
    return dest


def working_tree_dirty() -> bool:
    proc = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "packages"],
                          capture_output=True, text=True, check=False)
    return proc.returncode != 0 or bool(proc.stdout.strip())


def build_once(packages: list[str], out: Path, epoch: int, root: Path = REPO) -> None:
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONDONTWRITEBYTECODE="1")
    for name in packages:
        proc = subprocess.run(build_command(root / "packages" / name, out), env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"build of {name} failed:\n{proc.stdout[-2000:]}"
                               f"{proc.stderr[-2000:]}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_FORBIDDEN = ("__pycache__", ".pyc", ".pyo", "/tests/", ".DS_Store", ".egg-info/", ".git/")


#: The project links every package's index page shows (``Project-URL`` in its metadata).
PROJECT_URLS = ("Homepage", "Documentation", "Source", "Changelog", "Issues")
_MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def page_problems(metadata: str) -> list[str]:
    """Problems of a package's index page: its ``Project-URL`` entries and its README's links
    (a package index shows the README without the repository around it, so a relative link
    breaks there)."""
    message = email.message_from_string(metadata)
    problems = []
    labels = [value.split(",", 1)[0].strip() for value in message.get_all("Project-URL") or []]
    if sorted(labels) != sorted(PROJECT_URLS):
        problems.append("metadata lacks the project URLs")
    body = message.get_payload()
    for target in _MARKDOWN_LINK.findall(body if isinstance(body, str) else ""):
        if not target.startswith(("https://", "#")):
            problems.append("README has a relative link")
    return sorted(set(problems))


def wheel_metadata(path: Path) -> str:
    """The ``METADATA`` file of a wheel."""
    with zipfile.ZipFile(path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name).decode("utf-8")


def inspect_artifact(path: Path) -> list[str]:
    """Return problems found in one artifact's member list (and a wheel's index page)."""
    problems = []
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        if any(n.endswith(".dist-info/METADATA") for n in names):
            problems += page_problems(wheel_metadata(path))
        dist_info = [n for n in names if ".dist-info/" in n]
        payload = [n for n in names if ".dist-info/" not in n]
        tops = {n.split("/", 1)[0] for n in payload}
        if len(tops) != 1 or not all("/" in n for n in payload):
            problems.append("wheel holds more than one top-level package")
        top = next(iter(tops), "")
        if f"{top}/py.typed" not in names:
            problems.append("wheel lacks py.typed")
        if not any(n.endswith("/RECORD") for n in dist_info):
            problems.append("wheel lacks RECORD")
    else:
        with tarfile.open(path) as tf:
            members = tf.getmembers()
        names = [m.name for m in members]
        root = names[0].split("/", 1)[0] if names else ""
        allowed = (f"{root}/pyproject.toml", f"{root}/README.md", f"{root}/PKG-INFO",
                   f"{root}/src/", f"{root}/LICENSE", f"{root}/.gitignore")
        for m in members:
            if m.issym() or m.islnk() or m.name.startswith("/") or ".." in m.name.split("/"):
                problems.append("sdist holds a link or an unsafe path")
            if not m.name.startswith(allowed):
                problems.append("sdist holds an unexpected file")
    for name in names:
        if any(f in "/" + name for f in _FORBIDDEN):
            problems.append("artifact holds bytecode, caches or tests")
    return sorted(set(problems))


def audit_sdist_file(sdist: Path, into: Path) -> list[str]:
    """Run the privacy audit on the extracted sdist: what is shipped, not what is checked in."""
    into.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        extract(tf, into)
    (root,) = list(into.iterdir())
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "privacy_audit.py"),
                           "--sdist", str(root)], capture_output=True, text=True, check=False)
    return [] if proc.returncode == 0 else ["privacy audit of the sdist failed"]


def run(packages: list[str] | None = None, out: Path | None = None,
        epoch: int | None = None, ref: str | None = None) -> dict[str, Any]:
    packages = packages or PACKAGES
    epoch = source_date_epoch() if epoch is None else epoch
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tsg-build-") as tmp:
        root = REPO if ref is None else export_ref(ref, Path(tmp) / "src")
        first, second = Path(tmp) / "a", Path(tmp) / "b"
        build_once(packages, first, epoch, root)
        build_once(packages, second, epoch, root)
        names_a = sorted(p.name for p in first.iterdir() if p.is_file() and p.name != ".gitignore")
        names_b = sorted(p.name for p in second.iterdir() if p.is_file()
                         and p.name != ".gitignore")
        artifacts, mismatches, problems = [], [], {}
        for name in names_a:
            digest = sha256(first / name)
            if name not in names_b or sha256(second / name) != digest:
                mismatches.append(name)
            found = inspect_artifact(first / name)
            if name.endswith(".tar.gz"):
                found += audit_sdist_file(first / name, Path(tmp) / "audit" / name)
            if found:
                problems[name] = found
            artifacts.append({"file": name, "sha256": digest,
                              "bytes": (first / name).stat().st_size})
        if names_a != names_b:
            mismatches.append("artifact sets differ")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for name in names_a:
                shutil.copy2(first / name, out / name)
    expected = 2 * len(packages)
    return {
        "ok": not mismatches and not problems and len(artifacts) == expected,
        "source_date_epoch": epoch,
        "source": f"git:{ref}" if ref else ("working-tree-dirty" if working_tree_dirty()
                                             else "working-tree-clean"),
        "packages": packages,
        "artifacts": artifacts,
        "reproducible": not mismatches,
        "mismatches": mismatches,
        "problems": problems,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Reproducible wheel + sdist builds.")
    parser.add_argument("--out", default=str(REPO / "dist"))
    parser.add_argument("--packages", nargs="*", choices=PACKAGES, default=PACKAGES)
    parser.add_argument("--ref", help="build packages/ as committed at this tag or commit")
    args = parser.parse_args(argv)
    result = run(args.packages, Path(args.out), ref=args.ref)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
