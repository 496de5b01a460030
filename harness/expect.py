"""Proof of the kernel that ran: the `expect:` block checked against the server's own report.

The built-in engine answers `GET /v1/kernels` (per module: kernel, backend, rejected
candidates). vLLM has no such endpoint; its log says what it chose: `Selected <Kernel> for
<module>` per linear kernel choice and `Using <NAME> Fp8 MoE backend` for fused MoE. Either
way the report is normalised to `{"source", "platform", "modules": {name: {layer, scheme,
kernel, backend, scale_attr, rejected}}}` and recorded in result.json (`scheme` and `scale_attr`,
the checkpoint name the scales were read from, are None where a vLLM log does not say).

A mismatch fails the run even when accuracy passes, and so does an expectation that cannot
be checked (no report, or no module of that layer): a run that cannot prove its backend
does not prove the config.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .backends import FLAGS, VLLM_LINEAR_BACKENDS, canonical, log_name_to_backend
from .config import Expect
from .server import auth_headers

_SELECTED = re.compile(r"Selected (?P<kernel>[A-Za-z_][A-Za-z0-9_]*) for (?P<module>\S+)")
_MOE = re.compile(r"Using (?P<name>[A-Za-z0-9_]+) Fp8 MoE backend")
MOE_LOG_MODULE = "fused_moe"  # vLLM's MoE lines name no layer: every MoE choice is filed under this
_SHOWN_MODULES = 6


def report_from_server(base_url: str, timeout_s: float = 10.0, api_key: str | None = None) -> dict[str, Any] | None:
    """The `/v1/kernels` body, or None when the server has no such endpoint (e.g. vLLM)."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/v1/kernels", timeout=timeout_s, headers=auth_headers(api_key))
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("modules"), dict):
        return None
    return {"source": "GET /v1/kernels", "platform": body.get("platform"), "modules": body["modules"]}


def _squash(name: str) -> str:
    return canonical(name).replace("_", "")


def vllm_linear_backend(kernel_class: str) -> str | None:
    """The vLLM `--linear-backend` a kernel class belongs to: the longest backend name in the
    class name (FlashInferCutlassFp8... is flashinfer_cutlass, not cutlass)."""
    squashed = _squash(kernel_class)
    names = [b for b in VLLM_LINEAR_BACKENDS if b != "auto" and _squash(b) in squashed]
    return max(names, key=len) if names else None


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
    for line in log.splitlines() if isinstance(log, str) else log:
        for match in _SELECTED.finditer(line):
            kernel = match["kernel"]
            _add_choice(modules, match["module"], {"layer": "linear", "scheme": None, "kernel": kernel,
                                                   "backend": vllm_linear_backend(kernel), "scale_attr": None,
                                                   "rejected": []})
        moe_names.update(dict.fromkeys(match["name"] for match in _MOE.finditer(line)))
    for name in moe_names:
        _add_choice(modules, MOE_LOG_MODULE, {"layer": "moe", "scheme": None, "kernel": name,
                                              "backend": log_name_to_backend(name), "scale_attr": None,
                                              "rejected": []})
    if not modules:
        return None
    return {"source": "server log", "platform": None, "modules": modules}


def kernel_matches(expected: str, kernel: str | None, backend: str | None) -> bool:
    """`expected` names the backend (`-`/`_` and case ignored) or the kernel class itself."""
    wanted = canonical(expected)
    return (backend is not None and canonical(backend) == wanted) or (kernel is not None and (
        kernel == expected or canonical(kernel) == wanted))


def implied_by_server_args(expect: Expect, backend_flags: dict[str, str]) -> dict[str, str]:
    """The backends server_args name explicitly (not `auto`) for the layers `expect:` leaves
    unset, by layer (`backend_flags`: EvalConfig.backend_flags()). For a server this run did not
    start (--server-url) those flags were never applied: the server must prove it ran them, or a
    run of another kernel would pass for the config's."""
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

    @property
    def message(self) -> str:
        return "; ".join(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "expected": self.expected, "mismatches": self.mismatches,
                "from_server_args": self.from_server_args, "message": self.message or None}


def _modules_checked(modules: dict[str, dict[str, Any]], layer: str) -> dict[str, dict[str, Any]]:
    """Every quantized module of `layer`; for a checkpoint with none (bf16), every module of it."""
    of_layer = {name: m for name, m in modules.items() if m.get("layer") == layer}
    quantized = {name: m for name, m in of_layer.items() if m.get("scheme") not in ("unquantized",)}
    return quantized or of_layer


def verify(expect: Expect, report: dict[str, Any] | None, where: str,
           implied: dict[str, str] | None = None) -> ExpectCheck:
    """Check `expect`, and what server_args `implied` where it says nothing (see
    `implied_by_server_args`), against `report`; `where` says where a report was looked for."""
    explicit = {layer: name for layer, name in (("linear", expect.linear_kernel), ("moe", expect.moe_kernel)) if name}
    implied = {layer: name for layer, name in (implied or {}).items() if layer not in explicit}
    check = ExpectCheck(passed=True, expected={**explicit, **implied}, from_server_args=list(implied))
    for layer, name in check.expected.items():
        subject, fix = f"expect.{layer}_kernel", ""
        if layer in implied:
            subject = f"server_args' {FLAGS[layer]} (not applied to a server this run did not start, so checked " \
                      f"as {subject})"
            fix = f"; start that server with {FLAGS[layer]} {name} (or run without --server-url), or drop the flag " \
                  "from server_args"
        if report is None:
            check.problems.append(f"{subject} {name!r} cannot be verified: no kernel report ({where}){fix}")
            continue
        modules = _modules_checked(report["modules"], layer)
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
    check.passed = not check.problems
    return check


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
