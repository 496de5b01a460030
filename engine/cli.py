"""`quantgate serve MODEL [flags]`: the built-in OpenAI-compatible server (SPEC section 6).

Flags carry vLLM's names so an eval config's `server_args` read the same for both engines.
Everything a user can get wrong fails before /health ever answers, with one line naming the
cause and the fix: flags (exit 3), the model folder and kernel selection (exit 3), the port
(exit 2: the retryable class, as another run may hold it).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import errno
import logging
import socket
import sys
from pathlib import Path

import uvicorn

from quantgate.kernels import (
    LINEAR_BACKENDS,
    MOE_BACKENDS,
    KernelSelectionError,
    Platform,
    UnknownBackendError,
    normalize_backend,
)

from . import AsyncEngine, LLMEngine, load_model
from .server import ServerSettings, build_app

EXIT_ERROR = 2  # retryable: the environment (port, device memory) may be different next time
EXIT_USAGE = 3  # the command line or the model is wrong: never retried

DTYPES = ("auto", "bfloat16", "float16", "float32")
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
LOG_LEVELS = ("debug", "info", "warning", "error")
FOLDER_CONTENTS = "config.json, *.safetensors, tokenizer.json"

log = logging.getLogger("quantgate.engine.serve")


def _backend(known: tuple[str, ...], flag: str):
    def parse(value: str) -> str:
        try:
            return normalize_backend(value, known, flag)
        except UnknownBackendError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = flag  # argparse names the type in its messages
    return parse


def _dtype(value: str) -> str:
    name = DTYPE_ALIASES.get(value.lower(), value.lower())
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {value!r} (known: {', '.join(DTYPES)})")
    return name


def _int_in(low: int, high: int, what: str):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{number} is out of range for {what} ({low}..{high})")
        return number

    return parse


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=f"Hugging Face model folder ({FOLDER_CONTENTS})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_int_in(0, 65535, "--port"), default=8000,
                        help="port to listen on (default 8000; 0 picks a free one, printed in the ready line)")
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME",
                        help="name(s) clients use in 'model'; the first is reported (default: MODEL as given)")
    parser.add_argument("--linear-backend", type=_backend(LINEAR_BACKENDS, "--linear-backend"), default="auto",
                        help=f"linear kernel backend: {', '.join(LINEAR_BACKENDS)} (default auto)")
    parser.add_argument("--moe-backend", type=_backend(MOE_BACKENDS, "--moe-backend"), default="auto",
                        help=f"MoE kernel backend: {', '.join(MOE_BACKENDS)} (default auto)")
    parser.add_argument("--dtype", type=_dtype, default="auto",
                        help=f"activation dtype: {', '.join(DTYPES)} (default auto: the checkpoint's)")
    parser.add_argument("--max-model-len", type=_int_in(1, 2**31 - 1, "--max-model-len"),
                        help="longest prompt + completion in tokens (default: the model's)")
    parser.add_argument("--max-num-seqs", type=_int_in(1, 2**16, "--max-num-seqs"),
                        help="most requests in the running batch (default: the engine's)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed for requests without their own")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument("--tensor-parallel-size", "-tp", type=_int_in(1, 2**16, "--tensor-parallel-size"),
                        default=1, help="only 1: use `engine: vllm` for tensor parallelism")
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")
    parser.error = _unknown_flag_error(parser)  # type: ignore[method-assign]


def _unknown_flag_error(parser: argparse.ArgumentParser):
    """argparse's own error, except that unknown flags are listed with a did-you-mean and the
    known flags (eval configs often carry vLLM flags this engine does not have)."""
    default_error = parser.error
    known = sorted({s for action in parser._actions for s in action.option_strings if s.startswith("--")})

    def error(message: str) -> None:
        prefix = "unrecognized arguments:"
        if message.startswith(prefix):
            unknown = [a.split("=", 1)[0] for a in message[len(prefix):].split() if a.startswith("-")]
            hints = []
            for flag in unknown or message[len(prefix):].split():
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                hints.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
            message = (f"unknown flag(s): {', '.join(hints)}. Known flags: {', '.join(known)}. "
                       "A vLLM-only flag needs `engine: vllm` in the eval config")
        default_error(message)

    return error


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
    if args.tensor_parallel_size != 1:
        return _fail(f"--tensor-parallel-size {args.tensor_parallel_size} is not supported: quantgate serve runs "
                     "one device; set `engine: vllm` in the eval config for tensor parallelism", EXIT_USAGE)
    problem = _check_model_dir(args.model)
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
    finally:
        sock.close()


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
    except ValueError as exc:  # e.g. --max-model-len above what the model or the KV budget allows
        return _fail(str(exc), EXIT_USAGE)
    async_engine = AsyncEngine(engine)
    names = tuple(args.served_model_name or [args.model])
    settings = ServerSettings(served_model_names=names, max_model_len=engine.max_model_len,
                              api_key=args.api_key)
    app = build_app(async_engine, loaded, settings)
    config = uvicorn.Config(app, log_config=None, log_level=args.log_level, access_log=args.log_level == "debug",
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
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
