"""Where a real Dramatiq worker's ledger CPU goes: py-spy samples, sorted into categories.

Starts the guarded worker of ``dramatiq_overhead.py`` (the real ``dramatiq`` CLI, Redis, a
fresh SQLite ledger; ``--processes`` x ``--threads``), keeps it busy with no-op messages, and
samples every worker process with ``py-spy record --native`` (``--py-spy PATH``; idle threads
are not sampled) for ``--seconds``. Each sample's stack is put in one category:

- outside the ledger (no frame of a ``task_state_guard`` package): ``framework`` (Dramatiq,
  Redis client, the rest);
- inside the ledger, by its innermost frame: ``sqlite_step`` (executing a statement:
  ``sqlite3VdbeExec`` and the B-tree and pager work below it), ``sqlite_read_pages`` (pages
  read from the file or the WAL: ``pread``, ``walFindFrame``, a cold page cache after another
  connection's commit), ``sqlite_commit`` (``sqlite3VdbeHalt``/WAL frames written, the commit's
  syscalls), ``sqlite_begin`` (the lock and snapshot taken by ``BEGIN``), ``sqlite_prepare``
  (statement compilation), ``sqlite_other``; ``python_<module>`` for time in the ledger's Python
  code (the innermost Python frame's module), ``python_stdlib`` for the standard library
  (threading, contextlib, uuid, time) called from it, ``interpreter`` for CPython's own frames.

Samples of a blocked thread (the ledger's writer lock, SQLite's busy handler, the GIL, a
socket) are counted as ``wait_*`` apart: py-spy's native mode samples them as running; the
heartbeat thread between its beats is ``wait_heartbeat_idle``. Prints
one JSON object with sample counts and the shares of the ledger's CPU samples (the ledger's
share is over the worker processes' CPU samples; its CPU per message is
``dramatiq_overhead.py``'s ``ledger_cpu_ms``), and ``per_message_while_sampled``: the worker
processes' user and system CPU (ms) and context switches per message while sampled (py-spy's
pauses included). Not a test.

    .venv/bin/python benchmarks/worker_profile.py --py-spy /path/to/py-spy [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _bench  # noqa: E402

_STEP = ("sqlite3VdbeExec", "sqlite3BtreeInsert", "sqlite3BtreeIndexMoveto",
         "sqlite3BtreeTableMoveto", "sqlite3VdbeRecordCompare", "balance", "sqlite3BtreeNext",
         "sqlite3BtreeDelete", "moveToChild", "insertCell", "sqlite3CodeRowTrigger")
_READ = ("pread", "readDbPage", "walFindFrame", "sqlite3WalReadFrame", "getPageNormal",
         "sqlite3PagerGet", "getPageMMap", "unixRead", "pcache1Fetch", "sqlite3PcacheFetch")
_COMMIT = ("sqlite3VdbeHalt", "sqlite3BtreeCommitPhase", "sqlite3PagerCommitPhase",
           "walFrames", "sqlite3WalFrames", "pwrite", "unixWrite", "fdatasync", "fsync",
           "sqlite3WalEndWriteTransaction", "pagerWalFrames")
_BEGIN = ("sqlite3BtreeBeginTrans", "sqlite3PagerSharedLock", "walTryBeginRead",
          "sqlite3WalBeginReadTransaction", "walIndexReadHdr", "sqlite3WalBeginWriteTransaction",
          "pager_reset", "sqlite3PcacheClear", "unixLock", "fcntl")
_PREPARE = ("sqlite3Prepare", "sqlite3LockAndPrepare", "sqlite3RunParser", "yy_reduce")


def _frame_name(frame: str) -> tuple[str, str]:
    """(function, file) of one py-spy frame ``name (file:line)``."""
    name, _, rest = frame.partition(" (")
    return name.strip(), rest.rsplit(":", 1)[0].rstrip(")")


_WAITS = (("sqlite3InvokeBusyHandler", "wait_sqlite_busy"), ("take_gil", "wait_gil"),
          ("PyThread_acquire_lock", "wait_lock"), ("usleep", "wait_sleep"),
          ("nanosleep", "wait_sleep"), ("pthread_cond", "wait_lock"), ("sem_", "wait_lock"),
          ("epoll_wait", "wait_io"), ("poll", "wait_io"), ("select", "wait_io"),
          ("recv", "wait_io"), ("futex", "wait_lock"))


#: The heartbeat thread's loop (``task_state_guard/heartbeat.py``'s ``_run``): its samples
#: between beats wait on an ``Event`` like a lock would, but nothing holds them up.
_HEARTBEAT_LOOP = "task_state_guard/heartbeat.py"


def _wait(stack: list[str]) -> str | None:
    """The kind of wait a sample is in (a thread blocked, not using the CPU), if any."""
    for frame in reversed(stack[-8:]):
        name = _frame_name(frame)[0]
        if name.endswith((".py", ")")) or " " in name:
            continue
        for marker, kind in _WAITS:
            if marker in name:
                return kind
    return None


def categorise(stack: list[str]) -> str:
    """One sample's category (``stack``: outermost first). Waits (a lock, the GIL, SQLite's
    busy handler, sockets) are ``wait_*``: a blocked thread, not CPU."""
    files = [_frame_name(f)[1] for f in stack]
    in_ledger = any("task_state_guard" in f for f in files)
    wait = _wait(stack)
    if wait is not None:
        if any(name == "_run" and path.endswith(_HEARTBEAT_LOOP)
               for name, path in map(_frame_name, stack)):
            return "wait_heartbeat_idle"  # the heartbeat thread between beats: not a lock
        return f"{wait}{'' if in_ledger else '_outside_ledger'}"
    if not in_ledger:
        return "framework"
    # The innermost frame that is ours or SQLite's decides; native helpers below it count
    # towards what called them.
    for frame in reversed(stack):
        name, path = _frame_name(frame)
        for names, label in ((_READ, "sqlite_read_pages"), (_COMMIT, "sqlite_commit"),
                             (_BEGIN, "sqlite_begin"), (_PREPARE, "sqlite_prepare"),
                             (_STEP, "sqlite_step")):
            if any(name.startswith(n) for n in names):
                return label
        if "libsqlite3" in path or "_sqlite3" in path:
            continue
        if path.endswith(".py"):
            if "task_state_guard" in path:
                parts = path.split("/")
                tail = parts[-1][:-3]
                package = next((p for p in parts if p.startswith("task_state_guard")), "")
                return f"python_{package}.{tail}" if package else f"python_{tail}"
            return "python_stdlib"
    for frame in reversed(stack):
        if "libsqlite3" in _frame_name(frame)[1]:
            return "sqlite_other"
    return "interpreter"


def _proc_counters(pids: list[int]) -> dict[str, float]:
    """User and system CPU seconds and context switches of these processes (all threads)."""
    out = {"user_s": 0.0, "system_s": 0.0, "voluntary_switches": 0.0,
           "involuntary_switches": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            out["user_s"] += int(fields[11]) / tick
            out["system_s"] += int(fields[12]) / tick
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/status") as status:
                    for line in status:
                        if line.startswith("voluntary_ctxt_switches"):
                            out["voluntary_switches"] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            out["involuntary_switches"] += int(line.split()[1])
        except OSError:
            continue
    return out


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    data = stat.read()
            except OSError:
                continue
            if int(data[data.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(entry))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--py-spy", required=True, help="the py-spy executable")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain", action="store_true",
                        help="the worker without the middleware (the same counters, no ledger)")
    args = parser.parse_args()
    from dramatiq_overhead import Worker

    work = Path(tempfile.mkdtemp(prefix="tsg-worker-profile-"))
    db = str(work / "ledger" / "tasks.sqlite")
    worker = Worker(not args.plain, work, args.processes, args.threads, db)
    stop = threading.Event()
    sent = [0]
    feeding = threading.Lock()

    def processed() -> int:
        with feeding:
            return sent[0] - worker.pending()

    def feed() -> None:  # keep a backlog so the worker never idles
        while not stop.is_set():
            if worker.pending() < 2000:
                with feeding:
                    worker.enqueue(500)
                    sent[0] += 500
            else:
                time.sleep(0.05)

    try:
        worker.wait_ready()
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        time.sleep(2.0)  # past start-up
        workers = _children(worker.proc.pid)
        before = _proc_counters(workers)
        done_before = processed()
        samples: Counter[str] = Counter()
        raw_files = []
        spies = []
        for pid in workers:
            raw = work / f"profile-{pid}.txt"
            raw_files.append(raw)
            spies.append(subprocess.Popen(
                [args.py_spy, "record", "--pid", str(pid), "--native", "--format", "raw",
                 "--rate", str(args.rate), "--duration", str(int(args.seconds)),
                 "--output", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for spy in spies:
            spy.wait(args.seconds + 120)
        after = _proc_counters(workers)
        messages = max(1, processed() - done_before)
        stop.set()
        feeder.join(10)
        stacks = 0
        for raw in raw_files:
            if not raw.exists():
                continue
            for line in raw.read_text(errors="replace").splitlines():
                text, _, count = line.rpartition(" ")
                if not text or not count.isdigit():
                    continue
                frames = text.split(";")[1:]  # the first element names the thread
                samples[categorise(frames)] += int(count)
                stacks += int(count)
    finally:
        stop.set()
        worker.stop()
    ledger = {k: v for k, v in samples.items()
              if k != "framework" and not k.startswith("wait_")}
    ledger_total = sum(ledger.values()) or 1
    busy = sum(v for k, v in samples.items() if not k.startswith("wait_")) or 1
    report: dict[str, Any] = {
        "benchmark": "worker_profile", "guarded": not args.plain,
        "processes": args.processes, "threads": args.threads,
        "seconds": args.seconds, "rate": args.rate, "samples": stacks,
        "ledger_share_of_cpu_samples": round(ledger_total / busy, 3),
        "wait_samples": {k: v for k, v in samples.items() if k.startswith("wait_")},
        "ledger_cpu_categories_share": {k: round(v / ledger_total, 3)
                                    for k, v in sorted(ledger.items(), key=lambda kv: -kv[1])},
        "counts": dict(samples.most_common()), "profiles_dir": str(work),
        "messages_while_sampled": messages,
        "per_message_while_sampled": {k: round((after[k] - before[k]) / messages
                                               * (1000 if k.endswith("_s") else 1), 4)
                                      for k in after},
        **_bench.stamp(),
    }
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
