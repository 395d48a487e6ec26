"""The volume layout the Kubernetes manifests rely on, reproduced on a local directory.

The kubelet applies ``fsGroup`` by giving the volume's root the pod's group and adding group
read/write/execute and setgid: a provisioned volume's root becomes ``2775``, an ``emptyDir``'s
(created ``0777``) ``2777``. With ``fsGroupChangePolicy: Always`` it does the same to everything
below the root at every mount. These tests make those exact permission changes and run the
shipped entrypoint on them.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from deploy_helpers import ENTRYPOINT, base_env, json_lines

WORKER = "print('worker started', flush=True)"


def _fs_group_change(path: Path) -> None:
    """What the kubelet does to each file for fsGroup: group rw, and x + setgid on dirs."""
    st = path.lstat()
    os.chown(path, -1, os.getgid())
    mask = 0o660 | ((0o110 | stat.S_ISGID) if stat.S_ISDIR(st.st_mode) else 0)
    os.chmod(path, stat.S_IMODE(st.st_mode) | mask)


def _volume(tmp_path: Path, mode: int) -> Path:
    volume = tmp_path / "data"
    volume.mkdir()
    os.chmod(volume, mode)
    return volume


def _entrypoint(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), sys.executable, "-c", WORKER],
        env=base_env(TSG_DB=str(db)), capture_output=True, text=True, timeout=120,
    )


def _refused(done: subprocess.CompletedProcess[str], reason: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"error": "InvalidInput", "ok": False, "reason": reason}
    assert "worker started" not in done.stdout


def _started(done: subprocess.CompletedProcess[str], db: Path) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "worker started"
    assert [line["reconcile"]["dry_run"] for line in json_lines(done.stdout)] == [True, False]
    leaf = db.parent.stat()
    assert stat.S_IMODE(leaf.st_mode) == 0o700 and leaf.st_uid == os.geteuid()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_claim_with_fsgroup_takes_the_ledger_one_level_down(tmp_path: Path) -> None:
    """A provisioned volume's fsGroup root (group-shared, setgid, not world-writable)."""
    volume = _volume(tmp_path, 0o2775)
    _refused(_entrypoint(volume / "tasks.sqlite"), "directory_writable_by_others")
    db = volume / "tsg" / "tasks.sqlite"
    _started(_entrypoint(db), db)


def test_an_emptydir_root_must_be_made_sticky(tmp_path: Path) -> None:
    """An emptyDir's fsGroup root is world-writable: refused until the init container's
    ``chmod +t``; nothing is created before."""
    volume = _volume(tmp_path, 0o2777)
    db = volume / "tsg" / "tasks.sqlite"
    _refused(_entrypoint(db), "ancestor_writable_by_others")
    assert not db.parent.exists()
    os.chmod(volume, 0o2777 | stat.S_ISVTX)
    _started(_entrypoint(db), db)


def test_a_recursive_fsgroup_change_makes_the_ledger_refused(tmp_path: Path) -> None:
    """fsGroupChangePolicy "Always": the next start is refused, which is why the manifests
    set OnRootMismatch (the root already matches, so nothing below it is touched again)."""
    volume = _volume(tmp_path, 0o2775)
    db = volume / "tsg" / "tasks.sqlite"
    _started(_entrypoint(db), db)

    for directory, _dirs, files in os.walk(volume):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            _fs_group_change(Path(name))
    _refused(_entrypoint(db), "directory_writable_by_others")

    os.chmod(db.parent, 0o700)  # tightening the directory again is enough
    assert _entrypoint(db).returncode == 0
