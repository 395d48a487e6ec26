"""Error reasons: every storage, location and usage error says which rule it broke, with a
fixed name from one closed vocabulary, never a path or a value; the README lists each one with
its fix. Group-shared (setgid) volumes take the database in a private subdirectory."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import pickle
import re
import shutil
import sqlite3
import stat
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from core_helpers import (
    Clock,
    assert_cli_error,
    assert_json_line,
    cli_env,
    run_cli,
    snapshot_tree,
)
from task_state_guard import (
    InvalidInput,
    Ledger,
    LedgerError,
    StateConflict,
    StorageError,
    UnsafeLocation,
    reasons,
)
from task_state_guard.cli import commands as cli

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "packages" / "core" / "src" / "task_state_guard"
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX storage contract")


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ----------------------------------------------------------------------------- vocabulary


def test_the_vocabulary_is_closed_fixed_names() -> None:
    assert reasons.ALL == reasons.USAGE | reasons.STORAGE
    assert not reasons.USAGE & reasons.STORAGE
    constants = {v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str)}
    assert constants == reasons.ALL  # every constant is in the vocabulary, and only those
    for name in reasons.ALL:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name), name


def test_a_reason_outside_the_vocabulary_is_refused_and_reasons_survive_pickling() -> None:
    with pytest.raises(ValueError):
        StorageError("x", reason="/srv/data is writable")
    for exc in (StorageError("m", reason=reasons.DISK_FULL),
                UnsafeLocation("m", reason=reasons.FILE_IS_SYMLINK),
                InvalidInput("m"), StateConflict("m")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and back.args == exc.args and back.reason == exc.reason
    assert InvalidInput("a value").reason is None  # task and value errors name no rule


def _raise_sites() -> list[tuple[str, int, str, bool]]:
    sites = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id in ("StorageError", "UnsafeLocation", "LedgerBusy")
                or (node.func.id == "InvalidInput" and path.name == "storage.py")
            ):
                named = any(k.arg == "reason" for k in node.keywords)
                sites.append((path.name, node.lineno, node.func.id, named))
    return sites


def test_every_storage_raise_site_names_a_reason() -> None:
    sites = _raise_sites()
    assert len(sites) > 40  # the scan sees the raise sites at all
    assert [s for s in sites if not s[3]] == []


def _readme_reasons() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Error reasons", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)


def test_the_readme_table_lists_exactly_the_vocabulary() -> None:
    listed = _readme_reasons()
    assert len(listed) == len(set(listed))
    assert set(listed) == reasons.ALL


# ----------------------------------------------------------------------------- CLI usage

TID = "6f1c1d4e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
SECRET = "s3cret-value"


@pytest.mark.sqlite_only(reason="usage errors on a SQLite path: nothing is created")
@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        ([], "missing_command"),
        (["stauts"], "unknown_command"),
        ([f"--{SECRET}", "init"], "unknown_option"),
        (["--db", "{db}", "init", f"--{SECRET}"], "unknown_option"),
        (["--db", "{db}", "get", TID, SECRET], "unexpected_argument"),
        (["--db", "{db}", "get"], "missing_argument"),
        (["--db", "{db}", "close", TID], "missing_argument"),
        (["--db"], "missing_value"),
        (["--db", "{db}", "close", TID, "--status"], "missing_value"),
        (["--db", "{db}", "status", "--format", SECRET], "invalid_value"),
        (["--db", "{db}", "start", SECRET], "invalid_value"),
        (["--db", "{db}", "create", "--timeout-seconds", SECRET], "invalid_value"),
        (["--db", "{db}", "close", TID, "--status", SECRET], "invalid_value"),
        (["--db", "{db}", "--busy-timeout-ms", "0", "init"], "invalid_value"),
        (["init"], "missing_database_path"),
    ],
)
def test_usage_errors_name_their_reason(tmp_path: Path, argv: list[str], reason: str) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    argv = [a.replace("{db}", db) for a in argv]
    # the specification's line by default; the reason with --explain or TSG_EXPLAIN=1
    assert_cli_error(run_cli(*argv), "InvalidInput")
    for result in (run_cli("--explain", *argv),
                   run_cli(*argv, env=cli_env({"TSG_EXPLAIN": "1"}))):
        assert_cli_error(result, "InvalidInput", reason=reason)
        assert SECRET not in result.stdout and str(tmp_path) not in result.stdout
    assert reason in reasons.USAGE
    assert not os.path.exists(tmp_path / "d")  # nothing was created


def test_a_bad_environment_value_is_an_invalid_value(db: str) -> None:
    env = cli_env({"TSG_ACTIVE_GRACE_SECONDS": SECRET})
    result = run_cli("--explain", "--db", db, "reconcile", env=env)
    assert_cli_error(result, "InvalidInput", reason="invalid_value")
    assert SECRET not in result.stdout


def test_task_errors_carry_no_reason(db: str) -> None:
    assert_json_line(run_cli("--db", db, "init"))
    assert assert_json_line(run_cli("--db", db, "get", TID)) == {
        "error": "TaskNotFound", "ok": False}


# ----------------------------------------------------------------------------- storage rules


def _volume(tmp_path: Path, volume_mode: int) -> Path:
    """A directory like a Kubernetes fsGroup volume: root-owned (when we are root), group-shared."""
    volume = tmp_path / "data"
    volume.mkdir()
    if os.geteuid() == 0:
        os.chown(volume, 0, 2000)
    os.chmod(volume, volume_mode)
    assert mode(volume) == volume_mode
    return volume


@pytest.mark.sqlite_only(reason="the SQLite path's directory modes")
@posix_only
def test_group_shared_volume_takes_the_database_in_a_private_subdirectory(
    tmp_path: Path,
) -> None:
    volume = _volume(tmp_path, 0o2775)
    # straight into the shared directory: refused, with the reason that says so
    result = run_cli("--explain", "--db", str(volume / "tasks.sqlite"), "init")
    assert_cli_error(result, "InvalidInput", reason="directory_writable_by_others")
    assert str(volume) not in result.stdout
    assert os.listdir(volume) == []
    with pytest.raises(UnsafeLocation) as info:
        Ledger(str(volume / "tasks.sqlite"))
    assert info.value.reason == "directory_writable_by_others"
    # a subdirectory tsg creates itself: private (0700, no setgid), and accepted
    db = volume / "tsg" / "tasks.sqlite"
    init = assert_json_line(run_cli("--db", str(db), "init"))
    assert init["ok"] is True and init["storage"]["database_mode"] == "0o600"
    assert mode(volume / "tsg") == 0o700 and mode(db) == 0o600
    tid = assert_json_line(run_cli("--db", str(db), "create"))["task"]["id"]
    assert assert_json_line(run_cli("--db", str(db), "start", tid))["task"]["status"] == "running"
    preview = assert_json_line(run_cli("--db", str(db), "reconcile", "--dry-run"))
    assert preview["reconcile"]["active_examined"] == 1
    assert assert_json_line(run_cli("--db", str(db), "status"))["ok"] is True
    with Ledger(str(db), clock=Clock()) as led:
        assert led.get_task(tid).status == "running"
    # A remount that re-opens the group bits on everything (fsGroupChangePolicy: Always) makes
    # the private directory shared again: refused until it is private again, reads included.
    os.chmod(volume / "tsg", 0o2770)
    os.chmod(db, 0o660)
    before = snapshot_tree(str(volume))
    for argv in (["reconcile", "--dry-run"], ["status"], ["init"]):
        assert_cli_error(run_cli("--explain", "--db", str(db), *argv), "InvalidInput",
                         reason="directory_writable_by_others")
    assert snapshot_tree(str(volume)) == before
    os.chmod(volume / "tsg", 0o700)
    assert_json_line(run_cli("--db", str(db), "init"))
    assert mode(db) == 0o600  # a writer tightens the file again
    assert assert_json_line(run_cli("--db", str(db), "doctor"))["healthy"] is True


@pytest.mark.sqlite_only(reason="the SQLite path's directory modes")
@posix_only
@pytest.mark.parametrize(
    ("volume_mode", "reason"),
    [
        (0o2775, None),  # group-shared volume (setgid): accepted above a private leaf
        (0o2770, None),
        (0o1777, None),  # sticky, like /tmp
        (0o3777, None),
        (0o0755, None),
        (0o0775, "ancestor_writable_by_others"),  # group-writable without setgid
        (0o2777, "ancestor_writable_by_others"),  # world-writable: setgid does not help
        (0o0777, "ancestor_writable_by_others"),
    ],
)
def test_ancestor_modes(tmp_path: Path, volume_mode: int, reason: str | None) -> None:
    volume = _volume(tmp_path, volume_mode)
    db = volume / "private" / "tasks.sqlite"
    result = run_cli("--explain", "--db", str(db), "init")
    if reason is None:
        assert assert_json_line(result)["ok"] is True
        assert mode(volume / "private") == 0o700
        with Ledger(str(db), read_only=True) as ro:
            assert ro.doctor()["healthy"] is True
    else:
        assert_cli_error(result, "InvalidInput", reason=reason)
        assert not os.path.exists(volume / "private")
        with pytest.raises(UnsafeLocation) as info:
            Ledger(str(db))
        assert info.value.reason == reason


@pytest.mark.sqlite_only(reason="the SQLite path's directory modes")
@posix_only
def test_a_setgid_leaf_is_still_refused_when_group_writable(tmp_path: Path) -> None:
    leaf = tmp_path / "leaf"
    leaf.mkdir()
    os.chmod(leaf, 0o2770)
    assert_cli_error(run_cli("--explain", "--db", str(leaf / "tasks.sqlite"), "init"),
                     "InvalidInput", reason="directory_writable_by_others")
    os.chmod(leaf, 0o2700)  # setgid alone opens nothing
    assert assert_json_line(run_cli("--db", str(leaf / "tasks.sqlite"), "init"))["ok"] is True


def _ledger(db: Path) -> None:
    with Ledger(str(db), clock=Clock()) as led:
        led.create_task()


@pytest.mark.sqlite_only(reason="the SQLite path's storage rules")
@posix_only
def test_storage_rules_through_the_cli(tmp_path: Path) -> None:
    """Each broken rule: its 0.1.0 category, its own reason, no path, nothing changed."""
    good = tmp_path / "good" / "tasks.sqlite"
    _ledger(good)
    cases: list[tuple[list[str], str, str]] = []

    link = good.parent / "link.sqlite"
    os.symlink(good, link)
    cases.append((["--db", str(link), "init"], "StateConflict", "file_is_symlink"))
    hard = tmp_path / "hard"
    hard.mkdir(mode=0o700)
    _ledger(hard / "tasks.sqlite")
    os.link(hard / "tasks.sqlite", hard / "alias.sqlite")
    cases.append((["--db", str(hard / "alias.sqlite"), "init"], "StateConflict",
                  "file_hard_linked"))
    fifo = tmp_path / "fifo"
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / "tasks.sqlite", 0o600)
    cases.append((["--db", str(fifo / "tasks.sqlite"), "init"], "StateConflict",
                  "file_not_regular"))
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    conn = sqlite3.connect(foreign / "tasks.sqlite")
    conn.execute("CREATE TABLE notes(body TEXT)")
    conn.commit()
    conn.close()
    os.chmod(foreign / "tasks.sqlite", 0o600)
    cases.append((["--db", str(foreign / "tasks.sqlite"), "init"], "StateConflict",
                  "foreign_schema"))
    garbage = tmp_path / "garbage"
    garbage.mkdir(mode=0o700)
    (garbage / "tasks.sqlite").write_bytes(b"not a database at all, " * 200)
    os.chmod(garbage / "tasks.sqlite", 0o600)
    cases.append((["--db", str(garbage / "tasks.sqlite"), "init"], "StateConflict",
                  "not_a_ledger"))
    cases.append((["--db", str(garbage / "tasks.sqlite"), "status"], "StateConflict",
                  "not_a_ledger"))
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    cases.append((["--db", str(empty / "tasks.sqlite"), "status"], "InvalidInput",
                  "database_missing"))
    cases.append((["--db", str(tmp_path / "nowhere" / "tasks.sqlite"), "doctor"],
                  "InvalidInput", "directory_missing"))
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    cases.append((["--db", str(blocker / "tasks.sqlite"), "init"], "StateConflict",
                  "directory_not_a_directory"))
    cases.append((["--db", str(blocker / "sub" / "tasks.sqlite"), "init"], "StateConflict",
                  "ancestor_not_a_directory"))
    loose = tmp_path / "loose"
    _ledger(loose / "tasks.sqlite")
    os.chmod(loose / "tasks.sqlite", 0o644)
    cases.append((["--db", str(loose / "tasks.sqlite"), "status"], "InvalidInput",
                  "file_not_private"))
    cases.append((["--db", "file:tasks.sqlite", "init"], "InvalidInput",
                  "invalid_database_path"))

    before = snapshot_tree(str(tmp_path))
    seen = set()
    for argv, error, reason in cases:
        result = run_cli("--explain", *argv)
        assert_cli_error(result, error, reason=reason)
        assert str(tmp_path) not in result.stdout
        seen.add(reason)
    assert snapshot_tree(str(tmp_path)) == before
    assert seen <= reasons.STORAGE and len(seen) == len(cases) - 1


@pytest.mark.sqlite_only(reason="the module's SQLite ledger helper; not yet on the backend matrix")
def test_api_errors_carry_their_reason(tmp_path: Path) -> None:
    db = str(tmp_path / "d" / "tasks.sqlite")
    _ledger(Path(db))
    with Ledger(db, read_only=True) as ro, pytest.raises(StorageError) as info:
        ro.create_task()
    assert info.value.reason == "read_only_ledger"
    led = Ledger(db)
    led.close()
    with pytest.raises(LedgerError) as caught:
        led.create_task()
    assert caught.value.reason == "ledger_closed"
    with pytest.raises(InvalidInput) as bad:
        Ledger("")
    assert bad.value.reason == "invalid_database_path"
    with pytest.raises(InvalidInput) as bad:
        Ledger(str(tmp_path / "none" / "tasks.sqlite"), read_only=True)
    assert bad.value.reason == "directory_missing"
    with Ledger(db) as ledger, pytest.raises(LedgerError) as missing:
        ledger.get_task(uuid.uuid4())
    assert missing.value.reason is None


# ----------------------------------------------------------------------------- as a pod would

POD_UID, PEER_UID, FS_GROUP = 1000, 1001, 2000


Step = list[str] | Callable[[], str]


def _as_user(uid: int, steps: list[Step]) -> list[object]:
    """Run steps in a forked child that has become ``uid`` with the supplementary group
    ``FS_GROUP``, like a pod's container; return what each gave. A step is a CLI argv (its exit
    code and JSON line, run with ``--explain``) or a function (its result).

    The child only calls code already imported here, so it needs no access to the interpreter's
    or the repository's files.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        out: list[object] = []
        try:
            os.close(read_end)
            os.setgroups([FS_GROUP])
            os.setgid(uid)
            os.setuid(uid)
            for step in steps:
                if callable(step):
                    out.append(step())
                    continue
                buffer = io.StringIO()
                with contextlib.redirect_stdout(buffer):
                    code = cli.main(["--explain", *step])
                out.append([code, json.loads(buffer.getvalue())])
        except BaseException as exc:
            out.append("crash:" + type(exc).__name__)
        finally:
            os.write(write_end, json.dumps(out).encode())
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return list(json.loads(data))


def _read(path: str) -> Callable[[], str]:
    def step() -> str:
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except PermissionError:
            return "PermissionError"
        return "read"
    return step


def _swap(directory: Path) -> Callable[[], str]:
    """Move ``directory`` away and put a directory of this user in its place."""
    def step() -> str:
        os.rename(directory, directory.with_name("moved"))
        directory.mkdir(mode=0o700)
        return "swapped"
    return step


@pytest.mark.sqlite_only(reason="a SQLite file on an fsGroup volume")
@posix_only
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_non_root_pod_on_an_fs_group_volume() -> None:
    """The Kubernetes shape for real: a root-owned 2775 volume of group ``fsGroup``, used by a
    non-root user in that group. A peer of the same group can move the private directory but
    never read it, and what it puts in its place is refused."""
    base = Path(tempfile.mkdtemp(prefix="tsg-pod-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        data = base / "data"
        data.mkdir()
        os.chown(data, 0, FS_GROUP)
        os.chmod(data, 0o2775)
        straight, private = str(data / "tasks.sqlite"), str(data / "tsg" / "tasks.sqlite")
        results = _as_user(POD_UID, [
            ["--db", straight, "init"],
            ["--db", private, "init"],
            ["--db", private, "create"],
            ["--db", private, "reconcile", "--dry-run"],
        ])
        assert results[0] == [2, {"error": "InvalidInput", "ok": False,
                                  "reason": "directory_owned_by_other_user"}]
        assert [r[0] for r in results[1:]] == [0, 0, 0]  # type: ignore[index]
        leaf = os.lstat(data / "tsg")
        assert (leaf.st_uid, leaf.st_gid, stat.S_IMODE(leaf.st_mode)) == (POD_UID, FS_GROUP,
                                                                         0o700)
        assert os.lstat(private).st_uid == POD_UID and mode(private) == 0o600
        assert os.listdir(data) == ["tsg"]
        # A peer in the same group: refused by the checks, and the kernel refuses it too; it
        # can move the private directory away (the volume is not sticky) and plant its own.
        peer = _as_user(PEER_UID, [["--db", private, "status"], _read(private),
                                   _swap(data / "tsg")])
        assert peer == [[2, {"error": "InvalidInput", "ok": False,
                             "reason": "directory_owned_by_other_user"}], "PermissionError",
                        "swapped"]
        assert os.lstat(data / "tsg").st_uid == PEER_UID
        # ... which the pod's next open refuses instead of using
        again = _as_user(POD_UID, [["--db", private, "create"]])
        assert again == [[2, {"error": "InvalidInput", "ok": False,
                              "reason": "directory_owned_by_other_user"}]]
        assert os.listdir(data / "tsg") == []
    finally:
        shutil.rmtree(base)
