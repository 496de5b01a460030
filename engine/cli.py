"""`quantgate serve MODEL [flags]`: the built-in OpenAI-compatible server (SPEC section 6).

Flags carry vLLM's names so an eval config's `server_args` read the same for both engines.
Everything a user can get wrong fails before /health ever answers, with one line naming the
cause and the fix: flags (exit 3), the model folder and kernel selection (exit 3), the port
(exit 2: the retryable class, as another run may hold it).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import NoReturn

import uvicorn

from quantgate.kernels import KernelSelectionError, Platform, switch_problem

from . import AsyncEngine, LLMEngine, load_model
from .kv_cache import KVCacheBudgetError
from .serve_args import EXIT_ERROR, EXIT_USAGE, FOLDER_CONTENTS, register, static_problem
from .serve_args import normalize_flags as normalize_argv  # vLLM's parser takes `--max_model_len` too
from .server import ServerSettings, build_app

__all__ = ["register", "normalize_argv", "main"]  # the `quantgate` command protocol (harness/cli.py)

log = logging.getLogger("quantgate.engine.serve")


def _fail(message: str, code: int) -> int:
    print(f"quantgate serve: error: {message}", file=sys.stderr, flush=True)
    return code


def _check_model_dir(model: str) -> str | None:
    path = Path(model)
    if not path.exists():
        return f"model folder {model} does not exist; pass the path of a Hugging Face model folder"
    if not path.is_dir():
        return f"{model} is not a folder; pass a Hugging Face model folder ({FOLDER_CONTENTS})"
    if not (path / "config.json").is_file():
        return f"{model} has no config.json; pass a Hugging Face model folder ({FOLDER_CONTENTS})"
    return None


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind now, before the model loads, so a taken port fails fast; uvicorn serves on this socket."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def configure_logging(level: str) -> None:
    """Root logging to stderr, so the loader's `Selected <Kernel> for <module>` lines, uvicorn's
    and the server's all land in one log the harness keeps."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(args: argparse.Namespace) -> int:
    problem = static_problem(args) or _check_model_dir(args.model) or switch_problem()
    if problem:
        return _fail(problem, EXIT_USAGE)
    try:
        Platform.detect(args.device)
    except RuntimeError as exc:  # --device cuda without a CUDA build or GPU
        return _fail(str(exc), EXIT_USAGE)
    configure_logging(args.log_level)
    try:
        sock = bind_socket(args.host, args.port)
    except socket.gaierror as exc:
        return _fail(f"--host {args.host} cannot be resolved ({exc.strerror}); pass an IP address such as 127.0.0.1",
                     EXIT_USAGE)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return _fail(f"port {args.port} on {args.host} is already in use (another server?); stop it or pass "
                         "--port with a free port", EXIT_ERROR)
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror}; pass another --host/--port",
                     EXIT_ERROR)
    try:
        return _serve(args, sock)
    except KeyboardInterrupt:  # SIGINT; while serving, uvicorn shuts down first and then re-raises it
        _exit_by_signal(signal.SIGINT)
    except _Terminated:
        _exit_by_signal(signal.SIGTERM)
    finally:
        sock.close()


class _Terminated(Exception):
    """SIGTERM, as uvicorn re-raises it after its shutdown."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _exit_by_signal(signum: signal.Signals) -> NoReturn:
    """End by the signal that stopped the server, once it has shut down, so the exit status says
    why, without the traceback Python prints for a KeyboardInterrupt."""
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
    raise SystemExit(128 + signum)  # the shell's status for it, should the signal be blocked here


def _serve(args: argparse.Namespace, sock: socket.socket) -> int:
    try:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype,
                            linear_backend=args.linear_backend, moe_backend=args.moe_backend)
    except KernelSelectionError as exc:
        return _fail(f"kernel selection failed: {exc}", EXIT_USAGE)
    except ValueError as exc:  # the loader's config and checkpoint errors name the file and field
        return _fail(f"cannot load {args.model}: {exc}", EXIT_USAGE)
    except Exception as exc:  # device errors, out of memory: may differ on the next machine
        log.exception("loading %s failed", args.model)
        return _fail(f"cannot load {args.model}: {type(exc).__name__}: {exc}", EXIT_ERROR)
    engine_args = {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len}
    try:
        engine = LLMEngine(loaded, enforce_eager=args.enforce_eager, seed=args.seed,
                           **{k: v for k, v in engine_args.items() if v is not None})
    except KVCacheBudgetError as exc:  # the budget is a share of the device memory free now: may differ next time
        return _fail(f"{exc} (other processes on this device may hold its memory)", EXIT_ERROR)
    except ValueError as exc:  # e.g. --max-model-len above what the model allows
        return _fail(str(exc), EXIT_USAGE)
    async_engine = AsyncEngine(engine)
    names = tuple(args.served_model_name or [args.model])
    settings = ServerSettings(served_model_names=names, max_model_len=engine.max_model_len,
                              api_key=args.api_key)
    app = build_app(async_engine, loaded, settings)
    # No lifespan: the app has no startup or shutdown handlers, and a forced quit (a second Ctrl-C)
    # skips the lifespan's shutdown, so asyncio.run cancelled its task and uvicorn logged that
    # cancellation as an ERROR with a traceback in the server log the harness keeps.
    config = uvicorn.Config(app, log_config=None, log_level=args.log_level, access_log=args.log_level == "debug",
                            timeout_keep_alive=30, lifespan="off")
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    # uvicorn re-raises the signals it caught once it has shut down, the last first. After SIGTERM
    # and a forcing Ctrl-C, asyncio's SIGINT handler only cancels the main task, and SIGTERM's
    # default action then killed the process before the requests still in flight were cancelled
    # and answered 503 (CancelledRequestMiddleware): as an exception, it unwinds like Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        asyncio.run(_run_until_stopped(server, sock, url, names[0]))
    finally:
        async_engine.shutdown()
    return 0


async def _run_until_stopped(server: uvicorn.Server, sock: socket.socket, url: str, name: str) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started:  # printed whatever --log-level says: the harness and users wait for it
        print(f"quantgate serve ready at {url} (model {name})", file=sys.stderr, flush=True)
    await serving
