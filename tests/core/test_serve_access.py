"""Who may read `tsg serve`: a token by default even on loopback (made beside the ledger on the
first start, the sign-in address printed to the operator's terminal), the explicit opt-outs,
token files, weak tokens, sessions that expire and end, and the rate limit on wrong tokens."""

from __future__ import annotations

import http.client
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from core_helpers import assert_cli_error, cli_env, run_cli
from serve_helpers import Served
from task_state_guard import InvalidInput, Ledger
from task_state_guard.web import make_wsgi_app

TOKEN = "access-test-token-Qm4vR8"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _token_path(db: str, tmp_path: Path) -> Path:
    """Where the default token of ``db`` is (a PostgreSQL ledger's: the config directory
    these tests point ``XDG_CONFIG_HOME`` at)."""
    if db.startswith("postgres"):
        return tmp_path / "config" / "task-state-guard" / "serve-token"
    return Path(db + ".serve-token")


def _token(server: Served) -> str:
    assert server.token is not None
    return server.token


def _sign_in(server: Served, token: str, source: str | None = None,
             ) -> tuple[int, dict[str, str], str]:
    """``POST /login`` with ``token`` (from the loopback address ``source``)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30,
                                      source_address=None if source is None else (source, 0))
    try:
        conn.request("POST", "/login", body=f"token={token}&next=/stuck".encode(), headers=FORM)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_a_token_is_required_on_loopback_by_default(db: str, tmp_path: Path) -> None:
    """Without a token given, the first start makes one beside the ledger (0600) and says
    where it is (a log gets the path, never the token); nothing is read without it, not
    even on loopback (before: any local user read every id and name over loopback); the next
    start keeps it."""
    with Ledger(db) as led:
        task = led.create_task(name="app.private")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    path = _token_path(db, tmp_path)
    assert not path.exists()
    tokens = []
    for _start in range(2):
        server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", env=env, token=None)
        try:
            mode = path.stat().st_mode
            assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o600
            token = path.read_text().strip()
            tokens.append(token)
            for route in ("/", "/stuck", f"/job?id={task.id}", "/metrics"):
                status, headers, body = server.request(route)
                assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
                assert task.id not in body and "app.private" not in body, route
            bearer = {"Authorization": f"Bearer {token}"}
            assert "app.private" in server.request("/stuck", headers=bearer)[2]
            assert server.request("/metrics", headers=bearer)[0] == 200
        finally:
            code, out, err = server.stop()
        assert code == 0 and token not in out + err
        assert err == (f"tsg serve: sign in at http://127.0.0.1:{server.port}/login with the "
                       f"token in {path}\n")
    assert tokens[0] == tokens[1] and len(tokens[0]) == 43


def test_the_sign_in_address_goes_to_the_operators_terminal(db: str, tmp_path: Path) -> None:
    """On a terminal, the address with the token, as Jupyter prints it: opening it signs in
    (a session cookie) and leads to the overview, the token no longer in the address."""
    with Ledger(db) as led:
        led.create_task(name="app.private")
    server = Served(db, "--listen", "127.0.0.1:0", "--refresh", "0", token=None, tty=True,
                    env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        line = server.terminal_line()
        token = _token_path(db, tmp_path).read_text().strip()
        assert line == f"tsg serve: open http://127.0.0.1:{server.port}/login?token={token}\n"
        url = urlsplit(line.split()[-1])
        status, headers, _body = server.request(f"{url.path}?{url.query}")
        assert status == 303 and headers["Location"] == "/"
        session = {"Cookie": headers["Set-Cookie"].split(";")[0]}
        status, _headers, body = server.request("/stuck", headers=session)
        assert status == 200 and "app.private" in body and 'action="/logout"' in body
        status, _headers, body = server.request("/login?token=wrong-token-Zx81Lk3j")
        assert status == 401 and "not accepted" in body and "wrong-token" not in body
    finally:
        server.stop()


def test_no_token_is_an_explicit_choice_on_loopback_only(db: str, tmp_path: Path) -> None:
    with Ledger(db) as led:
        led.create_task(name="app.open")
    env = cli_env({"XDG_CONFIG_HOME": str(tmp_path / "config")})
    for listen in ("0.0.0.0:0", "[::]:0", "10.1.2.3:0"):
        refused = run_cli("--explain", "--db", db, "serve", "--listen", listen, "--no-token",
                          env=env)
        assert_cli_error(refused, "InvalidInput", reason="serve_token_required")
    both = run_cli("--explain", "--db", db, "serve", "--no-token",
                   env={**env, "TSG_SERVE_TOKEN": TOKEN})
    assert_cli_error(both, "InvalidInput", reason="serve_token_invalid")
    for option in ("--no-token", "--public-metrics", "--behind-https-proxy"):
        assert_cli_error(run_cli("--db", db, "metrics", option, env=env), "InvalidInput")
    server = Served(db, "--listen", "127.0.0.1:0", "--no-token",
                    env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        assert "app.open" in server.request("/stuck")[2]
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""
    assert not _token_path(db, tmp_path).exists()  # no token made when none is wanted


def test_public_metrics_opens_metrics_alone(db: str) -> None:
    """`--public-metrics`: a scraper without the token reads `/metrics` (aggregates, no ids);
    every page still wants it."""
    with Ledger(db) as led:
        task = led.create_task(name="app.counted")
    server = Served(db, "--listen", "127.0.0.1:0", "--public-metrics")
    try:
        status, _headers, body = server.request("/metrics", auth=False)
        assert status == 200 and 'name="app.counted"' in body and task.id not in body
        for route in ("/", "/stuck", "/job"):
            assert server.request(route, auth=False)[0] == 401
    finally:
        server.stop()


@pytest.mark.sqlite_only(reason="token files: file modes, a FIFO, symbolic links (the ledger's "
                                "backend plays no part)")
def test_token_files_must_be_regular_and_private(db: str, tmp_path: Path) -> None:
    """A FIFO is refused at once (before: the start hung reading it), so are a directory, a
    file others (or, the user's own, the group) may read, and one owned by another user; a
    symbolic link given with --token-file (as Kubernetes mounts a Secret) is followed, the
    default file beside the ledger never is."""
    with Ledger(db) as led:
        led.create_task()
    folder = tmp_path / "tokens"
    folder.mkdir(mode=0o700)
    fifo = folder / "fifo"
    os.mkfifo(fifo, 0o600)
    world = folder / "world"
    world.write_text(TOKEN + "\n")
    world.chmod(0o644)
    group = folder / "group"
    group.write_text(TOKEN + "\n")
    group.chmod(0o640)
    unsafe = [fifo, folder, world, group]
    if os.geteuid() == 0:  # a file of another user's (root may make one)
        other = folder / "other"
        other.write_text(TOKEN + "\n")
        other.chmod(0o600)
        os.chown(other, 65534, 65534)
        unsafe.append(other)
    for path in unsafe:
        result = run_cli("--explain", "--db", db, "serve", "--token-file", str(path),
                         timeout=30)
        assert_cli_error(result, "InvalidInput", reason="serve_token_file_unsafe")
        assert str(path) not in result.stdout + result.stderr
    private = folder / "private"
    private.write_text(TOKEN + "\n")
    private.chmod(0o600)
    link = folder / "link"
    link.symlink_to(private)
    server = Served(db, "--listen", "127.0.0.1:0", "--token-file", str(link), token=TOKEN)
    try:
        assert server.request("/stuck")[0] == 200
    finally:
        server.stop()
    Path(db + ".serve-token").symlink_to(private)
    beside = run_cli("--explain", "--db", db, "serve", "--listen", "127.0.0.1:0", timeout=30)
    assert_cli_error(beside, "InvalidInput", reason="serve_token_file_unsafe")


def test_weak_tokens_are_refused(db: str) -> None:
    """16 identical characters, a short pattern repeated, too few different characters: a
    fixed error (serve_token_weak), from the environment, a file and the WSGI app alike."""
    with Ledger(db) as led:
        led.create_task()
    for weak in ("a" * 16, "ab" * 8, "abcdef" * 3, "aaaabbbbccccdddd", "1234512345123451"):
        result = run_cli("--explain", "--db", db, "serve", "--listen", "127.0.0.1:0",
                         env=cli_env({"TSG_SERVE_TOKEN": weak}), timeout=30)
        assert_cli_error(result, "InvalidInput", reason="serve_token_weak")
        assert weak not in result.stdout + result.stderr
        with pytest.raises(InvalidInput) as raised:
            make_wsgi_app(db, token=weak)
        assert raised.value.reason == "serve_token_weak"
    with pytest.raises(InvalidInput) as raised:
        make_wsgi_app(db)  # neither a token nor an explicit no_token=True
    assert raised.value.reason == "serve_token_required"


def test_sessions_expire_and_end_at_sign_out(db: str) -> None:
    """The session cookie carries its issue time under the MAC: the server refuses it after
    the lifetime (Max-Age says the same), and after POST /logout (server-side: the cookie
    sent again is refused). Before: one static cookie, valid for ever."""
    with Ledger(db) as led:
        led.create_task(name="app.session")
    server = Served(db, "--listen", "127.0.0.1:0", "--session-lifetime", "3s")
    try:
        status, headers, _body = _sign_in(server, _token(server))
        assert status == 303
        cookie = headers["Set-Cookie"]
        assert "Max-Age=3;" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        session = {"Cookie": cookie.split(";")[0]}
        assert server.request("/stuck", headers=session)[0] == 200
        status, headers, _body = server.request("/logout", "POST", headers=session)
        assert status == 303 and headers["Location"] == "/login"
        assert "Max-Age=0" in headers["Set-Cookie"]
        assert server.request("/stuck", headers=session)[0] == 401  # ended on the server
        status, headers, _body = _sign_in(server, _token(server))
        session = {"Cookie": headers["Set-Cookie"].split(";")[0]}
        assert server.request("/stuck", headers=session)[0] == 200
        time.sleep(4.5)
        assert server.request("/stuck", headers=session)[0] == 401  # expired
    finally:
        server.stop()
    proxied = Served(db, "--listen", "127.0.0.1:0", "--behind-https-proxy")
    try:
        status, headers, _body = _sign_in(proxied, _token(proxied))
        assert status == 303 and "; Secure" in headers["Set-Cookie"]
    finally:
        proxied.stop()


def test_wrong_tokens_are_rate_limited(db: str) -> None:
    """Ten wrong tokens from one address, then 429 with Retry-After and a fixed body, for the
    right token too and for a bearer header from that address; another address still signs
    in; and wrong sign-ins from many addresses meet the shared limit (before: unlimited)."""
    with Ledger(db) as led:
        led.create_task()
    server = Served(db, "--listen", "127.0.0.1:0")
    try:
        for _attempt in range(10):
            assert _sign_in(server, "wrong-guess-Kq83mZp1")[0] == 401
        status, headers, body = _sign_in(server, "wrong-guess-Kq83mZp1")
        assert status == 429 and body == "too many wrong tokens: try again later\n"
        assert 1 <= int(headers["Retry-After"]) <= 10
        assert _sign_in(server, _token(server))[0] == 429
        assert server.request("/metrics")[0] == 429  # its bearer header: same client
        assert _sign_in(server, _token(server), source="127.0.0.2")[0] == 303
        statuses = [_sign_in(server, "wrong-guess-Kq83mZp1", source=f"127.0.0.{n}")[0]
                    for n in range(3, 8) for _attempt in range(7)]
        assert statuses[:19] == [401] * 19  # 10 + 19 of the 30 shared
        assert 429 in statuses[19:]
    finally:
        code, _out, err = server.stop()
    assert code == 0 and err == ""


def test_the_sign_in_page_never_repeats_the_query(db: str) -> None:
    """The sign-in form of an unauthenticated page keeps the page's path, never its query."""
    with Ledger(db) as led:
        led.create_task()
    server = Served(db, "--listen", "127.0.0.1:0")
    try:
        status, _headers, body = server.request("/stuck?name=echo-me-back&idle=x-y-z", auth=False)
        assert status == 401 and "echo-me-back" not in body and "x-y-z" not in body
        assert re.search(r'name="next" value="/stuck"', body)
    finally:
        server.stop()


def test_help_documents_the_access_options() -> None:
    done = subprocess.run([sys.executable, "-m", "task_state_guard", "serve", "--help"],
                          capture_output=True, text=True, env=cli_env(), check=True)
    for option in ("--no-token", "--public-metrics", "--session-lifetime",
                   "--behind-https-proxy", "--token-file"):
        assert option in done.stdout
