"""The shipped Dockerfile, Kubernetes manifests and systemd units agree with each other, with
the example projects and with docs/deploy.md (loaded and checked, not just present)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import BIN, DEPLOY, EXAMPLES, REPO, base_env, free_port, tsg

K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
DOC = REPO / "docs" / "deploy.md"
CELERY_SETTINGS = EXAMPLES / "django_celery" / "proj" / "settings.py"


def _celery_time_limit() -> int:
    match = re.search(r"^CELERY_TASK_TIME_LIMIT = (\d+)", CELERY_SETTINGS.read_text(), re.M)
    assert match, "settings.py sets CELERY_TASK_TIME_LIMIT"
    return int(match.group(1))


def _dockerfile() -> dict[str, Any]:
    text = (DEPLOY / "Dockerfile").read_text()
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"\]', text, re.M)
    copy = re.search(r"^COPY --chmod=0755 examples/deploy/entrypoint\.sh (\S+)", text, re.M)
    user = re.search(r"^USER (\d+):(\d+)", text, re.M)
    db = re.search(r"^ENV TSG_DB=(\S+)", text, re.M)
    assert entry and copy and user and db
    return {"entrypoint": entry.group(1), "copied_to": copy.group(1),
            "uid": int(user.group(1)), "gid": int(user.group(2)), "db": db.group(1)}


def _workloads() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and {"apiVersion", "kind", "metadata"} <= doc.keys()
            if doc["kind"] in ("Deployment", "StatefulSet"):
                found.append((path.name, doc))
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _is_sidecar(container: dict[str, Any]) -> bool:
    """The ``tsg serve`` sidecar (every other container runs the entrypoint)."""
    return bool(container["command"][:2] == ["tsg", "serve"])


def _sidecar(workload: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = [c for c in workload["spec"]["template"]["spec"]["containers"]
                  if _is_sidecar(c)]
    return sidecar


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_dockerfile_installs_the_entrypoint_it_runs() -> None:
    docker = _dockerfile()
    assert docker["entrypoint"] == docker["copied_to"]
    assert docker["uid"] != 0
    assert Path(docker["db"]).parent.parent == Path("/data")  # a directory below the volume
    text = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?:--\S+ )*(\S+) ", text, re.M):
        if source != "dist/":  # built by scripts/build_release.py before the image
            assert (REPO / source).exists(), source
    assert "build_release.py" in text


@pytest.mark.parametrize("name", ["celery-statefulset.yaml", "shared-ledger-pod.yaml",
                                  "agent-statefulset.yaml"])
def test_manifest_wiring(name: str) -> None:
    docker = _dockerfile()
    workloads = [doc for file, doc in _workloads() if file == name]
    assert len(workloads) == 1
    workload = workloads[0]
    pod = workload["spec"]["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == docker["uid"] and security["runAsGroup"] == docker["gid"]
    # fsGroup only with OnRootMismatch: "Always" re-chmods the ledger's directory at each mount
    assert "fsGroup" in security
    assert security["fsGroupChangePolicy"] == "OnRootMismatch"

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {c["metadata"]["name"]: c for c in workload["spec"].get("volumeClaimTemplates", [])}
    ledger_mounts = set()
    for container in pod["containers"]:
        env = _env(container)
        if _is_sidecar(container):
            continue  # test_serve_sidecar
        assert container["command"] == [docker["entrypoint"]]
        assert container["args"], "the worker command goes in args"
        assert "securityContext" not in container or "runAsUser" not in container[
            "securityContext"], "every container sharing the ledger runs as the pod's uid"
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        db = Path(env["TSG_DB"])
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        mount = next(p for p in mounts if Path(p) in db.parents)
        # the ledger's own directory is below the mount point, never the mount point itself
        assert db.parent != Path(mount) and db.parent.parent == Path(mount)
        ledger_mounts.add((mounts[mount], mount, str(db)))
        # at a start either will do: the workers publish at boot the verdicts it records
        assert env["TSG_RECONCILE"] == "apply"
        if container["args"][0] == "celery":
            assert pod["terminationGracePeriodSeconds"] >= _celery_time_limit() + 30
    assert len(ledger_mounts) == 1, "containers of one pod share one ledger on one volume"
    (volume, mount, db_path), = ledger_mounts
    # the sidecar reads that same ledger, on the same volume, as the pod's uid
    sidecar = _sidecar(workload)
    assert _env(sidecar)["TSG_DB"] == db_path
    assert {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}[mount] == volume
    assert "runAsUser" not in sidecar["securityContext"]
    assert volume in volumes or volume in claims
    if volume in claims:
        assert workload["kind"] == "StatefulSet"
        assert claims[volume]["spec"]["accessModes"] == ["ReadWriteOnce"]
    else:
        assert "emptyDir" in volumes[volume]

    if volume in claims:  # a claim's fsGroup root (2775) is accepted as it is
        assert "initContainers" not in pod
        return
    # An emptyDir's root is world-writable: the init container makes it sticky.
    (init,) = pod["initContainers"]
    assert init["command"] == ["sh", "-c", f"chmod +t {mount}"]
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {volume: mount}
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["FOWNER"]}


@pytest.mark.parametrize("name", ["celery-statefulset.yaml", "shared-ledger-pod.yaml",
                                  "agent-statefulset.yaml"])
def test_serve_sidecar(name: str) -> None:
    """Each pod serves its ledger read-only with tsg serve: beyond loopback with a token file
    from a Secret, error lines with their reason (TSG_EXPLAIN), the port named for scraping."""
    (workload,) = [doc for file, doc in _workloads() if file == name]
    pod = workload["spec"]["template"]["spec"]
    sidecar = _sidecar(workload)
    argv = sidecar["command"] + sidecar.get("args", [])
    assert argv[:2] == ["tsg", "serve"]
    env = _env(sidecar)
    assert env["TSG_EXPLAIN"] == "1"
    host, port = _option(argv, "--listen").rsplit(":", 1)
    assert host == "0.0.0.0" and "--token-file" in argv  # beyond loopback only with a token
    token_dir = str(Path(_option(argv, "--token-file")).parent)
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts[token_dir].get("readOnly") is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = volumes[mounts[token_dir]["name"]]["secret"]
    assert secret["secretName"] == "tsg-serve-token"
    # root-owned Secret files reach the pod's uid through fsGroup: group-readable, no more
    assert secret["defaultMode"] == 0o440 and "fsGroup" in pod["securityContext"]
    assert [p["containerPort"] for p in sidecar["ports"] if p["name"] == "metrics"] == [int(port)]
    assert sidecar["securityContext"]["allowPrivilegeEscalation"] is False
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    if sidecar["securityContext"].get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts
    assert not any(m.get("name") == "data" and m.get("readOnly") for m in mounts.values())


def test_the_sidecar_command_serves_the_ledger(tmp_path: Path) -> None:
    """The sidecar's command line and environment, run for real (its port and token file
    moved into the test's reach): an error line with its reason before the ledger exists,
    then /metrics for the token only, and a clean stop on SIGTERM."""
    (workload,) = [doc for file, doc in _workloads() if file == "celery-statefulset.yaml"]
    sidecar = _sidecar(workload)
    argv = sidecar["command"] + sidecar.get("args", [])
    port = free_port()
    token = "t0ken-" + "x" * 26
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)  # private to the user serving (in the pod: root:fsGroup 0440)
    argv[argv.index("--listen") + 1] = f"0.0.0.0:{port}"
    argv[argv.index("--token-file") + 1] = str(token_file)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    env = base_env(**{**_env(sidecar), "TSG_DB": str(data / "tsg" / "tasks.sqlite")})
    argv[0] = str(Path(BIN) / "tsg")

    early = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert early.returncode == 2 and early.stderr == ""
    assert json.loads(early.stdout) == {"error": "InvalidInput", "ok": False,
                                        "reason": "directory_missing"}

    tsg(env["TSG_DB"], "init")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"listen": f"0.0.0.0:{port}", "ok": True}
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert "tsg_tasks" in response.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0


def _unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as sections of (key, value) lines; repeated keys are kept in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, raw
        current.append((key.strip(), value.strip()))
    return sections


def _values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in section if k == key]


@pytest.mark.parametrize("name", ["report-worker.service", "research-api.service"])
def test_systemd_unit(name: str, tmp_path: Path) -> None:
    path = SYSTEMD / name
    service = _unit(path)["Service"]
    (db,) = [v.split("=", 1)[1] for v in _values(service, "Environment")
             if v.startswith("TSG_DB=")]
    state = _values(service, "StateDirectory")
    assert state and Path(db).parent == Path("/var/lib") / state[0]
    assert _values(service, "StateDirectoryMode") == ["0700"]
    # tsg's error lines in the journal carry their reason
    assert "TSG_EXPLAIN=1" in _values(service, "Environment")
    pre = [v.split(None, 1)[1] for v in _values(service, "ExecStartPre")]
    assert all(v.split()[0].endswith("/tsg") for v in _values(service, "ExecStartPre"))
    (start,) = _values(service, "ExecStart")
    assert _values(service, "KillSignal") == ["SIGTERM"]
    assert _values(service, "KillMode") == ["mixed"]
    (stop,) = (int(v) for v in _values(service, "TimeoutStopSec"))
    # at a start either will do: the worker publishes at boot the verdicts this one records
    assert pre == ["init", "reconcile --dry-run", "reconcile"]
    if start.split()[0].endswith("/celery"):
        assert stop >= _celery_time_limit() + 30
    else:
        graceful = int(start.split("--timeout-graceful-shutdown ", 1)[1].split()[0])
        assert stop > graceful

    _verify_unit(path, start, tmp_path)


def _verify_unit(path: Path, start: str, tmp_path: Path) -> None:
    """``systemd-analyze verify``, with the commands pointed at this interpreter's scripts."""
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        return
    prefix = start.split()[0].rsplit("/", 1)[0]
    local = tmp_path / path.name
    local.write_text(path.read_text().replace(prefix, BIN))
    done = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True,
                          timeout=120)
    problems = [ln for ln in (done.stdout + done.stderr).splitlines() if path.name in ln]
    assert done.returncode == 0 and problems == [], done.stdout + done.stderr


def test_systemd_serve_unit(tmp_path: Path) -> None:
    """tsg serve beside the worker: the worker's user and ledger, loopback (its token made
    beside the ledger on the first start), TSG_EXPLAIN, nothing run before it (it never
    writes the ledger)."""
    service = _unit(SYSTEMD / "tsg-serve.service")["Service"]
    worker = _unit(SYSTEMD / "report-worker.service")["Service"]
    for key in ("User", "Group", "StateDirectory", "StateDirectoryMode"):
        assert _values(service, key) == _values(worker, key), key
    env = _values(service, "Environment")
    assert "TSG_EXPLAIN=1" in env
    assert [v for v in env if v.startswith("TSG_DB=")] == [
        v for v in _values(worker, "Environment") if v.startswith("TSG_DB=")]
    assert _values(service, "ExecStartPre") == []
    (start,) = _values(service, "ExecStart")
    argv = start.split()
    assert argv[0].endswith("/tsg") and argv[1] == "serve"
    assert _option(argv, "--listen").startswith("127.0.0.1:")
    assert _values(service, "Restart") == ["on-failure"]
    _verify_unit(SYSTEMD / "tsg-serve.service", start, tmp_path)


def test_the_doc_covers_every_shipped_file() -> None:
    text = DOC.read_text()
    shipped = [p for p in DEPLOY.rglob("*") if p.is_file()]
    assert len(shipped) >= 7
    for path in shipped:
        assert str(path.relative_to(REPO)) in text, path
    assert "examples/django_celery" in text and "examples/fastapi_langgraph" in text
    assert "docs/deploy.md" in (REPO / "README.md").read_text()
    tests = "".join(p.read_text() for p in (REPO / "tests" / "examples").glob("test_*.py"))
    for name in set(re.findall(r"`(test_[a-z0-9_]+)`", text)):
        assert f"def {name}(" in tests, name  # every test the doc cites exists
    for _file, workload in _workloads():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            assert _env(container)["TSG_DB"] in text
