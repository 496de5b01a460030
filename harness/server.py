"""The server under test: `quantgate serve` or `vllm serve`, in its own process group.

A launched server gets a session of its own (so a Ctrl-C in the terminal reaches the runner,
which decides, and never half of the server's workers), a free port (the one in
`server_args` when it is free, else another; a bind race at start-up relaunches on another),
and its whole output in `server.log`. Start-up polls `/health` and fails fast: when the
process exits, the error comes within a poll interval, with the log's tail, not after
`startup_max_wait_seconds`. Teardown signals the whole group, escalates to SIGKILL, and
returns only when no process is left in it; a descendant that had left the group (setsid) is
killed too, and recorded.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import httpx

from .options import option_uses
from .results import ArtifactsUnwritable
# RUNNER_ENV: a listener on our port whose process carries another runner's pid is that run's
# server, never a proxy of ours. SERVER_ENV: the watchdog finds what a server started outside its
# process group by it.
from .watchdog import RUNNER_ENV, SERVER_ENV

POLL_INTERVAL_S = 0.2
TEARDOWN_GRACE_S = 10.0
# After an interrupt: a CI agent that cancels a job SIGKILLs this runner some seconds after its
# SIGTERM (Buildkite: 9 s by default); the server's SIGKILL must come first, or a hung server
# outlives the job.
INTERRUPTED_GRACE_S = 3.0
FOREIGN_LISTENER_WAIT_S = 30.0
PORT_ATTEMPTS = 3
_ADDRESS_IN_USE = ("already in use", "errno 98", "eaddrinuse")  # vLLM/uvicorn and quantgate serve wordings
ARGPARSE_EXIT = 2
# argparse's refusal: `usage: ...` then `PROG: error: unrecognized arguments / invalid choice / argument --x: ...`
_ARGPARSE_ERROR = re.compile(r"^usage: .*?^(?P<line>\S[^\n]*?: error: [^\n]*)", re.MULTILINE | re.DOTALL)
# pydantic's refusal of one of vLLM's config classes: a header, then what is wrong (and `[type=..., input_value=...]`)
_VALIDATION_ERROR = re.compile(r"ValidationError: (?P<head>\d+ validation errors? for \w+)[^\n]*"
                               r"(?P<detail>(?:\n[^\n]*){0,2})")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
API_KEY_FLAG = "--api-key"


class ServerStartError(RuntimeError):
    """The server did not become healthy: it exited, or start-up outlasted its bound."""

    def __init__(self, message: str, *, exit_status: int | None, log_tail: str, startup_s: float,
                 refused_config: bool = False) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.log_tail = log_tail
        self.startup_s = startup_s
        self.refused_config = refused_config  # the config is wrong for this server: a retry cannot help


class ServerCommandError(ValueError):
    """The server command cannot be built (e.g. the vLLM executable is missing): a usage error."""


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]  # everything but --port, which the launcher adds
    env: dict[str, str]  # the config's `env:`, applied over the runner's environment
    served_model: str  # the name requests must carry
    preferred_port: int | None = None
    host: str = "127.0.0.1"
    api_key: str | None = None  # what the server requires on /v1/* (its --api-key or VLLM_API_KEY)

    def with_port(self, port: int) -> list[str]:
        return [*self.argv, "--port", str(port)]

    def shell(self, port: int | str = "PORT", redact: bool = False) -> str:
        """The exact command line, environment first, for a human to paste; `redact` hides
        secrets (for logs and result.json)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (redact_env(self.env) if redact else self.env).items())
        argv = [*self.argv, "--port", str(port)]
        return (env + " " if env else "") + shlex.join(redact_api_key(argv) if redact else argv)


def _secret(name: str) -> bool:
    return any(word in name.upper() for word in _SECRET_WORDS)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the values of secret-looking names (TOKEN, KEY, ...) replaced."""
    return {k: "<redacted>" if _secret(k) else v for k, v in env.items()}


def redact_api_key(argv: list[str]) -> list[str]:
    """`argv` with the value of `--api-key` replaced (result.json and logs are shared)."""
    out = list(argv)
    for use in option_uses(out, {API_KEY_FLAG}):
        if use.inline:
            out[use.index] = out[use.index].partition("=")[0] + "=<redacted>"
        elif use.value is not None:
            out[use.index + 1] = "<redacted>"
    return out


def api_key_of(server_args: list[str], env: dict[str, str]) -> str | None:
    """The key a server started with these args and env requires: `--api-key`, else vLLM's
    VLLM_API_KEY."""
    key, _ = split_option(list(server_args), API_KEY_FLAG)
    return key or env.get("VLLM_API_KEY") or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def split_option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of `--name V` / `--name=V` (either spelling, `_` or `-`) in `args` (last wins,
    as argparse), and `args` without it (a `--name` with no value stays, for the server to refuse)."""
    uses = [use for use in option_uses(args, {name}) if use.value is not None]
    taken = {i for use in uses for i in use.items}
    return (uses[-1].value if uses else None), [arg for i, arg in enumerate(args) if i not in taken]


def quantgate_executable() -> list[str]:
    """`quantgate` of this installation: the script beside this interpreter, else `python -m`."""
    script = Path(sys.executable).with_name("quantgate")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "quantgate.harness.cli"]


def build_command(engine: str, model: str, server_args: list[str], env: dict[str, str],
                  vllm_command: str | list[str] | None = None, require_executable: bool = True) -> ServerCommand:
    """`quantgate serve MODEL ARGS` or `vllm serve MODEL ARGS` (or `vllm_command` in its place);
    `require_executable`: vLLM's must be on this machine's PATH (not for commands printed for another)."""
    port, args = split_option(list(server_args), "--port")
    host, _ = split_option(args, "--host")
    served, _ = split_option(args, "--served-model-name")
    if host is None:
        args += ["--host", "127.0.0.1"]
    if engine == "builtin":
        program = [*quantgate_executable(), "serve"]
    elif engine == "vllm":
        program = shlex.split(vllm_command) if isinstance(vllm_command, str) else list(vllm_command or ["vllm", "serve"])
        if not program or (require_executable and shutil.which(program[0]) is None):
            raise ServerCommandError(
                f"engine vllm: {program[0] if program else '(empty vllm_command)'!r} is not an executable on PATH. "
                "vLLM is never installed in quantgate's environment: install it in its own venv and put its "
                "`vllm` on PATH, or set `vllm_command: /path/to/venv/bin/vllm serve` in the config")
    else:
        raise ServerCommandError(f"unknown engine {engine!r}; use builtin or vllm")
    try:
        preferred = int(port) or None if port is not None else None  # --port 0: any free port
    except ValueError:
        raise ServerCommandError(f"server_args: --port {port!r} is not a number") from None
    connect_host = {None: "127.0.0.1", "": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    # vLLM reads VLLM_API_KEY from the environment it inherits: the runner's, under the config's `env`
    # (LaunchedServer.start). A key only the runner's environment holds still guards every request.
    inherited = {"VLLM_API_KEY": os.environ["VLLM_API_KEY"]} if engine == "vllm" and "VLLM_API_KEY" in os.environ \
        else {}
    return ServerCommand(argv=[*program, model, *args], env=dict(env), served_model=served or model,
                         preferred_port=preferred, host=connect_host, api_key=api_key_of(args, {**inherited, **env}))


def env_diff(overrides: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str | None]:
    """What the config's env changes relative to the runner's (secret-looking values redacted)."""
    base = dict(os.environ) if base is None else base
    diff: dict[str, str | None] = {}
    for key, value in overrides.items():
        if base.get(key) != value:
            diff[key] = "<redacted>" if _secret(key) else value
    return diff


def _family(host: str) -> socket.AddressFamily:
    """The address family a server bound to `host` listens on (IPv6 for `::1`)."""
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, IndexError):
        return socket.AF_INET


def http_url(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 literal in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server can listen on `port`, probed as servers bind it (SO_REUSEADDR: uvicorn,
    vLLM, quantgate serve): the connections of the port's last server, left in TIME_WAIT for a
    minute, do not keep the next one off it. A listener does."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm)": state, ppid, pgrp, ... (field 22 of
    proc(5), the start time, at [19]); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live_processes() -> dict[int, list[str]]:
    """Every live (non-zombie) process's stat fields, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z":
            found[int(entry.name)] = fields
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    if not Path("/proc").is_dir():  # not Linux: the kernel's answer, zombies included
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return [pid for pid, fields in _live_processes().items() if int(fields[2]) == pgid]


def descendants(pid: int) -> dict[int, str]:
    """The live descendants of `pid` and their start times (a pid can be reused; a pid with its
    start time cannot), by ppid links; none without /proc."""
    if not Path("/proc").is_dir():
        return {}
    processes = _live_processes()
    children: dict[int, list[int]] = {}
    for child, fields in processes.items():
        children.setdefault(int(fields[1]), []).append(child)
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = processes[child][19]
                todo.append(child)
    return found


def _listening_inodes(port: int) -> set[str] | None:
    """The socket inodes listening on TCP `port`; None without /proc."""
    if not Path("/proc/net/tcp").exists():
        return None
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for fields in (row.split() for row in rows):
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; the inode is the tenth field
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _sockets_of(pid: int) -> set[str]:
    held: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    held.add(link[len("socket:["):-1])
    return held


def listening_sockets(pid: int, port: int) -> tuple[int, int] | None:
    """(held, all): how many of the listening sockets of TCP `port` `pid` and its descendants
    hold, and how many there are; None where /proc cannot tell. A /health answer on a port proves
    nothing by itself: another job's server may have bound it first while ours still loads, or
    beside ours (SO_REUSEPORT, as vLLM binds), and the kernel then shares the requests."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    held: set[str] = set()
    for member in (pid, *descendants(pid)):
        held |= _sockets_of(member)
    return len(inodes & held), len(inodes)


def other_run_listening(port: int) -> int | None:
    """The pid of another quantgate run whose server listens on `port` (its processes carry
    RUNNER_ENV naming that run), or None: none does, or /proc does not say (another user's
    processes, a container's proxy)."""
    inodes = _listening_inodes(port) or set()
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not (_sockets_of(int(entry.name)) & inodes):
            continue
        with contextlib.suppress(OSError, ValueError):  # gone, another user's, or not a pid
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(RUNNER_ENV.encode() + b"="):
                    runner = int(item.split(b"=", 1)[1])
                    if runner != os.getpid():
                        return runner
    return None


def _still_running(pid: int, start_time: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == start_time


def _libc_prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value) == 0
    except (OSError, AttributeError):
        return False


_PR_SET_CHILD_SUBREAPER = 36
# Processes this runner started itself that are still up (server leaders, their watchdogs):
# adopted processes are the servers' descendants, not these.
_STARTED_HERE: set[int] = set()
# The grace a watchdog gives a server it tears down because the runner died (harness/watchdog.py).
WATCHDOG_GRACE_S = TEARDOWN_GRACE_S


def _adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux): a daemon a server starts by
    double-forking (fork, setsid, fork, exit) is then re-parented here, not to init, where teardown
    can still find and kill it, instead of leaving it holding a GPU or a port for the next job."""
    if sys.platform.startswith("linux"):
        _libc_prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _adopted_children(after: str) -> dict[int, list[str]]:
    """Children of this process, zombies included, that it did not start itself: orphans re-parented
    here as their subreaper, started after the server whose start time is `after` (clock ticks)."""
    if not Path("/proc").is_dir():
        return {}
    me = os.getpid()
    found = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if (fields is not None and int(fields[1]) == me and int(entry.name) not in _STARTED_HERE
                and int(fields[19]) > int(after)):
            found[int(entry.name)] = fields
    return found


def _start_watchdog(pgid: int, server_id: str) -> Any:
    """The watchdog of server group `pgid`, launched with SERVER_ENV `server_id`
    (harness/watchdog.py), a Popen, or None where there is no /proc to watch the runner with."""
    import subprocess

    own_start = (_stat(os.getpid()) or [None] * 20)[19]
    if own_start is None:
        return None
    dog = subprocess.Popen([sys.executable, "-m", "quantgate.harness.watchdog", str(os.getpid()), own_start,
                            str(pgid), str(WATCHDOG_GRACE_S), server_id], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _STARTED_HERE.add(dog.pid)
    return dog


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM the server if the runner dies without tearing it down.
    Not SIGKILL: it reaches the group leader only, and vLLM's API server killed so leaves its
    engine and worker processes holding the GPU. A server that ignores the SIGTERM is the
    watchdog's (`_start_watchdog`)."""
    _libc_prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_REDACTED = "<redacted>"
_CHUNK = 1 << 20


def _copy_redacted(src: BinaryIO, dst: BinaryIO, secret: bytes) -> int:
    """Copy `src` to `dst` with every `secret` replaced, a chunk at a time (a vLLM log can be
    gigabytes); the number replaced. The last len(secret)-1 bytes of a chunk wait for the next
    one, so a secret split between two chunks is found too."""
    found, carry = 0, b""
    while True:
        data = src.read(_CHUNK)
        buf = carry + data
        # Any occurrence starting before `cut` lies wholly in `buf`; at the end, every one does.
        cut = len(buf) - (len(secret) - 1) if data else len(buf)
        start = 0
        while (at := buf.find(secret, start)) != -1 and at < cut:
            dst.write(buf[start:at] + _REDACTED.encode())
            start, found = at + len(secret), found + 1
        emit = max(start, cut)
        dst.write(buf[start:emit])
        carry = buf[emit:]
        if not data:
            return found


def _redact_in_place(path: Path, secret: str) -> None:
    """Replace `secret` in the file at `path`, keeping its inode: `start()` holds the log open
    (O_APPEND) and hands it to the next attempt's server, so a write-then-rename would leave that
    server writing to a deleted file. Streamed through a temporary copy, never whole in memory.
    An OSError (a full disk) is the caller's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            if not _copy_redacted(src, dst, secret.encode()):
                return
        with open(tmp, "rb") as src, open(path, "r+b") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
            dst.truncate()
    finally:  # a full disk must not leave half a temp file behind
        tmp.unlink(missing_ok=True)


# What of a failed attempt's log is searched for why it failed (a lost port race, refused
# arguments): its end, where a server that exits says so; bounded, a log can be gigabytes.
_ATTEMPT_LOG_BYTES = 4 << 20


def _read_from(path: Path, offset: int, limit: int = _ATTEMPT_LOG_BYTES) -> str:
    """The file at `path` from byte `offset` on, its last `limit` bytes at most."""
    with open(path, "rb") as f:
        f.seek(max(offset, f.seek(0, os.SEEK_END) - limit))
        return f.read(limit).decode("utf-8", "replace")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Server(Protocol):
    base_url: str
    served_model: str
    startup_s: float
    api_key: str | None

    def poll(self) -> int | None: ...
    def log_tail(self, lines: int = 40) -> str: ...
    def log_lines(self) -> Iterator[str]: ...
    def stop(self, grace_s: float = TEARDOWN_GRACE_S, hurry: Callable[[], bool] | None = None) -> int | None: ...
    def to_dict(self) -> dict[str, Any]: ...


class LaunchedServer:
    """A server process this runner starts and owns until `stop()`.

    Created before the process exists, so whoever holds it can always tear down whatever
    `start()` got to, even when an interrupt lands in the middle of start-up.
    """

    def __init__(self, command: ServerCommand, log_path: Path) -> None:
        self.command = command
        self.log_path = log_path
        self.process: Any = None  # subprocess.Popen of the current attempt
        self.port: int | None = None
        self.ports_tried: list[int] = []
        self.foreign_listener = False  # /health was answered by a listener outside the process tree
        self.startup_s = 0.0
        self.exit_status: int | None = None
        self.killed_outside_group: list[int] = []  # descendants that had left the group (setsid)
        self._leader_start: str | None = None  # the leader's start time, once launched
        self._watchdog: Any = None  # the current attempt's watchdog (Popen), if any

    @property
    def base_url(self) -> str:
        return http_url(self.command.host, self.port)

    @property
    def served_model(self) -> str:
        return self.command.served_model

    @property
    def api_key(self) -> str | None:
        return self.command.api_key

    def _redacted(self, text: str) -> str:
        """vLLM logs its non-default args, the key among them, at start-up."""
        return text.replace(self.api_key, _REDACTED) if self.api_key else text

    @property
    def pgid(self) -> int | None:
        return None if self.process is None else self.process.pid  # the leader of its own session

    def poll(self) -> int | None:
        """The exit status once the process has exited, else None (also before it started)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 40) -> str:
        return self._redacted(_tail(self.log_path, lines))

    def log_lines(self) -> Iterator[str]:
        """The log a line at a time, the key redacted: a vLLM log can be gigabytes, never read
        whole. A line is cut every _CHUNK characters, so one without an end is bounded too."""
        try:
            log = open(self.log_path, errors="replace")
        except FileNotFoundError:
            return
        with log:
            for line in iter(lambda: log.readline(_CHUNK), ""):
                yield self._redacted(line)

    def start(self, startup_timeout_s: float, on_wait: Callable[[float], None] | None = None) -> None:
        """Launch and return once `/health` answers 200; ServerStartError otherwise, with the
        process group already torn down. A lost race for the port relaunches on another port.

        `on_wait(elapsed_s)` is called on every poll, for a progress display.
        """
        import subprocess

        env = {**os.environ, **self.command.env, RUNNER_ENV: str(os.getpid())}
        started = time.monotonic()
        preferred, host = self.command.preferred_port, self.command.host
        _adopt_orphans()
        try:  # unbuffered: a line a full disk refused is never written again when the file closes
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab", buffering=0)
        except OSError as exc:
            raise ArtifactsUnwritable.of(self.log_path, exc) from None

        def note(line: str) -> None:
            try:
                log.write(f"# quantgate: {line}\n".encode())
            except OSError as exc:  # a full disk: the run's ERROR names the file and the fix
                raise ArtifactsUnwritable.of(self.log_path, exc) from None

        with log, httpx.Client(timeout=2.0) as client:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                port = free_port(host)
                if preferred is not None and preferred not in self.ports_tried:
                    if port_is_free(preferred, host):
                        port = preferred
                    else:
                        self.ports_tried.append(preferred)
                        note(f"port {preferred} is in use; using {port}")
                self.port = port
                self.ports_tried.append(port)
                note(f"launch attempt {attempt}: {self.command.shell(port, redact=True)}")
                offset = log.tell()
                server_id = uuid.uuid4().hex
                self.process = subprocess.Popen(
                    self.command.with_port(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**env, SERVER_ENV: server_id}, start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
                _STARTED_HERE.add(self.process.pid)
                self._leader_start = (_stat(self.process.pid) or [None] * 20)[19]
                self._watchdog = _start_watchdog(self.process.pid, server_id)
                try:
                    note(f"pid {self.process.pid} (process group {self.process.pid})")
                    if self._wait_healthy(client, started, startup_timeout_s, offset, attempt, on_wait):
                        self._check_served_model(client)
                        return
                except BaseException as exc:  # start-up failed, or an interrupt: nothing is left running
                    if isinstance(exc, ServerStartError):
                        self.startup_s = exc.startup_s  # result.json's server.startup_s, as the timings'
                    # An interrupt (the runner's RunInterrupted is a KeyboardInterrupt) may be a CI cancel,
                    # whose SIGKILL of this runner follows within seconds: the server's must come first.
                    self.stop(INTERRUPTED_GRACE_S if isinstance(exc, KeyboardInterrupt) else TEARDOWN_GRACE_S)
                    raise
        raise AssertionError("unreachable: the last port attempt raises")  # pragma: no cover

    def _wait_healthy(self, client: httpx.Client, started: float, startup_timeout_s: float, offset: int,
                      attempt: int, on_wait: Callable[[float], None] | None) -> bool:
        """True once healthy; False when the server lost a race for its port (try another)."""
        deadline = started + startup_timeout_s
        foreign_since: float | None = None
        while True:
            if on_wait is not None:
                on_wait(time.monotonic() - started)
            if _healthy(client, self.base_url):
                sockets = listening_sockets(self.process.pid, self.port)
                held, total = sockets if sockets is not None else (1, 1)
                if 0 < held < total:  # another server shares the port (SO_REUSEPORT): never ours alone
                    self.stop()
                    with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                        log.write(f"# quantgate: another process listens on port {self.port} too; relaunching\n")
                    if attempt < PORT_ATTEMPTS:
                        return False
                    raise ServerStartError(f"other processes listened on each port tried ({self.ports_tried}); a "
                                           "fixed --port in server_args collides with other jobs: drop it",
                                           exit_status=None, log_tail=self.log_tail(),
                                           startup_s=time.monotonic() - started)
                # Held by no process of ours: most often another job's server on the same fixed port
                # while ours still loads and will fail to bind (then relaunched): wait for that. A
                # wrapper whose listener lives elsewhere (a container's proxy) stays up, and counts,
                # but never another quantgate run's server: ours may bind only after loading.
                owned = held == total
                if not owned and foreign_since is None and (other := other_run_listening(self.port)) is not None:
                    self.stop()
                    with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                        log.write(f"# quantgate: port {self.port} is answered by the server of another quantgate "
                                  f"run (pid {other}); relaunching on another port\n")
                    if attempt < PORT_ATTEMPTS:
                        return False
                    raise ServerStartError(f"other quantgate runs' servers answered on each port tried "
                                           f"({self.ports_tried}); a fixed --port in server_args collides with other "
                                           "jobs: drop it", exit_status=None, log_tail=self.log_tail(),
                                           startup_s=time.monotonic() - started)
                foreign_since = None if owned else (foreign_since or time.monotonic())
                if owned or time.monotonic() - foreign_since >= FOREIGN_LISTENER_WAIT_S:
                    if not owned:
                        self.foreign_listener = True
                        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                            log.write(f"# quantgate: port {self.port} is answered by a process outside this "
                                      "server's process tree, which stayed up: taken as its own (a proxy)\n")
                    self.startup_s = time.monotonic() - started
                    return True
            status = self.poll()
            elapsed = time.monotonic() - started
            if status is not None:
                self.stop()  # children it left behind
                attempt_log = _read_from(self.log_path, offset)
                in_use = any(marker in attempt_log.lower() for marker in _ADDRESS_IN_USE)
                if in_use and attempt < PORT_ATTEMPTS:
                    return False
                refusal = refused_arguments(attempt_log, status)
                cause = (f"(it refused its arguments: {self._redacted(refusal)}); fix server_args, env or the "
                         "vllm_command's version to agree" if refusal else
                         f"(an address was in use on each of the {attempt} launches, ports {self.ports_tried}: a port "
                         "the server opens besides --port, or another process, is in the way; stop the other server, "
                         "see the log's tail below)" if in_use else "(see the log's tail below)")
                raise ServerStartError(
                    f"server exited with status {status} during start-up, after {elapsed:.1f} s {cause}",
                    exit_status=status, log_tail=self.log_tail(), startup_s=elapsed, refused_config=bool(refusal))
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"server did not answer /health within {startup_timeout_s:g} s (startup_max_wait_seconds); it "
                    "was stopped. Raise startup_max_wait_seconds if loading is legitimately slow",
                    exit_status=None, log_tail=self.log_tail(), startup_s=elapsed)
            time.sleep(POLL_INTERVAL_S)

    def _check_served_model(self, client: httpx.Client) -> None:
        """Every request names `served_model`: a server serving another name would answer each with
        404. A server without a /v1/models answer is left to the evaluation."""
        try:
            response = client.get(self.base_url + "/v1/models", headers=auth_headers(self.api_key))
            served = model_ids(response.json()) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            served = []
        if served and self.served_model not in served:
            raise ServerStartError(
                f"the server serves {', '.join(map(repr, served))}, not {self.served_model!r}, the name quantgate's "
                f"requests carry; add `--served-model-name {self.served_model}` to server_args (and check that "
                "vllm_command passes it on)", exit_status=None, log_tail=self.log_tail(), startup_s=self.startup_s,
                refused_config=True)

    def stop(self, grace_s: float = TEARDOWN_GRACE_S, hurry: Callable[[], bool] | None = None) -> int | None:
        """SIGTERM the whole group, SIGKILL what is left after `grace_s`, then SIGKILL any descendant
        that had left the group (a worker that called setsid() survives a group kill), and any
        daemon that double-forked away from the server (re-parented here, `_adopt_orphans`); return
        the leader's status. `hurry()` turning true meanwhile (an interrupt held while this teardown
        runs) cuts what is left of the grace to INTERRUPTED_GRACE_S: a CI cancel's SIGKILL of the
        runner follows its SIGTERM within seconds, and the server's must come first."""
        if self.process is None:
            return None
        pgid = self.process.pid
        # Before any signal: once their parents die, nothing links them to the server. Only while the
        # leader is unreaped is its pid surely still the server's.
        family = descendants(pgid) if self.process.returncode is None else {}
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not group_members(pgid) and self.process.poll() is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.process.poll()
                if not group_members(pgid):
                    break
                if hurry is not None and hurry():
                    deadline = min(deadline, time.monotonic() + INTERRUPTED_GRACE_S)
                    hurry = None
                time.sleep(0.05)
        self.exit_status = self.process.wait(timeout=5.0)
        _STARTED_HERE.discard(pgid)
        self._kill_strays(family, set(group_members(pgid)))
        self._stop_watchdog()
        self._kill_adopted()
        if self.api_key and self.log_path.exists():  # the log is an artifact: no key in it
            try:
                _redact_in_place(self.log_path, self.api_key)
            except OSError:  # a full disk: better no log than one with the key (emptied in place, too)
                with contextlib.suppress(OSError):
                    self.log_path.write_text("# quantgate: the log could not be rewritten without the API key "
                                             "(no space?), so it was emptied\n")
        return self.exit_status

    def _stop_watchdog(self) -> None:
        """The group is torn down: its watchdog has nothing left to do (it would exit at its next
        poll; killed now, no teardown waits for it)."""
        dog, self._watchdog = self._watchdog, None
        if dog is None:
            return
        with contextlib.suppress(ProcessLookupError):
            dog.kill()
        dog.wait()
        _STARTED_HERE.discard(dog.pid)

    def _kill_strays(self, family: dict[int, str], in_group: set[int]) -> None:
        strays = [pid for pid, start in family.items() if pid not in in_group and _still_running(pid, start)]
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not strays:
            return
        self.killed_outside_group += strays
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_still_running(pid, family[pid]) for pid in strays):
            time.sleep(0.05)
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:  # a full disk: result.json says it
            log.write(f"# quantgate: SIGKILLed {len(strays)} process(es) the server started that had left its "
                      f"process group (setsid), so the group's teardown missed them: pid(s) "
                      f"{', '.join(map(str, strays))}\n")

    def _kill_adopted(self) -> None:
        """Kill and reap the orphans of this server re-parented here (`_adopt_orphans`): daemons
        that double-forked away from it, and its children once their parent died. Only those that
        were still running are reported; the others were the group's, already killed."""
        if self._leader_start is None:
            return
        adopted = _adopted_children(self._leader_start)
        running = [pid for pid, fields in adopted.items() if fields[0] != "Z"]
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        left = set(adopted)
        while left and time.monotonic() < deadline:
            for pid in list(left):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                left.discard(pid)
            if left:
                time.sleep(0.05)
        if not running:
            return
        self.killed_outside_group += running
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:  # a full disk: result.json says it
            log.write(f"# quantgate: SIGKILLed {len(running)} process(es) the server started that had left it "
                      f"(a daemon that double-forked, re-parented to quantgate): pid(s) "
                      f"{', '.join(map(str, running))}\n")

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": redact_api_key(self.command.with_port(self.port) if self.port is not None else self.command.argv),
            "command_line": self.command.shell(self.port if self.port is not None else "PORT", redact=True),
            "env_diff": env_diff(self.command.env),
            "url": self.base_url if self.port is not None else None,
            "served_model": self.served_model,
            "port": self.port,
            "ports_tried": self.ports_tried,
            "foreign_listener": self.foreign_listener,
            "pid": self.pgid,
            "startup_s": round(self.startup_s, 3),
            "exit_status": self.exit_status if self.exit_status is not None else self.poll(),
            "killed_outside_group": self.killed_outside_group,
            "log": str(self.log_path),
        }


@dataclass
class AttachedServer:
    """A server someone else runs (`--server-url`): evaluated, never started or stopped."""

    base_url: str
    served_model: str
    startup_s: float = 0.0
    api_key: str | None = None
    served_root: str | None = None  # the served model's path or hub id, where /v1/models says

    def poll(self) -> int | None:
        return None

    def log_tail(self, lines: int = 40) -> str:
        return ""

    def log_lines(self) -> Iterator[str]:
        return iter(())

    def stop(self, grace_s: float = TEARDOWN_GRACE_S, hurry: Callable[[], bool] | None = None) -> int | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.base_url, "attached": True, "served_model": self.served_model,
                "served_root": self.served_root, "command": None, "startup_s": 0.0, "exit_status": None, "log": None}


def refused_arguments(log: str, status: int) -> str | None:
    """The line in which a server's start-up `log` refuses its arguments or config (argparse's
    `error:` after `usage:`, exit 2; a pydantic ValidationError of a field's type or value), else
    None: a retry cannot help these."""
    usage = _ARGPARSE_ERROR.search(log) if status == ARGPARSE_EXIT else None
    if usage:
        return usage["line"].strip()
    invalid = _VALIDATION_ERROR.search(log)
    # vLLM's config classes wrap any exception of their own checks (a hub or file read included)
    # as a `value_error`: only pydantic's own type and field errors are surely the arguments.
    types = re.findall(r"\[type=(\w+)", invalid["detail"]) if invalid else []
    if not types or all(kind == "value_error" for kind in types):
        return None
    detail = [line.split(" [type=")[0].strip() for line in invalid["detail"].splitlines()
              if not line.strip().startswith("For further information")]
    return ": ".join([f"ValidationError: {invalid['head']}", *filter(None, detail)])[:500]


def model_cards(models: Any) -> list[dict[str, Any]]:
    """The model cards of a `/v1/models` body that have a name (none in a body of another shape)."""
    data = models.get("data") if isinstance(models, dict) else None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else []


def model_ids(models: Any) -> list[str]:
    """The model names in a `/v1/models` body (none in a body of another shape)."""
    return [card["id"] for card in model_cards(models)]


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def attach(url: str, served_model: str | None, timeout_s: float = 10.0, api_key: str | None = None) -> AttachedServer:
    """An already running server; its served model is asked from /v1/models when not given."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    try:
        with httpx.Client(timeout=timeout_s) as client:
            response = client.get(url + "/v1/models", headers=auth_headers(api_key))
            if response.status_code in (401, 403):
                raise ServerStartError(
                    f"--server-url {url} refused the request ({response.status_code}): "
                    + ("the API key is wrong" if api_key else "it needs an API key")
                    + "; set --api-key in the config's server_args to the server's key (or OPENAI_API_KEY)",
                    exit_status=None, log_tail="", startup_s=0.0, refused_config=True)
            response.raise_for_status()
            cards = model_cards(response.json())
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ServerStartError(f"--server-url {url}: /v1/models did not answer ({exc})", exit_status=None,
                               log_tail="", startup_s=0.0) from None
    models = [card["id"] for card in cards]
    # vLLM and quantgate serve give the model's path or hub id as `root`: what is served, whatever its name.
    roots = {card["id"]: card["root"] for card in cards if isinstance(card.get("root"), str) and card["root"]}
    if served_model in models or not models:
        return AttachedServer(url, served_model or "", api_key=api_key, served_root=roots.get(served_model or ""))
    if len(models) == 1:
        return AttachedServer(url, models[0], api_key=api_key, served_root=roots.get(models[0]))
    raise ServerStartError(f"--server-url {url} serves {', '.join(models)}, none of them {served_model!r}; "
                           "set --served-model-name in server_args to the one to evaluate",
                           exit_status=None, log_tail="", startup_s=0.0)
