"""`quantgate serve` as a user runs it: a real process, flags, start-up failures with one clear
line and the right exit code, the log, the unchanged `openai` client, disconnects, shutdown."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from quantgate.harness.cli import main as cli_main

from .test_server import build_tiny_qwen3, metric

pytestmark = pytest.mark.slow
API_KEY = "test-key"
LONG_ANSWER = 1500  # tokens; several seconds of decoding, so an abort is visible


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "quantgate.harness.cli", "serve", *args]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("serve-model"), max_position_embeddings=2048)


# ---- start-up failures: one line, naming cause and fix, before /health ever answers -------------------


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert lines, stderr
    return lines[-1]


@pytest.mark.parametrize("args,pattern", [
    (("--gpu-memory-utilization", "0.9"),
     r"unknown flag\(s\): --gpu-memory-utilization\. Known flags: .*--max-model-len.*engine: vllm"),
    (("--max-model-length", "64"), r"--max-model-length \(did you mean --max-model-len\?\)"),
    (("--linear-backend", "marlinn"), r"unknown --linear-backend 'marlinn'; did you mean 'marlin'\?"),
    (("--moe-backend", "Triton_"), r"unknown --moe-backend 'Triton_'; did you mean 'triton'\?"),
    (("--dtype", "int8"), r"unknown dtype 'int8'"),
    (("--tensor-parallel-size", "2"), r"--tensor-parallel-size 2 is not supported.*engine: vllm"),
    (("--port", "70000"), r"70000 is out of range for --port"),
])
def test_usage_errors(model_dir: Path, capsys: pytest.CaptureFixture, args: tuple[str, ...], pattern: str) -> None:
    assert cli_main(["serve", str(model_dir), *args]) == 3
    err = capsys.readouterr().err
    assert re.search(pattern, error_line(err)), err


def test_missing_model_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["serve", str(tmp_path / "nope")]) == 3
    assert re.search(r"model folder .*nope does not exist", error_line(capsys.readouterr().err))
    assert cli_main(["serve", str(tmp_path)]) == 3
    assert "has no config.json" in error_line(capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["serve", str(model_dir), "--device", "cuda"]) == 3
    assert re.search(r"--device cuda was requested but torch sees no CUDA device.*--device cpu",
                     error_line(capsys.readouterr().err))


def test_help_lists_the_vllm_flags(capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--served-model-name", "--linear-backend", "--moe-backend", "--dtype",
                 "--max-model-len", "--max-num-seqs", "--seed", "--enforce-eager", "--device", "--api-key",
                 "--tensor-parallel-size", "--log-level"):
        assert flag in out


@pytest.fixture(scope="module")
def load_failures(model_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    """Failures found while starting for real, launched together (each pays for a Python start)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    cases = {
        "port in use": ("--port", str(taken.getsockname()[1])),
        "kernel selection": ("--linear-backend", "marlin", "--port", "0"),
        "max model len": ("--max-model-len", "100000", "--port", "0"),
    }
    procs = {name: subprocess.Popen(serve_command(str(model_dir), "--device", "cpu", *args), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name, args in cases.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    taken.close()
    return results


@pytest.mark.parametrize("case,code,pattern", [
    ("port in use", 2, r"port \d+ on 127\.0\.0\.1 is already in use.*--port"),
    ("kernel selection", 3, r"kernel selection failed: .*MarlinFp8LinearKernel: .*--linear-backend"),
    ("max model len", 3, r"--max-model-len 100000 must be between"),
])
def test_load_failures(load_failures, case: str, code: int, pattern: str) -> None:
    result = load_failures[case]
    assert result.returncode == code, result.stderr
    assert re.search(pattern, error_line(result.stderr)), result.stderr
    assert "ready at" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_an_unreadable_model_file_is_a_usage_error_naming_it(model_dir: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from .test_config import deny_reading

    deny_reading(monkeypatch, name)
    assert cli_main(["serve", str(model_dir), "--device", "cpu", "--port", "0"]) == 3
    assert f"{model_dir / name} cannot be read (permission denied" in error_line(capsys.readouterr().err)


def test_a_kv_budget_the_device_cannot_give_now_is_retryable(model_dir: Path, capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget is a share of the memory free after loading: another process may hold it now.
    from quantgate.engine import cli
    from quantgate.engine.kv_cache import KVCacheBudgetError

    def no_room(*args, **kwargs):
        raise KVCacheBudgetError("the KV cache budget of 10 MiB cannot hold one sequence")

    monkeypatch.setattr(cli, "LLMEngine", no_room)
    assert cli_main(["serve", str(model_dir), "--device", "cpu", "--port", "0"]) == 2
    assert "other processes on this device may hold its memory" in error_line(capsys.readouterr().err)


# ---- a live server ---------------------------------------------------------------------------------


class LiveServer:
    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            serve_command(str(model_dir), "--port", "0", "--device", "cpu", "--dtype", "float32",
                          "--served-model-name", "tiny", "--api-key", API_KEY, "--max-num-seqs", "4"),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            # as from a terminal: a test run in a background job would pass SIGINT on ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.url = self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"ready at (http://\S+)", self.log_path.read_text())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            time.sleep(0.1)
        raise AssertionError(f"server not ready in {timeout}s:\n{self.log_path.read_text()}")

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.log.close()


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    live = LiveServer(model_dir, tmp_path_factory.mktemp("serve-log") / "server.log")
    yield live
    if live.proc.poll() is None:
        live.proc.kill()
        live.proc.wait()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def test_log_names_every_kernel_and_ends_ready(server: LiveServer) -> None:
    log = server.log_path.read_text()
    kernels = httpx.get(f"{server.url}/v1/kernels", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    for module, entry in kernels["modules"].items():
        assert f"Selected {entry['kernel']} for {module}" in log
    assert re.search(r"ready at http://127\.0\.0\.1:\d+ \(model tiny\)", log)


def test_openai_client_completions(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    result = client.completions.create(model="tiny", prompt="Ava has 3 apples", max_tokens=5, temperature=0,
                                       logprobs=2, echo=True)
    choice = result.choices[0]
    assert choice.text.startswith("Ava has 3 apples")
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == len(choice.logprobs.top_logprobs)
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    stream = client.completions.create(model="tiny", prompt="Ava has 3 apples", max_tokens=5, temperature=0,
                                       stream=True)
    assert "Ava has 3 apples" + "".join(chunk.choices[0].text for chunk in stream) == choice.text


def test_openai_client_chat(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    result = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=1)
    message = result.choices[0].message
    assert message.role == "assistant" and result.choices[0].finish_reason in ("stop", "length")
    assert len(result.choices[0].logprobs.content) == result.usage.completion_tokens
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content
    assert chunks[-1].usage.completion_tokens == result.usage.completion_tokens


def test_openai_client_errors(server: LiveServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny", prompt="x", max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        client.completions.create(model="tiny", prompt="x", max_tokens=1, n=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_lm_eval_local_completions_with_the_remote_tokenizer(server: LiveServer, client: openai.OpenAI,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval's `local-completions` finds /tokenizer_info and /tokenize, scores and generates."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.utils import RemoteTokenizer

    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model="tiny", tokenizer_backend="auto",
                             auth_token=API_KEY, num_concurrent=2, max_retries=1)
    assert isinstance(lm.tokenizer, RemoteTokenizer)
    context, continuation = "Ava has", " 3 apples"
    [(logprob, _)] = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    echo = client.completions.create(model="tiny", prompt=context + continuation, max_tokens=1, temperature=0,
                                     logprobs=1, echo=True).choices[0].logprobs
    n_context = len(lm.tokenizer.encode(context))
    assert logprob == pytest.approx(sum(echo.token_logprobs[n_context:-1]), abs=1e-4)
    [text] = lm.generate_until([Instance("generate_until", {}, ("Question: 1+1", {"until": ["\n"], "max_gen_toks": 8}),
                                         0)])
    assert isinstance(text, str) and "\n" not in text


def wait_until_idle(server: LiveServer, timeout: float = 10) -> float:
    """Seconds until the engine runs nothing."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if metric(server.metrics(), "quantgate_num_requests_running") == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError("the engine still runs the abandoned request")


def generated_total(server: LiveServer) -> float:
    return metric(server.metrics(), "quantgate_generation_tokens_total")


def test_disconnect_aborts_a_stream(server: LiveServer) -> None:
    before = generated_total(server)
    body = {"model": "tiny", "prompt": "Count:", "max_tokens": LONG_ANSWER, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    wait_until_idle(server)
    assert generated_total(server) - before < LONG_ANSWER / 2


def test_disconnect_aborts_a_plain_request(server: LiveServer) -> None:
    before = generated_total(server)
    body = {"model": "tiny", "prompt": "Count:", "max_tokens": LONG_ANSWER, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=httpx.Timeout(10, read=0.5))
    wait_until_idle(server)
    assert generated_total(server) - before < LONG_ANSWER / 2
    assert 'status="499"' in server.metrics()


def test_sigterm_shuts_down_gracefully(server: LiveServer) -> None:
    # uvicorn finishes its shutdown, then re-raises the signal so the exit status tells why.
    assert server.stop() == -signal.SIGTERM
    log = server.log_path.read_text()
    assert "Finished server process" in log and "Traceback" not in log, log


def test_a_forced_quit_after_sigterm_answers_the_requests_in_flight(model_dir: Path, tmp_path: Path) -> None:
    """SIGTERM (graceful: waits for requests), then Ctrl-C (force): the requests still running get
    a 503 and a stream its error event, as after two Ctrl-Cs, and the log holds no error. SIGTERM's
    default action had killed the process when uvicorn re-raised it, and every client saw the
    connection drop."""
    import concurrent.futures
    import json

    live = LiveServer(model_dir, tmp_path / "server.log")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}

    def plain() -> httpx.Response:
        return httpx.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=120)

    def streamed() -> list[str]:
        with httpx.stream("POST", f"{live.url}/v1/completions", json={**body, "stream": True}, headers=headers,
                          timeout=120) as response:
            return [line for line in response.iter_lines() if line]

    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers, events = pool.submit(plain), pool.submit(streamed)
            deadline = time.monotonic() + 30
            while metric(live.metrics(), "quantgate_num_requests_running") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            live.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # uvicorn waits for the requests; 2000 tokens take seconds
            status = live.stop(signal.SIGINT)
            answer, lines = answers.result(), events.result()
    finally:
        if live.proc.poll() is None:
            live.proc.kill()
            live.proc.wait()
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutting_down", answer.text
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][len("data: "):])["error"]["code"] == \
        "server_shutting_down", lines[-3:]
    assert status in (-signal.SIGINT, -signal.SIGTERM)
    # The forced quit skips uvicorn's lifespan shutdown; its task, cancelled, was logged as an ERROR.
    log = live.log_path.read_text()
    assert "Finished server process" in log and "Traceback" not in log and "ERROR" not in log, log


def test_sigint_shuts_down_as_sigterm_does_without_a_traceback(model_dir: Path, tmp_path: Path) -> None:
    live = LiveServer(model_dir, tmp_path / "server.log")
    try:
        assert live.stop(signal.SIGINT) == -signal.SIGINT
    finally:
        if live.proc.poll() is None:
            live.proc.kill()
            live.proc.wait()
    log = live.log_path.read_text()
    assert "Finished server process" in log and "Traceback" not in log and "KeyboardInterrupt" not in log, log
