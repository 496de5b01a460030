"""The server launcher against real processes: fail-fast start-up, teardown of the whole
process group, ports in use, the command line and environment it records."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from quantgate.harness import server as server_mod
from quantgate.harness.server import (ServerCommand, ServerCommandError, ServerStartError, attach, build_command, descendants,
                                      env_diff, free_port, group_members, listening_sockets)
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import FAKE_SERVER, REPO, fake_args, launch, listener_on, pid_alive

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def _fake(data: Path, *extra: str, port: int | None = None, env: dict[str, str] | None = None) -> ServerCommand:
    args = [*fake_args(data), *extra] + (["--port", str(port)] if port is not None else [])
    return build_command("vllm", "fake-model", args, env or {}, [sys.executable, str(FAKE_SERVER)])


def test_builtin_command_is_quantgate_serve_with_the_config_args() -> None:
    cmd = build_command("builtin", "/models/tiny", ["--linear-backend", "emulation", "--port=9001"], {"A": "1"})
    serve = cmd.argv.index("serve")
    assert cmd.argv[serve + 1:] == ["/models/tiny", "--linear-backend", "emulation", "--host", "127.0.0.1"]
    assert "--port=9001" not in cmd.argv and cmd.preferred_port == 9001  # the launcher owns the port
    assert cmd.with_port(1234)[-2:] == ["--port", "1234"]
    assert cmd.served_model == "/models/tiny"
    assert cmd.shell(1234).startswith("A=1 ")


def test_served_model_name_and_host_come_from_server_args() -> None:
    cmd = build_command("vllm", "org/model", ["--served-model-name", "short", "--host", "0.0.0.0"], {},
                        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"])
    assert cmd.served_model == "short"
    assert cmd.host == "127.0.0.1"  # listening everywhere, reached locally
    assert cmd.argv.count("--host") == 1


def test_missing_vllm_is_a_usage_error_naming_the_fix() -> None:
    with pytest.raises(ServerCommandError, match="vllm_command"):
        build_command("vllm", "org/model", [], {}, ["/nonexistent/bin/vllm", "serve"])


def test_env_diff_records_changes_and_redacts_secrets() -> None:
    diff = env_diff({"SAME": "x", "NEW": "1", "HF_TOKEN": "hf_secret"}, base={"SAME": "x"})
    assert diff == {"NEW": "1", "HF_TOKEN": "<redacted>"}


def test_launch_health_and_teardown_of_the_whole_group(tmp_path: Path, gsm8k_dir: Path) -> None:
    cmd = _fake(gsm8k_dir, "--spawn-child", "--ignore-sigterm", env={"QG_FAKE_MARK": "on"})
    server = launch(cmd, tmp_path / "server.log", startup_timeout_s=30)
    try:
        assert httpx.get(server.base_url + "/health").status_code == 200
        members = group_members(server.pgid)
        assert server.process.pid in members and len(members) >= 2  # the server and the child it spawned
        info = server.to_dict()
        assert info["env_diff"] == {"QG_FAKE_MARK": "on"} and info["port"] == server.port
        assert info["command"][-2:] == ["--port", str(server.port)]
    finally:
        started = time.monotonic()
        status = server.stop(grace_s=0.5)  # SIGTERM is ignored: escalation to SIGKILL
    assert status is not None and time.monotonic() - started < 10
    assert group_members(server.pgid) == []
    assert not any(pid_alive(pid) for pid in members)


@pytest.mark.parametrize("flag, logged_as, outside, reported", [
    # a worker that called setsid(): still a descendant, no longer in the group
    ("--spawn-setsid-child", "setsid child pid ", lambda pid, pgid: pid not in group_members(pgid),
     "left its process group (setsid), so the group's teardown missed them: pid(s) {pid}"),
    # a daemon that double-forked: its parent exited at once, so it is nobody's descendant; found
    # because quantgate is its subreaper
    ("--spawn-daemon", "daemon pid ", lambda pid, pgid: pid not in descendants(pgid),
     "(a daemon that double-forked, re-parented to quantgate): pid(s) {pid}"),
], ids=["setsid", "double-fork"])
def test_teardown_kills_processes_that_escaped_the_process_group(tmp_path: Path, gsm8k_dir: Path, flag: str,
                                                                 logged_as: str, outside, reported: str) -> None:
    server = launch(_fake(gsm8k_dir, flag), tmp_path / "server.log", startup_timeout_s=30)
    escaped = int((tmp_path / "server.log").read_text().split(logged_as)[1].split()[0])
    try:
        assert pid_alive(escaped) and outside(escaped, server.pgid)
        server.stop(grace_s=0.5)
        assert not Path(f"/proc/{escaped}").exists()  # killed and reaped: no zombie either
        assert server.to_dict()["killed_outside_group"] == [escaped]
        assert reported.format(pid=escaped) in (tmp_path / "server.log").read_text()
    finally:
        server.stop(grace_s=0.5)
        if pid_alive(escaped):  # the test failed: leave nothing behind
            os.kill(escaped, signal.SIGKILL)


def test_exit_during_startup_fails_within_seconds_not_at_the_timeout(tmp_path: Path,
                                                                     gsm8k_dir: Path) -> None:
    cmd = _fake(gsm8k_dir, "--exit-during-startup", "1.0")
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        launch(cmd, tmp_path / "server.log", startup_timeout_s=600)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 3.0, f"took {elapsed:.1f} s to notice the exit"
    assert info.value.exit_status == 1 and not info.value.refused_config  # may be transient: retryable
    assert "exited with status 1 during start-up" in str(info.value)
    assert "failed to load the model" in info.value.log_tail


def test_why_an_attempt_failed_is_read_from_the_end_of_its_log_not_the_whole_log(tmp_path: Path,
                                                                               gsm8k_dir: Path) -> None:
    """A vLLM log can be gigabytes: the failed attempt's log is searched in a bounded tail."""
    import tracemalloc

    log = tmp_path / "server.log"
    with open(log, "wb") as f:  # what came before this attempt (start() appends to the log)
        f.write((b"INFO loading weights " + b"." * 1000 + b"\n") * 24_000)  # 24 MB
    tracemalloc.start()
    try:
        with pytest.raises(ServerStartError) as info:
            launch(_fake(gsm8k_dir, "--strict-args", "--max-model-length", "4096"), log, startup_timeout_s=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "error: unrecognized arguments: --max-model-length 4096" in str(info.value)  # still found
    assert peak < 12 << 20, f"{peak / 2**20:.0f} MiB held to read a failed attempt's log"
    with open(log, "ab") as f:
        f.write(b"x" * (server_mod._ATTEMPT_LOG_BYTES + 10) + b"Address already in use\n")
    tail = server_mod._read_from(log, 0)
    assert len(tail) == server_mod._ATTEMPT_LOG_BYTES and tail.endswith("Address already in use\n")
    assert server_mod._read_from(log, log.stat().st_size - 4) == "use\n"


@pytest.mark.parametrize("extra,status,refusal", [
    (["--strict-args", "--max-model-length", "4096"], 2, "error: unrecognized arguments: --max-model-length 4096"),
    (["--validation-error"], 1, "1 validation error for ModelConfig: max_model_len: Input should be a valid integer"),
])
def test_a_server_refusing_its_arguments_is_a_refused_config_not_a_retry(tmp_path: Path, gsm8k_dir: Path,
                                                                        extra: list[str], status: int,
                                                                        refusal: str) -> None:
    with pytest.raises(ServerStartError) as info:
        launch(_fake(gsm8k_dir, *extra), tmp_path / "server.log", startup_timeout_s=30)
    assert info.value.refused_config and info.value.exit_status == status
    assert refusal in str(info.value) and "fix server_args" in str(info.value)


def test_a_config_check_that_failed_on_its_own_is_retryable_not_a_refusal() -> None:
    """vLLM wraps any exception of its config's checks (a hub read, a JSON file) as a value_error."""
    from quantgate.harness.server import refused_arguments

    wrapped = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
               "  Value error, Expecting value: line 1 column 1 (char 0) [type=value_error, input_value=ArgsKwargs(())]\n")
    assert refused_arguments(wrapped, 1) is None
    typed = wrapped.replace("type=value_error", "type=int_parsing")
    assert refused_arguments(typed, 1).startswith("ValidationError: 1 validation error for ModelConfig")


def test_model_ids_of_bodies_of_other_shapes_are_none() -> None:
    from quantgate.harness.server import model_ids

    assert model_ids([{"id": "x"}]) == [] and model_ids({"data": None}) == [] and model_ids({"data": [3]}) == []
    assert model_ids({"data": [{"id": "a"}, {"object": "model"}]}) == ["a"]


def test_a_port_answered_by_another_jobs_server_is_not_taken_for_ours(tmp_path: Path, gsm8k_dir: Path) -> None:
    """Two jobs with one fixed --port: the other binds it while ours loads. Its /health must not
    count as ours; ours, failing to bind, is relaunched on another port."""
    import subprocess
    import threading

    port = free_port("127.0.0.1")
    other = _fake(gsm8k_dir, port=port)
    foreign: list[subprocess.Popen] = []
    timer = threading.Timer(0.5, lambda: foreign.append(subprocess.Popen(other.with_port(port),
                                                                          stdout=subprocess.DEVNULL,
                                                                          stderr=subprocess.DEVNULL)))
    timer.start()
    try:
        server = launch(_fake(gsm8k_dir, "--startup-delay", "2", port=port), tmp_path / "server.log",
                        startup_timeout_s=60)
        try:
            assert server.port != port and listening_sockets(server.process.pid, server.port) == (1, 1)
            assert not server.foreign_listener
        finally:
            server.stop()
    finally:
        timer.join()
        for process in foreign:
            process.kill()
            process.wait()
    assert "already in use" in (tmp_path / "server.log").read_text().lower()


@pytest.mark.parametrize("other_run", [True, False], ids=["another-quantgate-run", "a-proxy"])
def test_a_listener_of_another_quantgate_run_is_never_taken_for_ours(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, other_run: bool) -> None:
    """Ours binds only after loading (a slow engine), so the port looked free and another job's
    server answers on it meanwhile. That server carries its runner's pid: ours is relaunched at
    once. A listener without it (a container's proxy) is still taken after the wait."""
    port = free_port("127.0.0.1")
    with listener_on(port, gsm8k_dir, monkeypatch, other_run=other_run):
        server = launch(_fake(gsm8k_dir, "--startup-delay", "2" if other_run else "30", port=port),
                        tmp_path / "server.log", startup_timeout_s=60)
        try:
            log = (tmp_path / "server.log").read_text()
            if other_run:
                assert server.port != port and not server.foreign_listener
                assert "answered by the server of another quantgate run (pid 1)" in log
            else:
                assert server.port == port and server.foreign_listener and "taken as its own (a proxy)" in log
        finally:
            server.stop()


def test_a_server_on_an_ipv6_host_is_launched_and_reached(tmp_path: Path, gsm8k_dir: Path) -> None:
    """`--host ::1` was a gaierror (the free-port probe bound an IPv4 socket) and an unbracketed URL."""
    if not socket.has_ipv6 or not server_mod.port_is_free(0, "::1"):
        pytest.skip("no IPv6 loopback here")
    command = _fake(gsm8k_dir, "--host", "::1")
    server = launch(command, tmp_path / "server.log", startup_timeout_s=30)
    try:
        assert server.base_url == f"http://[::1]:{server.port}"
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    finally:
        server.stop()
    assert build_command("vllm", "m", ["--host", "::"], {}, ["vllm", "serve"], require_executable=False).host == "::1"


def test_startup_timeout_stops_the_server(tmp_path: Path, gsm8k_dir: Path) -> None:
    cmd = _fake(gsm8k_dir, "--startup-delay", "60")
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="startup_max_wait_seconds") as info:
        launch(cmd, tmp_path / "server.log", startup_timeout_s=1.5)
    assert time.monotonic() - started < 1.5 + 5
    assert "it was stopped. Raise startup_max_wait_seconds if loading is legitimately slow" in str(info.value)
    assert info.value.startup_s >= 1.5
    server = server_mod.LaunchedServer(cmd, tmp_path / "again.log")  # result.json's server.startup_s too (was 0.0)
    with pytest.raises(ServerStartError):
        server.start(startup_timeout_s=1.5)
    assert server.to_dict()["startup_s"] >= 1.5
    pid = int((tmp_path / "server.log").read_text().split("# quantgate: pid ")[1].split()[0])
    assert group_members(pid) == [] and not pid_alive(pid)


def test_preferred_port_in_use_gets_another_port(tmp_path: Path, gsm8k_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        server = launch(_fake(gsm8k_dir, port=taken), tmp_path / "server.log", startup_timeout_s=30)
        try:
            assert server.port != taken
            assert server.ports_tried == [taken, server.port]
            assert f"port {taken} is in use" in (tmp_path / "server.log").read_text()
        finally:
            server.stop()


@pytest.mark.parametrize("said", [
    "OSError: [Errno 98] Address already in use",
    "Error: listen EADDRINUSE 127.0.0.1:8000",  # the errno's name alone, in upper case
], ids=["python", "errno-name"])
def test_an_address_in_use_at_every_launch_is_named_with_the_ports_tried(tmp_path: Path, said: str) -> None:
    """A port the server opens besides --port (vLLM's own) taken by another process fails every
    relaunch; the reason said only "see the log's tail"."""
    dies = [sys.executable, "-c", f"print({said!r}); raise SystemExit(1)"]
    command = ServerCommand(argv=dies, env={}, served_model="m", preferred_port=None, host="127.0.0.1", api_key=None)
    server = server_mod.LaunchedServer(command, tmp_path / "server.log")
    with pytest.raises(ServerStartError) as info:
        server.start(startup_timeout_s=30)
    message = str(info.value)
    assert f"an address was in use on each of the {server_mod.PORT_ATTEMPTS} launches" in message, message
    assert len(server.ports_tried) == server_mod.PORT_ATTEMPTS and f"ports {server.ports_tried}" in message
    assert "stop the other server" in message and not info.value.refused_config


_SHARES_ITS_PORT = """
import http.server, socket, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
class Server(http.server.HTTPServer):
    def server_bind(self):  # as vLLM binds: another listener may share the port
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
print("listening, sharing the port", flush=True)
Server(("127.0.0.1", int(sys.argv[-1])), Ok).serve_forever()
"""


def test_a_port_another_listener_shares_at_every_launch_is_an_error_naming_the_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours is healthy, but another job's server listens beside it (SO_REUSEPORT) and would take a
    share of the requests: relaunched, and after the last attempt an error that says to drop the
    fixed --port, with nothing of ours left running."""
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    class Sharing(http.server.ThreadingHTTPServer):
        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    other = Sharing(("127.0.0.1", 0), Ok)
    port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": port)  # each attempt meets it
    log = tmp_path / "server.log"
    server = server_mod.LaunchedServer(ServerCommand(argv=[sys.executable, "-c", _SHARES_ITS_PORT], env={},
                                                     served_model="m"), log)
    try:
        with pytest.raises(ServerStartError) as info:
            server.start(startup_timeout_s=30)
    finally:
        other.shutdown()
        other.server_close()
    assert server.ports_tried == [port] * server_mod.PORT_ATTEMPTS
    assert f"other processes listened on each port tried ({server.ports_tried})" in str(info.value)
    assert "drop it" in str(info.value) and info.value.exit_status is None
    text = log.read_text()
    assert text.count(f"another process listens on port {port} too; relaunching") == server_mod.PORT_ATTEMPTS
    assert text.splitlines().count("listening, sharing the port") == server_mod.PORT_ATTEMPTS  # each got there
    assert group_members(server.pgid) == [] and not pid_alive(server.pgid)


def test_lost_port_race_relaunches_on_another_port(tmp_path: Path, gsm8k_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The port was free when chosen and taken before the server bound it: the server exits
    with EADDRINUSE, and the launcher starts it again elsewhere."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        real_free_port = server_mod.free_port
        ports = iter([taken])
        monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": next(ports, None) or real_free_port())
        server = launch(_fake(gsm8k_dir), tmp_path / "server.log", startup_timeout_s=30)
        try:
            assert server.ports_tried[0] == taken and server.port != taken
            assert "Address already in use" in (tmp_path / "server.log").read_text()
        finally:
            server.stop()


def test_a_relaunch_after_a_lost_port_race_keeps_the_api_key_out_and_the_new_attempts_output_in(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stop redacts the key from server.log while start() still holds it open for the next
    attempt: the redaction must keep the file (its inode), or attempt 2 writes to a deleted one."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        real_free_port = server_mod.free_port
        ports = iter([taken])
        monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": next(ports, None) or real_free_port())
        log = tmp_path / "server.log"
        server = launch(_fake(gsm8k_dir, "--api-key", "s3cret-key"), log, startup_timeout_s=30)
        try:
            assert server.ports_tried[0] == taken and server.port != taken
            running = log.read_text()
            assert f"ready on 127.0.0.1:{server.port}" in running and "launch attempt 2" in running
            assert "s3cret-key" not in running.split("launch attempt 2")[0]  # attempt 1's, redacted already
        finally:
            server.stop()
    text = log.read_text()
    assert "Address already in use" in text and f"ready on 127.0.0.1:{server.port}" in text
    assert "s3cret-key" not in text and "'api_key': '<redacted>'" in text


def test_the_api_key_is_redacted_across_chunk_boundaries_and_a_full_disk_empties_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    data = b"".join(b"line %d key=abcdef\n" % i for i in range(50)) + b"abc"
    for chunk in (1, 2, 5, 7, 64, 1 << 20):  # a key split between chunks at every offset
        monkeypatch.setattr(server_mod, "_CHUNK", chunk)
        out = io.BytesIO()
        assert server_mod._copy_redacted(io.BytesIO(data), out, b"abcdef") == 50
        assert out.getvalue() == data.replace(b"abcdef", b"<redacted>")
    log = tmp_path / "server.log"
    log.write_text("INFO non-default args: {'api_key': 'abcdef'}\n")
    inode = log.stat().st_ino
    server_mod._redact_in_place(log, "abcdef")
    assert log.read_text() == "INFO non-default args: {'api_key': '<redacted>'}\n" and log.stat().st_ino == inode

    server = server_mod.LaunchedServer(_fake(tmp_path, "--api-key", "abcdef"), log)
    server.process = SimpleNamespace(pid=2**22 + 1, returncode=0, poll=lambda: 0, wait=lambda timeout: 0)
    log.write_text("INFO non-default args: {'api_key': 'abcdef'}\n")

    def disk_full(path: Path, secret: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(server_mod, "_redact_in_place", disk_full)
    server.stop()
    assert "abcdef" not in log.read_text() and "so it was emptied" in log.read_text()
    assert log.stat().st_ino == inode


def test_attach_finds_the_served_model(tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(_fake(gsm8k_dir, "--served-model-name", "served-x"), tmp_path / "server.log",
                    startup_timeout_s=30)
    try:
        attached = attach(server.base_url + "/v1", "not-the-name")
        assert attached.served_model == "served-x" and attached.base_url == server.base_url
        assert attached.stop() is None and attached.poll() is None
    finally:
        server.stop()
    with pytest.raises(ServerStartError, match="did not answer"):
        attach(server.base_url, None, timeout_s=1)



def test_a_launched_server_serving_another_model_name_is_a_refused_config(tmp_path: Path, gsm8k_dir: Path) -> None:
    with pytest.raises(ServerStartError) as info:
        launch(_fake(gsm8k_dir, "--serve-as", "some/other-model"), tmp_path / "server.log", startup_timeout_s=30)
    assert info.value.refused_config
    assert "serves 'some/other-model', not 'fake-model'" in str(info.value)
    assert "--served-model-name fake-model" in str(info.value)
    pid = int((tmp_path / "server.log").read_text().split("# quantgate: pid ")[1].split()[0])
    assert group_members(pid) == [] and not pid_alive(pid)
    quiet = launch(_fake(gsm8k_dir, "--no-models-endpoint"), tmp_path / "quiet.log", startup_timeout_s=30)
    quiet.stop()  # no /v1/models answer: nothing to check, the evaluation will tell


@pytest.mark.parametrize("args,env", [
    (["--api-key", "k1"], {}), (["--api-key=k1"], {}), (["--api_key", "k1"], {}), (["--api_key=k1"], {}),
    ([], {"VLLM_API_KEY": "k1"}),
])
def test_the_api_key_is_found_in_every_spelling_and_never_printed(args: list[str], env: dict) -> None:
    from quantgate.harness.server import redact_api_key

    command = build_command("builtin", "m", ["--served_model_name", "served", *args], env)
    assert command.api_key == "k1" and command.served_model == "served"
    assert "k1" not in command.shell(8000, redact=True) and "k1" not in " ".join(redact_api_key(command.argv))


def test_a_port_another_process_also_listens_on_is_not_held_alone() -> None:
    """vLLM binds with SO_REUSEPORT: another job's server can listen beside ours and take half of
    our requests."""
    import socket as socket_module
    import subprocess

    ours = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
        "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(ours.stdout.readline())
        assert listening_sockets(ours.pid, port) == (1, 1)
        with socket_module.socket() as other:
            other.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_REUSEPORT, 1)
            other.bind(("127.0.0.1", port))
            other.listen()
            assert listening_sockets(ours.pid, port) == (1, 2)
    finally:
        ours.kill()
        ours.wait()


_RUNNER_SCRIPT = """
import sys, time
from pathlib import Path
from quantgate.harness import server as server_mod
from tests.harness.runner_fixtures import launch
from tests.harness.test_server import _fake
server_mod.WATCHDOG_GRACE_S = 1.0
server = launch(_fake(Path(sys.argv[1]), "--ignore-sigterm"), Path(sys.argv[2]), startup_timeout_s=30)
print(server.pgid, flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_runners_server_that_ignores_sigterm_is_killed_by_its_watchdog(tmp_path: Path,
                                                                                   gsm8k_dir: Path) -> None:
    """The runner runs no code when SIGKILLed (the OOM killer, a hard CI kill): the server's
    SIGTERM from PR_SET_PDEATHSIG is ignored, and only the watchdog is left to escalate."""
    import subprocess

    runner = subprocess.Popen([sys.executable, "-c", _RUNNER_SCRIPT, str(gsm8k_dir), str(tmp_path / "server.log")],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    pgid = int(runner.stdout.readline())
    try:
        assert group_members(pgid)
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 15.0  # SIGTERM, the 1 s grace, SIGKILL, within a poll or two
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(pgid) == [], "the server outlived its runner"
    finally:
        for pid in group_members(pgid):
            os.kill(pid, signal.SIGKILL)


_STRAY_RUNNER_SCRIPT = """
import sys, time
from pathlib import Path
from quantgate.harness import server as server_mod
from tests.harness.runner_fixtures import launch
from tests.harness.test_server import _fake
server_mod.WATCHDOG_GRACE_S = 1.0
server = launch(_fake(Path(sys.argv[1]), sys.argv[3]), Path(sys.argv[2]), startup_timeout_s=30)
print(server.pgid, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("flag, said", [("--spawn-setsid-child", "setsid child pid"), ("--spawn-daemon", "daemon pid")])
def test_a_sigkilled_runners_server_leaves_nothing_it_started_outside_its_group(tmp_path: Path, gsm8k_dir: Path,
                                                                                flag: str, said: str) -> None:
    """The runner's own teardown kills what a server started outside its process group (a worker
    that called setsid(), a double-forked daemon); a SIGKILLed runner runs none, so the watchdog
    must: such a process, left behind, holds the GPU and the port from the next job. The server
    itself exits at once on the SIGTERM its runner's death sends it (PR_SET_PDEATHSIG)."""
    import subprocess

    log = tmp_path / "server.log"
    runner = subprocess.Popen([sys.executable, "-c", _STRAY_RUNNER_SCRIPT, str(gsm8k_dir), str(log), flag],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    pgid = int(runner.stdout.readline())
    stray = int(log.read_text().split(f"fake server: {said} ")[1].split()[0])
    try:
        assert pid_alive(stray) and stray not in group_members(pgid)
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 15.0  # SIGTERM, the 1 s grace, SIGKILL, within a poll or two
        while pid_alive(stray) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(stray), f"{flag}: pid {stray} outlived the runner and its server"
        assert group_members(pgid) == []
    finally:
        for pid in [*group_members(pgid), stray]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _watchdogs_of(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"quantgate.harness.watchdog" in argv and str(pgid).encode() in argv:
                found.append(int(entry.name))
    return found


def test_a_server_has_a_watchdog_while_up_and_none_after_its_stop(tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(_fake(gsm8k_dir), tmp_path / "server.log", startup_timeout_s=30)
    try:
        assert len(_watchdogs_of(server.pgid)) == 1
    finally:
        server.stop(grace_s=1.0)
    assert _watchdogs_of(server.pgid) == [] and server.to_dict()["killed_outside_group"] == []


def test_quantgate_serves_own_address_in_use_wording_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`quantgate serve` says "port N on HOST is already in use", with no errno: an address in use
    all the same (a lost race, relaunched), not an unexplained exit."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": busy.getsockname()[1])
        monkeypatch.setattr(server_mod, "PORT_ATTEMPTS", 1)  # each launch pays for a Python start
        command = build_command("builtin", str(REPO / "models" / "tiny-qwen3"), ["--device", "cpu"], {})
        with pytest.raises(ServerStartError) as info:
            launch(command, tmp_path / "server.log", startup_timeout_s=60)
    assert "an address was in use on each of the 1 launches" in str(info.value), info.value.log_tail


def test_a_quantgate_beside_the_interpreter_is_run_only_when_executable(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / "bin" / "python"
    script = python.with_name("quantgate")
    python.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    monkeypatch.setattr(sys, "executable", str(python))
    assert server_mod.quantgate_executable() == [str(python), "-m", "quantgate.harness.cli"]
    script.chmod(0o755)
    assert server_mod.quantgate_executable() == [str(script)]


def test_the_last_of_a_repeated_server_option_wins_as_in_argparse() -> None:
    command = build_command("builtin", "m", ["--served-model-name", "a", "--port", "9001", "--served-model-name=b",
                                             "--port", "9002"], {})
    assert command.served_model == "b" and command.preferred_port == 9002


def test_port_0_in_server_args_asks_for_any_free_port() -> None:
    assert build_command("builtin", "m", ["--port", "0"], {}).preferred_port is None


def test_the_runners_vllm_api_key_guards_a_vllm_server_under_the_configs_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "runner-key")

    def vllm_key(env: dict[str, str]) -> str | None:
        return build_command("vllm", "m", [], env, ["vllm", "serve"], require_executable=False).api_key

    assert vllm_key({}) == "runner-key" and vllm_key({"VLLM_API_KEY": "config-key"}) == "config-key"
    assert build_command("vllm", "m", ["--api-key", "flag-key"], {}, ["vllm", "serve"],
                         require_executable=False).api_key == "flag-key"  # vLLM's --api-key wins over the variable
    assert build_command("builtin", "m", [], {}).api_key is None  # quantgate serve reads no VLLM_API_KEY


_LISTENER = ("import socket, sys, time\n"
             "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
             "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(60)\n")


def test_another_quantgate_run_is_a_listener_on_the_port_carrying_another_runners_pid() -> None:
    """Neither a process of another run that does not listen on the port, nor a listener of this
    run's own (a wrapper's), is another run's server."""
    import subprocess

    port = free_port("127.0.0.1")
    started: list[subprocess.Popen] = []

    def process(runner: str, *argv: str) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, server_mod.RUNNER_ENV: runner}))
        return started[-1]

    try:
        process("1", "print('idle', flush=True); import time; time.sleep(60)").stdout.readline()
        process(str(os.getpid()), _LISTENER, str(port)).stdout.readline()
        assert server_mod.other_run_listening(port) is None
        process("1", _LISTENER, str(port)).stdout.readline()
        assert server_mod.other_run_listening(port) == 1
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_teardown_never_kills_a_process_that_only_reuses_a_descendants_pid(tmp_path: Path) -> None:
    """A descendant is recorded with its start time: a pid the kernel gave to another process
    since is not it."""
    import subprocess

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = server_mod.LaunchedServer(_fake(tmp_path), tmp_path / "server.log")
        server._kill_strays({other.pid: "1"}, set())  # a process of that pid started at tick 1
        assert other.poll() is None and server.killed_outside_group == []
    finally:
        other.kill()
        other.wait()


def test_stopping_a_server_leaves_the_runners_other_processes_running(tmp_path: Path, gsm8k_dir: Path) -> None:
    """Teardown kills orphans re-parented to the runner, not its own children: another config's
    server and watchdog, or a process it started itself."""
    import subprocess

    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    first = launch(_fake(gsm8k_dir), tmp_path / "first.log", startup_timeout_s=30)
    try:
        second = launch(_fake(gsm8k_dir), tmp_path / "second.log", startup_timeout_s=30)
        try:
            first.stop(grace_s=1.0)
            assert httpx.get(second.base_url + "/health", timeout=5).status_code == 200
            assert len(_watchdogs_of(second.pgid)) == 1 and helper.poll() is None
            assert first.killed_outside_group == []
        finally:
            second.stop()
    finally:
        first.stop()
        helper.kill()
        helper.wait()


_UNWATCHED_RUNNER_SCRIPT = """
import sys, time
from pathlib import Path
from quantgate.harness import server as server_mod
from tests.harness.runner_fixtures import launch
from tests.harness.test_server import _fake
server_mod._start_watchdog = lambda pgid, server_id: None
server = launch(_fake(Path(sys.argv[1]), "--note-sigterm"), Path(sys.argv[2]), startup_timeout_s=30)
print(server.pgid, flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_runners_server_is_sent_sigterm_by_the_kernel(tmp_path: Path, gsm8k_dir: Path) -> None:
    """PR_SET_PDEATHSIG, before the watchdog: SIGTERM, which lets vLLM's API server stop its engine
    and workers (a SIGKILL would reach it alone, leaving them on the GPU)."""
    import subprocess

    log = tmp_path / "server.log"
    runner = subprocess.Popen([sys.executable, "-c", _UNWATCHED_RUNNER_SCRIPT, str(gsm8k_dir), str(log)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    pgid = int(runner.stdout.readline())
    try:
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 15.0
        while "fake server: SIGTERM received" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "fake server: SIGTERM received" in log.read_text()
        assert group_members(pgid) == [pgid]  # not SIGKILLed: this server only notes the SIGTERM
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_an_api_key_longer_than_its_placeholder_leaves_nothing_of_the_old_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    key = "a-key-longer-than-the-placeholder-0123456789"
    log.write_text(f"INFO non-default args: {{'api_key': '{key}'}}\nready\n")
    server_mod._redact_in_place(log, key)
    assert log.read_text() == "INFO non-default args: {'api_key': '<redacted>'}\nready\n"


def test_the_server_gets_the_runners_environment_under_the_configs_env_and_the_runners_pid(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QG_SET_BY_BOTH", "runner")
    monkeypatch.setenv("QG_SET_BY_THE_RUNNER", "kept")
    server = launch(_fake(gsm8k_dir, env={"QG_SET_BY_BOTH": "config"}), tmp_path / "server.log", startup_timeout_s=30)
    try:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{server.pgid}/environ").read_text().split("\0") if "=" in item)
    finally:
        server.stop()
    assert environ["QG_SET_BY_BOTH"] == "config" and environ["QG_SET_BY_THE_RUNNER"] == "kept"
    assert environ[server_mod.RUNNER_ENV] == str(os.getpid())  # how another run knows this one's server


def test_each_relaunch_after_an_address_in_use_is_on_a_new_port_and_leaves_no_process_behind(tmp_path: Path) -> None:
    dies = [sys.executable, "-c", (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('child pid', child.pid, flush=True)\n"
        "print('OSError: [Errno 98] Address already in use')\n"
        "raise SystemExit(1)\n")]
    log = tmp_path / "server.log"
    server = server_mod.LaunchedServer(ServerCommand(argv=dies, env={}, served_model="m",
                                                     preferred_port=free_port("127.0.0.1")), log)
    with pytest.raises(ServerStartError):
        server.start(startup_timeout_s=30)
    children = [int(line.split()[-1]) for line in log.read_text().splitlines() if line.startswith("child pid")]
    try:
        assert len(children) == server_mod.PORT_ATTEMPTS and not any(pid_alive(pid) for pid in children)
        assert len(set(server.ports_tried)) == len(server.ports_tried) == server_mod.PORT_ATTEMPTS
        assert server.killed_outside_group == []  # killed with their groups: none had left them
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_startup_gives_up_at_its_bound_with_the_logs_tail(tmp_path: Path, gsm8k_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock of the test's: each poll interval slept advances it exactly."""
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        time.sleep(0.01)  # real processes still need real time

    monkeypatch.setattr(server_mod, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    with pytest.raises(ServerStartError, match="within 10 s") as info:
        launch(_fake(gsm8k_dir, "--startup-delay", "60"), tmp_path / "server.log", startup_timeout_s=10)
    assert 10 <= info.value.startup_s <= 10 + server_mod.POLL_INTERVAL_S + 1e-6
    assert "fake server: starting" in info.value.log_tail


def test_a_health_answer_other_than_200_is_not_ready(tmp_path: Path) -> None:
    """A proxy in front of a loading server, or a server still loading, answers /health 503."""
    loading = [sys.executable, "-c", (
        "import http.server, sys\n"
        "class Loading(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(503)\n"
        "        self.end_headers()\n"
        "print('answering 503', flush=True)\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[-1])), Loading).serve_forever()\n")]
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError, match="did not answer /health within 2 s"):
        launch(ServerCommand(argv=loading, env={}, served_model="m"), log, startup_timeout_s=2)
    assert "GET /health HTTP/1.1\" 503" in log.read_text()  # it answered, and was not taken for ready


def test_teardown_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path, gsm8k_dir: Path) -> None:
    log = tmp_path / "server.log"
    server = launch(_fake(gsm8k_dir, "--note-sigterm", "--spawn-child"), log, startup_timeout_s=30)
    assert server.stop(grace_s=0.5) == -signal.SIGKILL  # it only notes the SIGTERM
    assert "fake server: SIGTERM received" in log.read_text()
    assert server.killed_outside_group == []  # its child died with the group: nothing escaped it


def test_a_usage_line_is_a_refusal_only_with_argparses_exit_and_a_typed_field_error_is_one() -> None:
    from quantgate.harness.server import refused_arguments

    usage = "usage: vllm serve [-h] [--port PORT]\nvllm serve: error: unrecognized arguments: --x\n"
    assert refused_arguments(usage, 2) == "vllm serve: error: unrecognized arguments: --x"
    assert refused_arguments(usage, 1) is None  # a usage printed, then a failure of another kind
    mixed = ("ValidationError: 2 validation errors for ModelConfig\n"
             "  hub: Value error, connection reset [type=value_error, input_value=None]\n"
             "  max_model_len: Input should be a valid integer [type=int_parsing, input_value='many']\n")
    assert refused_arguments(mixed, 1).startswith("ValidationError: 2 validation errors for ModelConfig")


def test_the_ports_of_an_ipv6_host_are_probed_with_ipv6_sockets() -> None:
    """Its own check for an IPv6 loopback: the launch test's skips when port_is_free fails on one."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = free_port("::1")
    assert server_mod.port_is_free(port, "::1")
    with socket.socket(socket.AF_INET6) as busy:
        busy.bind(("::1", port))
        busy.listen()
        assert not server_mod.port_is_free(port, "::1")


def test_a_started_server_records_how_long_it_took_to_start(tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(_fake(gsm8k_dir, "--startup-delay", "0.5"), tmp_path / "server.log", startup_timeout_s=30)
    server.stop()
    assert server.to_dict()["startup_s"] >= 0.5  # result.json's server.startup_s and timings.server_start_s


def test_teardown_returns_once_the_group_is_gone_not_when_the_grace_is_over(tmp_path: Path, gsm8k_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock of the test's: each wait slept advances it exactly."""
    server = launch(_fake(gsm8k_dir), tmp_path / "server.log", startup_timeout_s=30)
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        time.sleep(0.01)  # the server still needs real time to exit

    monkeypatch.setattr(server_mod, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    assert server.stop(grace_s=10) == -signal.SIGTERM  # it exits at SIGTERM
    assert clock[0] < 10


def test_a_server_exiting_for_a_reason_other_than_an_address_in_use_is_launched_once(tmp_path: Path,
                                                                                    gsm8k_dir: Path) -> None:
    log = tmp_path / "server.log"
    server = server_mod.LaunchedServer(_fake(gsm8k_dir, "--exit-during-startup", "0.1"), log)
    with pytest.raises(ServerStartError, match="exited with status 1"):
        server.start(startup_timeout_s=30)
    assert len(server.ports_tried) == 1 and "launch attempt 2" not in log.read_text()


def test_the_logs_tail_is_its_last_lines_and_what_is_read_of_it_carries_no_api_key(tmp_path: Path) -> None:
    """The key is redacted from the file only at stop(): read while the server runs (an error's
    tail, the kernel report), the log must not carry it either."""
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i} key=abcdef\n" for i in range(100)))
    server = server_mod.LaunchedServer(_fake(tmp_path, "--api-key", "abcdef"), log)
    assert server.log_tail(2) == "line 98 key=<redacted>\nline 99 key=<redacted>"
    lines = list(server.log_lines())
    assert len(lines) == 100 and lines[-1] == "line 99 key=<redacted>\n"
    assert not any("abcdef" in line for line in lines)


def test_what_a_launched_server_records_carries_no_api_key(tmp_path: Path) -> None:
    server = server_mod.LaunchedServer(_fake(tmp_path, "--api-key", "abcdef"), tmp_path / "server.log")
    server.port = 8123
    recorded = server.to_dict()
    assert "abcdef" not in str(recorded)  # result.json is shared
    assert "<redacted>" in recorded["command"] and recorded["command"][-2:] == ["--port", "8123"]


@contextlib.contextmanager
def _models_endpoint(status: int, models: list[dict]) -> Iterator[str]:
    """The URL of a server answering every GET with `status` and `models` as /v1/models' data."""
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": models}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("status", [401, 403])
def test_attach_to_a_server_refusing_the_request_says_whether_a_key_is_missing_or_wrong(status: int) -> None:
    with _models_endpoint(status, []) as url:
        with pytest.raises(ServerStartError, match=rf"refused the request \({status}\): it needs an API key") as info:
            attach(url, "m")
        assert info.value.refused_config
        with pytest.raises(ServerStartError, match=rf"refused the request \({status}\): the API key is wrong"):
            attach(url, "m", api_key="k")


def test_attach_takes_the_named_model_else_the_only_one_with_the_root_it_is_served_from() -> None:
    two = [{"id": "a", "root": "/models/a"}, {"id": "b", "root": "/models/b"}]
    with _models_endpoint(200, two) as url:
        named = attach(url, "b")
        assert (named.served_model, named.served_root) == ("b", "/models/b")
        with pytest.raises(ServerStartError, match="serves a, b, none of them 'c'; set --served-model-name"):
            attach(url, "c")
    with _models_endpoint(200, two[:1]) as url:
        only = attach(url, "c")
        assert (only.served_model, only.served_root) == ("a", "/models/a")
    with _models_endpoint(200, []) as url:  # names nothing: the config's name is taken at its word
        unnamed = attach(url, "c")
        assert (unnamed.served_model, unnamed.served_root) == ("c", None)


def test_a_fixed_port_is_taken_again_while_its_last_servers_connections_linger(tmp_path: Path,
                                                                               gsm8k_dir: Path) -> None:
    """A server stopped with connections open (or closing idle keep-alive ones itself) leaves them
    in TIME_WAIT on its port for a minute. The next server binds it all the same (SO_REUSEADDR):
    it is not in use, and configs sharing a fixed --port moved, each after the first, to another."""
    port = free_port("127.0.0.1")
    first = launch(_fake(gsm8k_dir, port=port), tmp_path / "first.log", startup_timeout_s=30)
    with socket.create_connection(("127.0.0.1", port)):  # open while the server stops
        first.stop()
    second = launch(_fake(gsm8k_dir, port=port), tmp_path / "second.log", startup_timeout_s=30)
    second.stop()
    assert second.ports_tried == [port]
