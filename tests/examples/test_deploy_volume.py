"""The volume layout the Kubernetes manifests rely on, reproduced on a local directory.

The kubelet applies ``fsGroup`` by giving the volume's root the pod's group, adding group
read/write/execute and setgid (an emptyDir is also world-writable); with
``fsGroupChangePolicy: Always`` it does the same to everything below it at every mount.
These tests make those exact permission changes and run the shipped entrypoint on them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import ENTRYPOINT, base_env, json_lines

WORKER = "print('worker started', flush=True)"


def _fs_group_change(path: Path) -> None:
    """What the kubelet does to each file for fsGroup: group rw, and x + setgid on dirs."""
    st = path.lstat()
    os.chown(path, -1, os.getgid())
    mask = 0o660 | ((0o110 | stat.S_ISGID) if stat.S_ISDIR(st.st_mode) else 0)
    os.chmod(path, stat.S_IMODE(st.st_mode) | mask)


def _entrypoint(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), sys.executable, "-c", WORKER],
        env=base_env(TSG_DB=str(db)), capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("root_mode", [0o2775, 0o2777], ids=["pvc", "emptydir"])
def test_fsgroup_volume_root_must_be_sticky(tmp_path: Path, root_mode: int) -> None:
    volume = tmp_path / "data"
    volume.mkdir()
    os.chmod(volume, root_mode)
    db = volume / "tsg" / "tasks.sqlite"

    refused = _entrypoint(db)
    assert refused.returncode == 2
    assert refused.stdout.strip() == '{"error":"InvalidInput","ok":false}'
    assert not (volume / "tsg").exists()  # nothing created, the worker never ran

    os.chmod(volume, root_mode | stat.S_ISVTX)  # the init container's `chmod +t /data`
    started = _entrypoint(db)
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.splitlines()[-1] == "worker started"
    assert [line["reconcile"]["dry_run"] for line in json_lines(started.stdout)] == [True, False]
    leaf = (volume / "tsg").stat()
    assert stat.S_IMODE(leaf.st_mode) == 0o700 and leaf.st_uid == os.geteuid()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_recursive_fsgroup_change_makes_the_ledger_refused(tmp_path: Path) -> None:
    """fsGroupChangePolicy "Always": the next start is refused, which is why the manifests
    set OnRootMismatch (the root already matches, so nothing below it is touched again)."""
    volume = tmp_path / "data"
    volume.mkdir()
    os.chmod(volume, 0o2775 | stat.S_ISVTX)
    db = volume / "tsg" / "tasks.sqlite"
    assert _entrypoint(db).returncode == 0

    for directory, _dirs, files in os.walk(volume):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            _fs_group_change(Path(name))
    refused = _entrypoint(db)
    assert refused.returncode == 2
    assert refused.stdout.strip() == '{"error":"InvalidInput","ok":false}'
    assert "worker started" not in refused.stdout

    os.chmod(volume / "tsg", 0o700)  # tightening the directory again is enough
    assert _entrypoint(db).returncode == 0
