"""A small OpenAI-compatible completions server for the harness tests, run as a real process.

It answers GSM8K-format prompts from a dataset file (the gold answer for a chosen share of
questions, a wrong or unparsable one for the rest; with or without the "#### N" marker) and can
be told to fail the ways a real server fails: exit during start-up, die or hang after N
answers, exit right after its Nth answer went out, answer with HTTP errors or broken 200s
(a body that is not JSON, more choices than prompts, a body that stalls after the headers),
answer as another model, fail GET /v1/kernels, ignore SIGTERM, leave a child process in its
group, or fail to bind its port. It takes the flags the runner passes to `quantgate serve` /
`vllm serve` (MODEL, --host, --port, --served-model-name, --linear-backend, --moe-backend) and
ignores the rest.

    python tests/harness/fake_server.py MODEL --port 8000 --dataset test.jsonl [--accuracy 0.8]
"""

from __future__ import annotations

import argparse
import socket
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KERNEL_CLASSES = {
    "emulation": "EmulationLinearKernel",
    "marlin": "MarlinFp8LinearKernel",
    "triton": "TritonBlockFp8LinearKernel",
    "torch": "TorchScaledMMLinearKernel",
}
MOE_CLASSES = {"emulation": "EmulationMoEKernel", "marlin": "MarlinMoEKernel", "triton": "TritonFusedMoEKernel"}
# What its log names, as vLLM's `Selected <Class> for ...` lines do: vLLM's own classes.
VLLM_KERNEL_CLASSES = {"marlin": "MarlinFP8ScaledMMLinearKernel", "triton": "TritonFp8BlockScaledMMKernel",
                       "torch": "BlockWiseTorchFP8ScaledMMLinearKernel", "cutlass": "CutlassFp8BlockScaledMMKernel"}
LINEAR_MODULES = [f"model.layers.{i}.{m}" for i in range(2) for m in
                  ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--linear-backend", default="emulation")
    p.add_argument("--moe-backend", default=None, help="report MoE modules too (vLLM-style log line)")
    p.add_argument("--dataset", required=True, help="GSM8K-format jsonl whose questions it answers")
    p.add_argument("--accuracy", type=float, default=1.0, help="share answered correctly")
    p.add_argument("--invalid", type=float, default=0.0, help="share of the wrong ones answered with no '#### N'")
    p.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--exit-during-startup", type=float, default=None, help="exit 1 after this many seconds")
    p.add_argument("--die-after", type=int, default=None, help="exit abruptly after N answers")
    p.add_argument("--exit-after-answers", type=int, default=None,
                   help="exit (status 4) right after the Nth answer has been sent: every request answered, the "
                        "server gone before the evaluation ends")
    p.add_argument("--plain-answers", action="store_true",
                   help="answer 'The answer is N.' without GSM8K's '#### N' (strict-match finds nothing, "
                        "flexible-extract finds N)")
    p.add_argument("--hang-after", type=int, default=None, help="never answer after N answers")
    p.add_argument("--error-after", type=int, default=None, help="HTTP errors after N answers")
    p.add_argument("--error-status", type=int, default=500)
    p.add_argument("--retry-after", type=float, default=None, help="the errors carry this Retry-After header")
    p.add_argument("--error-message", default="injected failure", help="the errors' message")
    p.add_argument("--malformed", choices=sorted(MALFORMED), default=None,
                   help="after --error-after N answers, answer 200 with this broken body instead of an error")
    p.add_argument("--broken", choices=BROKEN, default=None,
                   help="after --error-after N answers, answer 200 this way instead of an error: invalid_json, "
                        "html (a proxy's page), extra_choice (one choice more than prompts), stall_body (the "
                        "headers, then --stall-s seconds before the body), trickle_body (the body a byte every --stall-s "
                        "seconds)")
    p.add_argument("--stall-s", type=float, default=30.0, help="--broken stall_body: seconds before the body; trickle_body: between its bytes")
    p.add_argument("--finish-reason", default="stop", help="every completion's finish_reason (length: cut at "
                                                          "max_tokens; null: none given, as some servers do)")
    p.add_argument("--answer-as", default=None,
                   help="completions name this model, not the one asked for (a proxy answering from another model)")
    p.add_argument("--kernels-status", type=int, default=None, help="answer GET /v1/kernels with this error status")
    p.add_argument("--kernels-status-times", type=int, default=None,
                   help="answer only the first N GET /v1/kernels with --kernels-status (a transient error)")
    p.add_argument("--no-kernels-endpoint", action="store_true", help="404 on /v1/kernels, like vLLM")
    p.add_argument("--late-kernel", default=None,
                   help="on the first request, log that this backend's kernel serves the first linear module too "
                        "(vLLM logs some choices at the first forward)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or None,
                   help="401 on /v1/* without 'Authorization: Bearer KEY', like vLLM (which reads VLLM_API_KEY too)")
    p.add_argument("--log-requests", action="store_true",
                   help="log each completion request's max_tokens, temperature, seed and stop (a test checks what "
                        "the harness sent)")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--note-sigterm", action="store_true",
                   help="ignore SIGTERM, logging 'fake server: SIGTERM received' each time (a test sees teardown "
                        "begin)")
    p.add_argument("--spawn-child", action="store_true", help="leave a sleeping child in the process group")
    p.add_argument("--spawn-setsid-child", action="store_true",
                   help="leave a child that ignores SIGTERM in a session of its own, outside the process group")
    p.add_argument("--spawn-daemon", action="store_true",
                   help="double-fork a daemon that ignores SIGTERM (fork, setsid, fork, the middle one exits)")
    p.add_argument("--serve-as", default=None, help="serve this name whatever --served-model-name says")
    p.add_argument("--no-models-endpoint", action="store_true", help="404 on /v1/models")
    p.add_argument("--model-root", default=None, help="the `root` /v1/models gives (vLLM: the model's path)")
    p.add_argument("--strict-args", action="store_true", help="refuse unknown flags as vLLM's argparse does (exit 2)")
    p.add_argument("--validation-error", action="store_true",
                   help="exit as vLLM does when pydantic refuses its config (a ValidationError traceback)")
    args, unknown = p.parse_known_args(argv)
    if args.strict_args and unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


# 200s that hold no answer (lm-eval alone would score each as a wrong answer); argument: chat or not.
MALFORMED: dict[str, Callable[[bool], dict]] = {
    "null_text": lambda chat: {"choices": [{"index": 0, "finish_reason": "stop",
                                            **({"message": {"role": "assistant", "content": None}} if chat
                                               else {"text": None})}]},
    "no_choices": lambda chat: {"choices": []},
    "error_body": lambda chat: {"error": {"message": "injected failure in a 200", "type": "server_error"}},
}
# 200s that are no OpenAI completion response at all, or whose body never comes (`--broken`).
BROKEN = ["invalid_json", "html", "extra_choice", "stall_body", "trickle_body"]


def _answer_of(answer_field: str) -> str:
    return answer_field.rsplit("####", 1)[1].strip()


def _last_question(prompt: str) -> str:
    tail = prompt.rsplit("Question:", 1)[-1]
    return tail.rsplit("Answer:", 1)[0].strip()


def _share(question: str) -> float:
    """A deterministic number in [0, 1) per question, so runs are reproducible."""
    return int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 2**32


class FakeEngine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.served = args.serve_as or args.served_model_name or args.model
        with open(args.dataset) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        self.gold = {row["question"].strip(): _answer_of(row["answer"]) for row in rows}
        self.answered = 0
        self.sent = 0  # answers whose response has been written
        self.kernel_requests = 0
        self.lock = threading.Lock()

    def kernels_refused(self) -> bool:
        """Whether this GET /v1/kernels gets --kernels-status (each, or the first --kernels-status-times)."""
        with self.lock:
            self.kernel_requests += 1
            times = self.args.kernels_status_times
            return self.args.kernels_status is not None and (times is None or self.kernel_requests <= times)

    def sent_one(self) -> None:
        """--exit-after-answers: the process ends once its Nth answer is on the wire."""
        with self.lock:
            self.sent += 1
            if self.args.exit_after_answers is not None and self.sent >= self.args.exit_after_answers:
                print(f"fake server: exiting after {self.sent} answers as told", flush=True)
                os._exit(4)

    def text_for(self, prompt: str) -> str:
        question = _last_question(prompt)
        gold = self.gold.get(question)
        if gold is None:
            return " I do not know this one."
        share = _share(question)
        if share < self.args.accuracy:
            answer = gold
        elif share < self.args.accuracy + (1 - self.args.accuracy) * self.args.invalid:
            return " The answer is unclear."
        else:
            answer = str(int(re.sub(r'[^0-9-]', '', gold) or 0) + 1)
        if self.args.plain_answers:
            return f" Working it out step by step. The answer is {answer}."
        return f" Working it out step by step.\n#### {answer}"

    def kernels(self) -> dict:
        backend = self.args.linear_backend.replace("_", "-").lower()
        kernel = KERNEL_CLASSES.get(backend, f"{backend.title()}LinearKernel")
        modules = {name: {"layer": "linear", "scheme": "fp8-block", "kernel": kernel, "backend": backend,
                          "rejected": []} for name in LINEAR_MODULES}
        modules["lm_head"] = {"layer": "linear", "scheme": "unquantized", "kernel": "UnquantizedLinearKernel",
                              "backend": "torch", "rejected": []}
        if self.args.moe_backend:
            moe = self.args.moe_backend.lower()
            for i in range(2):
                modules[f"model.layers.{i}.mlp.experts"] = {"layer": "moe", "scheme": "fp8-block",
                                                            "kernel": MOE_CLASSES.get(moe, moe), "backend": moe,
                                                            "rejected": []}
        return {"platform": {"device": "cpu", "capability": None}, "modules": modules}


def _handler(engine: FakeEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # access log to stdout (the server log)
            print(f"{self.address_string()} - {fmt % args}", flush=True)

        def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _write(self, data: bytes, content_type: str = "application/json", stall_s: float = 0.0,
                   per_byte_s: float = 0.0) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.flush()
            time.sleep(stall_s)
            for chunk in [data[i:i + 1] for i in range(len(data))] if per_byte_s else [data]:
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(per_byte_s)

        def _broken(self, kind: str, body: dict) -> None:
            """--broken: a 200 that is not a completion response, or one whose body stalls."""
            prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [body.get("prompt", "")]
            good = {"id": "cmpl-broken", "object": "text_completion", "model": engine.served,
                    "choices": [{"index": i, "text": engine.text_for(p), "finish_reason": "stop"}
                                for i, p in enumerate(prompts)]}
            if kind == "invalid_json":
                self._write(b'{"id": "cmpl-broken", "choices": [{"index": 0, "text": "#### 1"')
            elif kind == "html":
                self._write(b"<html><body>502 Bad Gateway</body></html>", "text/html")
            elif kind == "extra_choice":
                good["choices"].append({"index": len(prompts), "text": " #### 0", "finish_reason": "stop"})
                self._send(200, good)
            elif kind == "stall_body":
                self._write(json.dumps(good).encode(), stall_s=engine.args.stall_s)
            elif kind == "trickle_body":
                self._write(json.dumps(good).encode(), per_byte_s=engine.args.stall_s)

        def _refused(self) -> bool:
            """vLLM's and quantgate serve's --api-key: /v1/* needs the bearer token."""
            key = engine.args.api_key
            if key is None or not self.path.startswith("/v1/") or self.headers.get("Authorization") == f"Bearer {key}":
                return False
            self._send(401, {"error": {"message": "Unauthorized", "type": "authentication_error"}})
            return True

        def do_GET(self) -> None:
            if self._refused():
                return
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models" and not engine.args.no_models_endpoint:
                card = {"id": engine.served, "object": "model"}
                self._send(200, {"object": "list", "data": [{**card, "root": engine.args.model_root} if
                                                            engine.args.model_root else card]})
            elif self.path == "/v1/kernels" and engine.kernels_refused():
                self._send(engine.args.kernels_status, {"error": {"message": "busy", "type": "server_error"}})
            elif self.path == "/v1/kernels" and not engine.args.no_kernels_endpoint:
                self._send(200, engine.kernels())
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self._refused():
                return
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            if body.get("model") != engine.served:
                self._send(404, {"error": {"message": f"model {body.get('model')!r} not served", "type": "not_found"}})
                return
            args = engine.args
            if args.log_requests:
                sent = {key: body.get(key) for key in ("max_tokens", "temperature", "seed", "stop")}
                sys.stdout.write(f"fake server: request {json.dumps(sent)}\n")  # one write: handlers run in threads
                sys.stdout.flush()
            with engine.lock:
                seen = engine.answered
                if args.die_after is not None and seen >= args.die_after:
                    print("fake server: dying mid-evaluation as told", flush=True)
                    os._exit(3)
                if args.hang_after is not None and seen >= args.hang_after:
                    hang = True
                else:
                    hang = False
                    engine.answered += 1
                if args.late_kernel and seen == 0:
                    kernel = VLLM_KERNEL_CLASSES.get(args.late_kernel, args.late_kernel)
                    print(f"INFO [fake] Selected {kernel} for {LINEAR_MODULES[0]}", flush=True)
            if hang:
                time.sleep(3600)
            if args.error_after is not None and seen >= args.error_after:
                if args.broken is not None:
                    self._broken(args.broken, body)
                    return
                if args.malformed is not None:
                    self._send(200, MALFORMED[args.malformed](self.path == "/v1/chat/completions"))
                    return
                retry_after = {"Retry-After": str(args.retry_after)} if args.retry_after is not None else None
                self._send(args.error_status, {"error": {"message": args.error_message, "type": "server_error"}},
                           retry_after)
                return
            time.sleep(args.latency)
            usage = {"prompt_tokens": 0, "completion_tokens": 0}
            answered_as = args.answer_as or engine.served
            finish_reason = None if args.finish_reason == "null" else args.finish_reason
            if self.path == "/v1/chat/completions":  # the last user turn holds the question
                question = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
                message = {"role": "assistant", "content": engine.text_for(question)}
                self._send(200, {"id": f"chat-{seen}", "object": "chat.completion", "model": answered_as,
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                                 "usage": usage})
                engine.sent_one()
                return
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            choices = [{"index": i, "text": engine.text_for(p), "finish_reason": finish_reason, "logprobs": None}
                       for i, p in enumerate(prompts)]
            self._send(200, {"id": f"cmpl-{seen}", "object": "text_completion", "model": answered_as,
                             "choices": choices, "usage": usage})
            engine.sent_one()

    return Handler


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    print(f"fake server: starting for {args.model} on {args.host}:{args.port}", flush=True)
    if args.api_key:  # vLLM logs its non-default args at start-up, the key among them
        print(f"INFO [fake] non-default args: {{'api_key': {args.api_key!r}}}", flush=True)
    if args.ignore_sigterm:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("fake server: ignoring SIGTERM", flush=True)  # from here on, a test may signal it
    if args.note_sigterm:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"fake server: SIGTERM received\n"))
    if args.spawn_child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if args.spawn_setsid_child:
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"],
                                 start_new_session=True)
        print(f"fake server: setsid child pid {child.pid}", flush=True)
    if args.spawn_daemon:
        middle = subprocess.run(
            [sys.executable, "-c", "import os, signal, time\nos.setsid()\nif os.fork():\n    os._exit(0)\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(os.getpid(), flush=True)\n"
             "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\ntime.sleep(3600)"],  # the pipe ends: run() returns
            stdout=subprocess.PIPE, text=True, check=True)
        print(f"fake server: daemon pid {middle.stdout.split()[0]}", flush=True)
    if args.validation_error:
        import pydantic

        class ModelConfig(pydantic.BaseModel):
            max_model_len: int

        ModelConfig(max_model_len="many")
    if args.exit_during_startup is not None:
        time.sleep(args.exit_during_startup)
        print("RuntimeError: fake server failed to load the model (as told)", flush=True)
        return 1
    time.sleep(args.startup_delay)
    engine = FakeEngine(args)
    for name, entry in engine.kernels()["modules"].items():
        if entry["layer"] == "linear" and entry["scheme"] != "unquantized":  # as vLLM logs them
            print(f"INFO [fake] Selected {VLLM_KERNEL_CLASSES.get(entry['backend'], entry['kernel'])} for {name}",
                  flush=True)
    if args.moe_backend:
        print(f"INFO [fake] Using {args.moe_backend.title()} Fp8 MoE backend", flush=True)
    if ":" in args.host:  # an IPv6 literal, as `--host ::1`
        ThreadingHTTPServer.address_family = socket.AF_INET6
    server = ThreadingHTTPServer((args.host, args.port), _handler(engine))  # EADDRINUSE ends the process
    server.daemon_threads = True
    print(f"fake server: ready on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
