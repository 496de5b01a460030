"""Proof of the kernel that ran: the `expect:` block checked against the server's own report.

The built-in engine answers `GET /v1/kernels` (per module: kernel, backend, rejected
candidates). vLLM has no such endpoint; its log says what it chose: `Selected <Kernel> for
<module>` per FP8/INT8 linear kernel choice, `Using <Kernel> for mixed-precision linear` (or
`for <FORMAT> GEMM`) for the others, and `Using <NAME> <FORMAT> MoE backend` (Fp8, NvFp4,
W4A8...) for fused MoE. Either way the report is normalised to `{"source", "platform",
"modules": {name: {layer, scheme, kernel, backend, scale_attr, rejected}}}` and recorded in
result.json (`scheme` and `scale_attr`, the checkpoint name the scales were read from, are None
where a vLLM log does not say).

vLLM's log names the class it selected. A class that picks its kernel per call says so, if at
all, in DEBUG lines: vLLM's `deep_gemm` MoE runs Triton for every shape DeepGEMM refuses (an
expert width N <= 512, as Qwen3-30B-A3B's at TP=2, never runs DeepGEMM). So a deep_gemm MoE
expectation is checked against those lines: the runner starts vLLM with VLLM_LOGGING_LEVEL=DEBUG
(`proof_env`), a refusal for the model's own shape fails the check, and one only for batches
below DeepGEMM's row alignment is recorded as a note (that fallback is the backend's design).

A mismatch fails the run even when accuracy passes, and so does an expectation that cannot
be checked (no report, or no module of that layer): a run that cannot prove its backend
does not prove the config. A report that exists but could not be read (GET /v1/kernels
answering 5xx, timing out: `KernelReportUnavailable`) is no verdict: an ERROR, exit 2.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .backends import (FLAGS, VLLM_DEBUG_ENV, VLLM_MOE_DEBUG_PROOF, canonical, log_name_to_backend,
                       vllm_linear_backend)
from .config import EvalConfig, Expect
from .server import auth_headers

_SELECTED = re.compile(r"Selected (?P<kernel>[A-Za-z_][A-Za-z0-9_]*) for (?P<module>\S+)")
# choose_mp_linear_kernel and the MXFP8/MXFP4/NVFP4 selectors (vllm/model_executor/kernels/linear/__init__.py).
_USING_LINEAR = re.compile(r"Using (?P<kernel>[A-Za-z_][A-Za-z0-9_]*) for "
                           r"(?P<module>mixed-precision linear|CompressedTensorsWNA16|[A-Z][A-Za-z0-9]* GEMM)")
# The MoE oracles (vllm/model_executor/layers/fused_moe/oracle/) name the backend and the format:
# `Using DEEPGEMM Fp8 MoE backend out of ...`, `Using 'FLASHINFER_TRTLLM' NvFp4 MoE backend ...`,
# `Using FlashInfer CUTLASS Unquantized MoE backend ...`, `Using CUTLASS W4A8 MoE backend.` (oracle/w4a8.py,
# which runs CUTLASS whatever --moe-backend says), `Using HUMMING Humming MoE backend out of ...`
# (oracle/humming.py), `Using 'MARLIN' GPTQ-Marlin MoE backend.`, and in older vLLM `Using FlashInfer
# TRTLLM backend for FP8 MoE`. A format missing here makes a MoE model read as one without MoE layers.
# The line after an oracle's, `Using TritonExperts MoE backend`, names a class, with no format: not a
# second choice.
_MOE_FORMATS = (r"(?:Fp8|FP8|NvFp4|NVFP4|Mxfp4|MxFp4|MXFP4|Mxfp8|MxFp8|MXFP8|Int8|INT8|W4A8 Int8|W4A8|WNA16|"
                r"GPTQ-Marlin|Humming|Unquantized)")
_MOE = re.compile(rf"Using '?(?P<name>[A-Za-z0-9_][A-Za-z0-9_ ]*?)'? {_MOE_FORMATS} MoE backend"
                  rf"|Using (?P<name2>[A-Za-z0-9_][A-Za-z0-9_ ]*?) backend for {_MOE_FORMATS} MoE")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEBUG_LINE = re.compile(r"(?:^|\s)DEBUG \d\d-\d\d \d\d:\d\d:\d\d")  # vLLM's `%(levelname)s %(asctime)s ...`
_DEEPGEMM_REFUSED = re.compile(r"DeepGemm disabled.*")
_DEEPGEMM_SMALL_M = re.compile(r"unaligned problem size\. M: (?P<m>\d+), N: (?P<n>\d+), K: (?P<k>\d+)\. "
                               r"M should >= (?P<align>\d+)")
MOE_LOG_MODULE = "fused_moe"  # vLLM's MoE lines name no layer: every MoE choice is filed under this
_SHOWN_MODULES = 6


class KernelReportUnavailable(Exception):
    """GET /v1/kernels failed (a 5xx, a timeout, a refused connection), where a server without the
    endpoint answers 404: what the server ran is unknown, not absent. Retryable (exit 2)."""


# How a server without the endpoint answers (vLLM: 404): it has no kernel report.
_NO_ENDPOINT = (404, 405, 501)
REPORT_ATTEMPTS, REPORT_RETRY_WAIT_S = 3, 1.0


def report_from_server(base_url: str, timeout_s: float = 10.0, api_key: str | None = None,
                       attempts: int = REPORT_ATTEMPTS) -> dict[str, Any] | None:
    """The `/v1/kernels` body, or None when the server has no such endpoint (e.g. vLLM: 404) or
    answers 200 with something else. Any other failure (a 5xx, a timeout, a connection error) is
    tried `attempts` times, then KernelReportUnavailable naming the endpoint and what it answered."""
    url = base_url.rstrip("/") + "/v1/kernels"
    problem = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(REPORT_RETRY_WAIT_S * attempt)
        try:
            response = httpx.get(url, timeout=timeout_s, headers=auth_headers(api_key))
        except httpx.HTTPError as exc:
            problem = f"GET {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
            continue
        if response.status_code in _NO_ENDPOINT:
            return None
        if response.status_code != 200:
            problem = f"GET {url} answered {response.status_code} {response.reason_phrase}".rstrip() + (
                f" ({response.text.strip()[:200]})" if response.text.strip() else "")
            continue
        try:
            body = response.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("modules"), dict):
            return None
        return {"source": "GET /v1/kernels", "platform": body.get("platform"), "modules": body["modules"]}
    raise KernelReportUnavailable(f"{problem} ({attempts} attempt{'s' if attempts != 1 else ''})")


def _add_choice(modules: dict[str, dict[str, Any]], module: str, entry: dict[str, Any]) -> None:
    """`module`'s first kernel under its name, each other distinct kernel under `<module>#2`,
    `#3`...: vLLM names a method class, not a layer (one line per distinct argument set, repeated
    by every TP worker), so a later line must never hide an earlier, different choice."""
    key, n = module, 1
    while key in modules:
        if modules[key]["kernel"] == entry["kernel"]:
            return
        n += 1
        key = f"{module}#{n}"
    modules[key] = entry


def report_from_vllm_log(log: str | Iterable[str]) -> dict[str, Any] | None:
    """Kernel choices from a vLLM server log, its text or its lines (a log of gigabytes is read a
    line at a time: neither pattern spans lines); None when it names none."""
    modules: dict[str, dict[str, Any]] = {}
    moe_names: dict[str, None] = {}  # filed after every linear choice, in the order first seen
    deepgemm_refusals: dict[str, None] = {}
    debug_logged = False
    architecture = None
    for line in log.splitlines() if isinstance(log, str) else log:
        architecture = architecture or next((m["arch"] for m in _ARCHITECTURE.finditer(line)), None)
        for match in [*_SELECTED.finditer(line), *_USING_LINEAR.finditer(line)]:
            kernel = match["kernel"]
            _add_choice(modules, match["module"], {"layer": "linear", "scheme": None, "kernel": kernel,
                                                   "backend": vllm_linear_backend(kernel), "scale_attr": None,
                                                   "rejected": []})
        moe_names.update(dict.fromkeys(match["name"] or match["name2"] for match in _MOE.finditer(line)))
        if not debug_logged or "DeepGemm" in line:
            plain = _ANSI.sub("", line)
            debug_logged = debug_logged or bool(_DEBUG_LINE.search(plain))
            deepgemm_refusals.update(dict.fromkeys(m.group(0).strip() for m in _DEEPGEMM_REFUSED.finditer(plain)))
    for name in moe_names:
        _add_choice(modules, MOE_LOG_MODULE, {"layer": "moe", "scheme": None, "kernel": name,
                                              "backend": log_name_to_backend(name), "scale_attr": None,
                                              "rejected": []})
    if not modules:
        return None
    return {"source": "server log", "platform": None, "modules": modules, "debug_logged": debug_logged,
            "deepgemm_refusals": list(deepgemm_refusals), "architecture": architecture}


# vLLM's `Resolved architecture: Qwen3MoeForCausalLM` (config/model.py), and the architectures of
# mixture-of-experts families whose names do not say so. A model of one has MoE layers even when
# the log names no MoE kernel choice (a selector whose wording the reader does not know).
_ARCHITECTURE = re.compile(r"Resolved architecture: (?P<arch>[A-Za-z0-9_]+)")
_MOE_ARCHITECTURE = re.compile(r"moe|mixtral|deepseekv[23]|gptoss|llama4|dbrx|arctic|grok|minimax|jamba", re.I)


def proof_env(config: EvalConfig) -> dict[str, str]:
    """Server environment a vLLM config's `expect:` (or its implied one) needs to be provable,
    beyond its own `env`: DEBUG logging for deep_gemm MoE (module docstring). Empty otherwise, and when
    the config sets the variable itself (lint refuses a level that hides the lines)."""
    name, level = VLLM_DEBUG_ENV
    wanted = config.expect.moe_kernel or config.backend_flags().get(FLAGS["moe"])
    if config.engine != "vllm" or wanted is None or canonical(wanted) not in VLLM_MOE_DEBUG_PROOF or name in config.env:
        return {}
    return {name: level}


def kernel_matches(expected: str, kernel: str | None, backend: str | None) -> bool:
    """`expected` names the backend (`-`/`_` and case ignored) or the kernel class itself."""
    wanted = canonical(expected)
    return (backend is not None and canonical(backend) == wanted) or (kernel is not None and (
        kernel == expected or canonical(kernel) == wanted))


# Why server_args' backend flags are checked as expectations, and the fix a failure names: a
# server this run did not start never had them applied; vLLM, given a backend with no kernel for
# a layer type, warns and selects automatically for it. (The built-in engine refuses to start.)
IMPLIED_WHY: dict[str, tuple[str, str]] = {
    "attached": ("not applied to a server this run did not start",
                 "start that server with {flag} {name} (or run without --server-url), or drop the flag from "
                 "server_args"),
    "vllm": ("vLLM selects automatically for a layer type that backend has no kernel for",
             "name a backend that serves these layers in {flag}, or drop the flag from server_args"),
}


def implied_by_server_args(expect: Expect, backend_flags: dict[str, str]) -> dict[str, str]:
    """The backends server_args name explicitly (not `auto`) for the layers `expect:` leaves
    unset, by layer (`backend_flags`: EvalConfig.backend_flags()). A server that may not have run
    them (IMPLIED_WHY) must prove it did, or a run of another kernel would pass for the config's."""
    implied = {}
    for layer, flag in FLAGS.items():
        value = backend_flags.get(flag)
        if value and canonical(value) != "auto" and getattr(expect, f"{layer}_kernel") is None:
            implied[layer] = value
    return implied


@dataclass
class ExpectCheck:
    passed: bool
    expected: dict[str, str]
    mismatches: list[dict[str, Any]] = field(default_factory=list)  # module, layer, expected, kernel, backend
    problems: list[str] = field(default_factory=list)  # one line per failed expectation
    from_server_args: list[str] = field(default_factory=list)  # layers whose expectation server_args implied
    notes: list[str] = field(default_factory=list)  # what a passing check still leaves open

    @property
    def message(self) -> str:
        return "; ".join(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "expected": self.expected, "mismatches": self.mismatches,
                "from_server_args": self.from_server_args, "notes": self.notes, "message": self.message or None}


def _modules_checked(modules: dict[str, dict[str, Any]], layer: str) -> dict[str, dict[str, Any]]:
    """Every quantized module of `layer`; for a checkpoint with none (bf16), every module of it."""
    of_layer = {name: m for name, m in modules.items() if m.get("layer") == layer}
    quantized = {name: m for name, m in of_layer.items() if m.get("scheme") not in ("unquantized",)}
    return quantized or of_layer


def verify(expect: Expect, report: dict[str, Any] | None, where: str,
           implied: dict[str, str] | None = None, implied_why: str = "attached") -> ExpectCheck:
    """Check `expect`, and what server_args `implied` where it says nothing (see
    `implied_by_server_args`; `implied_why` a key of IMPLIED_WHY), against `report`; `where`
    says where a report was looked for."""
    explicit = {layer: name for layer, name in (("linear", expect.linear_kernel), ("moe", expect.moe_kernel)) if name}
    implied = {layer: name for layer, name in (implied or {}).items() if layer not in explicit}
    check = ExpectCheck(passed=True, expected={**explicit, **implied}, from_server_args=list(implied))
    for layer, name in check.expected.items():
        subject, fix = f"expect.{layer}_kernel", ""
        if layer in implied:
            why, remedy = IMPLIED_WHY[implied_why]
            subject = f"server_args' {FLAGS[layer]} ({why}, so checked as {subject})"
            fix = "; " + remedy.format(flag=FLAGS[layer], name=name)
        modules = _modules_checked(report["modules"], layer) if report is not None else {}
        if (not modules and layer == "moe" and layer in implied and implied_why == "vllm" and report is not None
                and _modules_checked(report["modules"], "linear")
                and not _MOE_ARCHITECTURE.search(report.get("architecture") or "")):
            # The log was read and shows a model without MoE layers: vLLM ignores a --moe-backend
            # there (migrate writes one beside --linear-backend for VLLM_TEST_FORCE_FP8_MARLIN).
            check.notes.append(f"{FLAGS[layer]} {name}: the server log names linear kernel choices and no MoE one (a "
                               "model without MoE layers), so it applied to nothing; name it in expect.moe_kernel to "
                               "require it")
            continue
        if report is None:
            check.problems.append(f"{subject} {name!r} cannot be verified: no kernel report ({where}){fix}")
            continue
        if not modules:
            check.problems.append(f"{subject} {name!r} cannot be verified: the kernel report "
                                  f"({report['source']}) has no {layer} module{fix}")
            continue
        wrong = {module: m for module, m in modules.items()
                 if not kernel_matches(name, m.get("kernel"), m.get("backend"))}
        for module, m in wrong.items():
            check.mismatches.append({"module": module, "layer": layer, "expected": name,
                                     "kernel": m.get("kernel"), "backend": m.get("backend")})
        if wrong:
            check.problems.append(_mismatch_line(subject, layer, name, modules, wrong) + fix)
        elif layer == "moe" and report["source"] == "server log" and canonical(name) in VLLM_MOE_DEBUG_PROOF:
            _check_deepgemm_ran(check, subject, name, report, fix)
    check.passed = not check.problems
    return check


def _check_deepgemm_ran(check: ExpectCheck, subject: str, name: str, report: dict[str, Any], fix: str) -> None:
    """vLLM selected deep_gemm MoE: did DeepGEMM run, or Triton in its place (module docstring)?"""
    refusals = report.get("deepgemm_refusals") or []
    of_shape = [line for line in refusals if not _small_batches_only(line)]
    variable, level = VLLM_DEBUG_ENV
    if of_shape:
        check.mismatches.append({"module": MOE_LOG_MODULE, "layer": "moe", "expected": name,
                                 "kernel": "TritonExperts (deep_gemm's fallback)", "backend": "triton"})
        more = f" (and {len(of_shape) - 1} more such lines)" if len(of_shape) > 1 else ""
        check.problems.append(f"{subject}: expected {name!r}; vLLM selected its deep_gemm MoE backend, but that "
                              f"backend ran Triton, not DeepGEMM, for this model's expert shapes: {of_shape[0]!r}{more}"
                              + fix)
    elif not report.get("debug_logged"):
        check.problems.append(f"{subject} {name!r} cannot be verified: vLLM's deep_gemm MoE backend runs Triton for "
                              "every shape DeepGEMM refuses and says so only at DEBUG level, and the server log has no "
                              f"DEBUG lines; start vLLM with {variable}={level} (the runner does unless the config's "
                              f"env sets {variable})" + fix)
    elif refusals:
        check.notes.append(f"moe: vLLM ran Triton for batches below DeepGEMM's row alignment, as its deep_gemm "
                           f"backend is designed to ({refusals[0]!r}); DeepGEMM ran the larger ones")


def _small_batches_only(refusal: str) -> bool:
    """A `DeepGemm disabled` line that refuses only a batch's row count, not the expert shape."""
    match = _DEEPGEMM_SMALL_M.search(refusal)
    if match is None:
        return False
    align = int(match["align"])
    return align > 0 and int(match["n"]) % align == 0 and int(match["k"]) % align == 0


def _mismatch_line(subject: str, layer: str, expected: str, modules: dict[str, Any], wrong: dict[str, Any]) -> str:
    by_kernel: dict[tuple[str, str], list[str]] = {}
    for module, m in wrong.items():
        by_kernel.setdefault((str(m.get("kernel")), str(m.get("backend"))), []).append(module)
    actual = []
    for (kernel, backend), names in by_kernel.items():
        shown = ", ".join(names[:_SHOWN_MODULES]) + (f" and {len(names) - _SHOWN_MODULES} more"
                                                     if len(names) > _SHOWN_MODULES else "")
        actual.append(f"{kernel} (backend {backend}) ran {shown}")
    return (f"{subject}: expected {expected!r} for every checked {layer} module, but "
            f"{len(wrong)} of {len(modules)} ran another kernel: " + "; ".join(actual))
