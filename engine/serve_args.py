"""The flags of `quantgate serve` (SPEC section 6), defined once for the server and for the
harness, which checks an eval config's `server_args` against them before anything starts
(`usage_problem`). Light to import: the kernel registry (torch) loads only when a backend flag
is parsed.

Flag names are vLLM's, and like vLLM's parser `--max_model_len` means `--max-model-len`.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable

EXIT_ERROR = 2  # retryable: the environment (port, device memory) may be different next time
EXIT_USAGE = 3  # the command line or the model is wrong: never retried

DTYPES = ("auto", "bfloat16", "float16", "float32")
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
LOG_LEVELS = ("debug", "info", "warning", "error")
FOLDER_CONTENTS = "config.json, *.safetensors, tokenizer.json"


def normalize_flags(argv: list[str]) -> list[str]:
    """`--flag_name[=value]` -> `--flag-name[=value]`; values and positionals unchanged."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            head, eq, tail = arg.partition("=")
            arg = head.replace("_", "-") + eq + tail
        out.append(arg)
    return out


def _backend(layer: str, flag: str):
    def parse(value: str) -> str:
        if value.strip().lower() == "auto":  # the default, which argparse also parses: no torch import for it
            return "auto"
        from quantgate.kernels import LINEAR_BACKENDS, MOE_BACKENDS, UnknownBackendError, normalize_backend

        try:
            return normalize_backend(value, LINEAR_BACKENDS if layer == "linear" else MOE_BACKENDS, flag)
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


# vLLM's human_readable_int (vllm/utils/argparse_utils.py): lowercase suffixes are decimal and take
# decimals (25.6k = 25600), uppercase ones binary and whole (4K = 4096). The same arithmetic
# (float product, truncated), so one server_args gives both engines the same length.
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_MAX_MODEL_LEN_FORMS = "an integer (4096), k/m/g thousands (4k = 4000, 25.6k = 25600), K/M/G 1024s (4K = 4096) or auto"


def _tokens_or_auto(flag: str):
    """vLLM's human_readable_int_or_auto: None (the model's own length) for `auto` or -1."""

    def parse(value: str) -> int | None:
        text = value.strip()
        if text == "-1" or text.lower() == "auto":
            return None
        match = _HUMAN_INT.fullmatch(text)
        try:
            if match is None:
                number = int(text)
            elif match[2] in _DECIMAL_SUFFIX:
                number = int(float(match[1]) * _DECIMAL_SUFFIX[match[2]])
            else:
                number = int(match[1]) * _BINARY_SUFFIX[match[2]]
        except ValueError:
            hint = f" (decimals take a lowercase suffix: {match[1]}{match[2].lower()})" if match else ""
            raise argparse.ArgumentTypeError(f"{value!r} is not a token count{hint}; give {_MAX_MODEL_LEN_FORMS} "
                                             "(the model's own length)") from None
        if not 1 <= number <= 2**31 - 1:
            raise argparse.ArgumentTypeError(f"{value!r} is {number} tokens, out of range for {flag} "
                                             f"(1..{2**31 - 1}); or give auto for the model's own length")
        return number

    parse.__name__ = flag
    return parse


def register(parser: argparse.ArgumentParser, fail: Callable[[str], None] | None = None) -> None:
    """The flags, on `parser`; its errors go to `fail` (default: argparse's print and exit)."""
    # No abbreviations (`--api-k`): the harness reads --api-key, --port... from server_args by name.
    parser.allow_abbrev = False
    parser.add_argument("model", help=f"Hugging Face model folder ({FOLDER_CONTENTS})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_int_in(0, 65535, "--port"), default=8000,
                        help="port to listen on (default 8000; 0 picks a free one, printed in the ready line)")
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME",
                        help="name(s) clients use in 'model'; the first is reported (default: MODEL as given)")
    parser.add_argument("--linear-backend", type=_backend("linear", "--linear-backend"), default="auto",
                        help="linear kernel backend (`quantgate kernels` lists them; default auto)")
    parser.add_argument("--moe-backend", type=_backend("moe", "--moe-backend"), default="auto",
                        help="MoE kernel backend (`quantgate kernels` lists them; default auto)")
    parser.add_argument("--dtype", type=_dtype, default="auto",
                        help=f"activation dtype: {', '.join(DTYPES)} (default auto: the checkpoint's)")
    parser.add_argument("--max-model-len", type=_tokens_or_auto("--max-model-len"),
                        help=f"longest prompt + completion in tokens: {_MAX_MODEL_LEN_FORMS} "
                             "(default auto: the model's)")
    parser.add_argument("--max-num-seqs", type=_int_in(1, 2**16, "--max-num-seqs"),
                        help="most requests in the running batch (default: the engine's)")
    parser.add_argument("--seed", type=int, default=0, help="engine seed for requests without their own")
    # vLLM's is a BooleanOptionalAction, so configs may say --no-enforce-eager.
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                        help="no CUDA graphs (default: graphs on CUDA)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model runs (auto: cuda when available, else cpu)")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize "
                                          "and /tokenizer_info (/health and /metrics stay open)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=_int_in(1, 2**16, "--tensor-parallel-size"),
                        default=1, help="only 1: use `engine: vllm` for tensor parallelism")
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info",
                        help="server log verbosity (the `Selected <Kernel> for <module>` lines are info)")
    parser.error = _flag_error(parser, fail or parser.error)  # type: ignore[method-assign]


def _flag_error(parser: argparse.ArgumentParser, fail: Callable[[str], None]) -> Callable[[str], None]:
    """argparse's message, except that unknown flags are listed with a did-you-mean and the
    known flags (eval configs often carry vLLM flags this engine does not have)."""
    known = sorted({s for action in parser._actions for s in action.option_strings if s.startswith("--")})

    def error(message: str) -> None:
        prefix = "unrecognized arguments:"
        if message.startswith(prefix):
            unknown = [a.split("=", 1)[0] for a in message[len(prefix):].split() if a.startswith("-")]
            hints = []
            for flag in unknown or message[len(prefix):].split():
                # Compared without the dashes every flag shares: they made --kv-cache-dtype "close" to --dtype.
                close = difflib.get_close_matches(flag.lstrip("-"), [k[2:] for k in known], n=1, cutoff=0.6)
                hints.append(f"{flag} (did you mean --{close[0]}?)" if close else flag)
            message = (f"unknown flag(s): {', '.join(hints)}. Known flags: {', '.join(known)}. "
                       "A vLLM-only flag needs `engine: vllm` in the eval config")
        fail(message)

    return error


def static_problem(args: argparse.Namespace) -> str | None:
    """What parsed flags ask for that this engine never does, on any machine."""
    if args.tensor_parallel_size != 1:
        return (f"--tensor-parallel-size {args.tensor_parallel_size} is not supported: quantgate serve runs one "
                "device; set `engine: vllm` in the eval config for tensor parallelism")
    return None


class _Refused(Exception):
    pass


def _refuse(message: str) -> None:
    raise _Refused(message)


def usage_problem(server_args: list[str]) -> str | None:
    """Why `quantgate serve MODEL <server_args>` would refuse its flags (its own message), or
    None. Nothing starts and no model is read."""
    parser = argparse.ArgumentParser(prog="quantgate serve", add_help=False)
    register(parser, fail=_refuse)
    try:
        args = parser.parse_args(["MODEL", *normalize_flags(list(server_args))])
    except _Refused as exc:
        return str(exc)
    return static_problem(args)
