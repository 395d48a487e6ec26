"""``tsg metrics --textfile`` replaces only a previous textfile of its own, named ``*.prom``
(the node exporter's convention): never the ledger, its sidecars or owner lock directory, a
link or another program's file, which are left exactly as they were."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from core_helpers import Clock, assert_cli_error, assert_json_line, run_cli
from task_state_guard import Ledger

pytestmark = [pytest.mark.skipif(os.name != "posix", reason="POSIX files"),
              pytest.mark.sqlite_only(reason="the SQLite file, sidecars and owner locks beside it")]


def _state(path: Path) -> tuple[int, int, str | None]:
    st = os.lstat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
    return st.st_mode, st.st_ino, digest


def _ledger(directory: Path, tasks: int = 3000) -> Path:
    db = directory / "l.sqlite"
    with Ledger(str(db), clock=Clock()) as led, led.atomic():
        for _ in range(tasks):
            led.create_task()
    return db


def test_the_ledger_itself_is_never_replaced(tmp_path: Path) -> None:
    """``--db tf/l.sqlite metrics --textfile tf/l.sqlite`` once turned a 3,000-task ledger
    into Prometheus text; so could a sidecar's or the owner directory's name."""
    tf = tmp_path / "tf"
    db = _ledger(tf)
    with Ledger(str(db), clock=Clock()) as led:  # an owner lock directory beside it
        led.start_task(led.create_task().id)
        lock = next((tf / "l.sqlite-owners").iterdir())
        before = {p.name: _state(p) for p in (db, lock)}
        for target in (db, lock):
            result = run_cli("--explain", "--db", str(db), "metrics", "--textfile", str(target))
            if target.name.endswith(".prom"):
                reason = "textfile_is_ledger"
            else:
                reason = "textfile_name_invalid"
            assert_cli_error(result, "InvalidInput", reason=reason)
        assert {p.name: _state(p) for p in (db, lock)} == before
    # a ledger named like a textfile, and a *.prom name in its owner lock directory: refused
    # by what they are, whatever their content
    prom = tf / "ledger.prom"
    with Ledger(str(prom), clock=Clock()) as led:
        led.start_task(led.create_task().id)
        before_db = _state(prom)
        for target in (prom, Path(str(prom) + "-owners") / "x.prom"):
            result = run_cli("--explain", "--db", str(prom), "metrics", "--textfile",
                             str(target))
            assert_cli_error(result, "InvalidInput", reason="textfile_is_ledger")
        assert _state(prom) == before_db
        assert not (Path(str(prom) + "-owners") / "x.prom").exists()
    with Ledger(str(db), read_only=True) as ro:
        assert ro.doctor()["task_count"] == 3001


def test_only_a_previous_textfile_of_ours_is_replaced(tmp_path: Path) -> None:
    db = _ledger(tmp_path / "l", tasks=3)
    out = tmp_path / "collector"
    out.mkdir()
    other = out / "other.prom"
    other.write_text("# HELP node_thing Something else.\nnode_thing 1\n")
    (out / "link.prom").symlink_to(other)
    (out / "dir.prom").mkdir()
    (out / "empty.prom").write_bytes(b"")
    before = {p.name: _state(p) for p in out.iterdir()}
    for name in before:
        result = run_cli("--explain", "--db", str(db), "metrics", "--textfile", str(out / name))
        assert_cli_error(result, "StateConflict", reason="textfile_not_ours")
    assert {p.name: _state(p) for p in out.iterdir()} == before
    # a name the collector would never read
    assert_cli_error(run_cli("--explain", "--db", str(db), "metrics", "--textfile",
                             str(out / "tsg.txt")), "InvalidInput",
                     reason="textfile_name_invalid")
    assert not (out / "tsg.txt").exists()
    # a new textfile, then its own replacement
    ours = out / "tsg.prom"
    for _ in range(2):
        done = assert_json_line(run_cli("--db", str(db), "metrics", "--textfile", str(ours)))
        assert done["ok"] is True and ours.read_text().startswith("# HELP tsg_")
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, "tsg.prom"])
