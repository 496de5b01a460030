"""Linear kernel selection: a pure function of (platform, layer config, requested backend)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from quantgate.kernels import (
    KernelSelectionError,
    LinearLayerConfig,
    MoELayerConfig,
    Platform,
    Scheme,
    UnknownBackendError,
    normalize_backend,
    select_linear_kernel,
    select_moe_kernel,
)
from quantgate.kernels import registry
from quantgate.kernels.registry import ALL_LINEAR_KERNELS, DISABLED_ENV, LINEAR_BACKENDS

B, C, T, U = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR, Scheme.UNQUANTIZED
CPU = ("cpu", None)
A100, L40S, H200, B200 = ("cuda", "8.0"), ("cuda", "8.9"), ("cuda", "9.0"), ("cuda", "10.0")


def _platform(spec: tuple[str, str | None]) -> Platform:
    return Platform.hypothetical(*spec)


def _config(scheme: Scheme, k: int = 4096, n: int = 4096, dtype: torch.dtype = torch.bfloat16) -> LinearLayerConfig:
    return LinearLayerConfig(k, n, scheme, act_dtype=dtype)


@pytest.fixture(autouse=True)
def _no_disabled_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)


AUTO = {
    CPU: {B: "EmulationLinearKernel", C: "EmulationLinearKernel", T: "EmulationLinearKernel",
          U: "UnquantizedLinearKernel"},
    A100: {B: "MarlinFp8LinearKernel", C: "MarlinFp8LinearKernel", T: "MarlinFp8LinearKernel",
           U: "UnquantizedLinearKernel"},
    L40S: {B: "TritonBlockFp8LinearKernel", C: "TorchScaledMMLinearKernel", T: "TorchScaledMMLinearKernel",
           U: "UnquantizedLinearKernel"},
    H200: {B: "TorchBlockScaledMMLinearKernel", C: "TorchScaledMMLinearKernel", T: "TorchScaledMMLinearKernel",
           U: "UnquantizedLinearKernel"},
}


@pytest.mark.parametrize("spec", list(AUTO))
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_selects_first_capable_kernel(spec, scheme):
    sel = select_linear_kernel(_platform(spec), _config(scheme))
    assert sel.require().kernel_name() == AUTO[spec][scheme]
    # Every candidate before the chosen one says why it was skipped.
    chosen = [c.kernel for c in sel.candidates].index(AUTO[spec][scheme])
    assert all(not c.supported and c.reason for c in sel.candidates[:chosen])


@pytest.mark.parametrize("spec", list(AUTO) + [B200])
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_lists_the_priority_row_then_every_other_kernel_of_the_scheme(spec, scheme):
    platform = _platform(spec)
    sel = select_linear_kernel(platform, _config(scheme))
    row = registry._priority(registry.LINEAR_PRIORITY, platform, scheme)
    names = [c.kernel for c in sel.candidates]
    # The row first, in its order; then the scheme's other kernels, none of them supported.
    assert names[:len(row)] == [k.kernel_name() for k in row]
    assert set(names) == {k.kernel_name() for k in ALL_LINEAR_KERNELS if scheme in k.schemes}
    assert len(names) == len(set(names))
    assert all(not c.supported and c.reason for c in sel.candidates[len(row):])
    assert sel.require().kernel_name() in names[:len(row)]


def test_a100_block_lists_the_kernels_it_cannot_run_with_their_reasons():
    sel = select_linear_kernel(_platform(A100), _config(B))
    assert sel.require().kernel_name() == "MarlinFp8LinearKernel"
    reasons = {c.kernel: c.reason for c in sel.rejected}
    assert reasons == {
        "TorchBlockScaledMMLinearKernel":
            "requires CUDA compute capability >= 9.0 (cuBLASLt 1x128/128x128 block scaling); this GPU is 8.0",
        "TritonBlockFp8LinearKernel": "requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0",
    }


def test_cpu_lists_the_gpu_kernels_with_their_cuda_reasons():
    sel = select_linear_kernel(_platform(CPU), _config(B))
    assert sel.require().kernel_name() == "EmulationLinearKernel"
    assert [c.kernel for c in sel.candidates] == ["EmulationLinearKernel", "TorchBlockScaledMMLinearKernel",
                                                  "TritonBlockFp8LinearKernel", "MarlinFp8LinearKernel"]
    marlin = next(c for c in sel.rejected if c.kernel == "MarlinFp8LinearKernel")
    assert marlin.reason == "requires CUDA (compute capability >= 8.0, bf16 tensor cores); this is cpu"


def test_a_runnable_kernel_outside_the_priority_row_is_shown_but_never_picked(monkeypatch):
    # Without marlin in the 8.0 row, auto must pick emulation, not marlin, and say why not marlin.
    marlin_kernel = registry.MarlinFp8LinearKernel
    rows = [(device, minimum, {s: [k for k in ks if k is not marlin_kernel] for s, ks in table.items()})
            for device, minimum, table in registry.LINEAR_PRIORITY]
    monkeypatch.setattr(registry, "LINEAR_PRIORITY", rows)
    sel = select_linear_kernel(_platform(A100), _config(B))
    assert sel.require().kernel_name() == "EmulationLinearKernel"
    marlin = next(c for c in sel.candidates if c.kernel == "MarlinFp8LinearKernel")
    assert not marlin.supported
    assert "priority list for cuda 8.0" in marlin.reason and "--linear-backend marlin" in marlin.reason
    # An explicit request still gets it.
    assert select_linear_kernel(_platform(A100), _config(B), "marlin").require() is marlin_kernel


def test_a100_loads_every_fp8_scheme_with_auto_through_marlin():
    for scheme in (B, C, T):
        sel = select_linear_kernel(_platform(A100), _config(scheme))
        rejected = {c.kernel: c.reason for c in sel.rejected}
        assert sel.require().backend == "marlin"
        assert "TritonBlockFp8LinearKernel" not in rejected or "8.9" in rejected["TritonBlockFp8LinearKernel"]


# (platform, scheme, backend) -> selected kernel, or None when the backend cannot serve.
EXPLICIT = {
    (CPU, B, "torch"): None, (CPU, C, "torch"): "TorchScaledMMLinearKernel", (CPU, T, "torch"): "TorchScaledMMLinearKernel",
    (CPU, B, "triton"): None, (CPU, C, "triton"): None, (CPU, B, "marlin"): None,
    (CPU, B, "emulation"): "EmulationLinearKernel", (CPU, U, "torch"): "UnquantizedLinearKernel",
    (A100, B, "torch"): None, (A100, C, "torch"): None, (A100, B, "triton"): None, (A100, C, "triton"): None,
    (A100, B, "marlin"): "MarlinFp8LinearKernel", (A100, T, "marlin"): "MarlinFp8LinearKernel",
    (A100, B, "emulation"): "EmulationLinearKernel",
    (L40S, B, "torch"): None, (L40S, C, "torch"): "TorchScaledMMLinearKernel", (L40S, B, "triton"): "TritonBlockFp8LinearKernel",
    (L40S, C, "triton"): "TritonBlockFp8LinearKernel", (L40S, T, "triton"): None, (L40S, C, "marlin"): "MarlinFp8LinearKernel",
    (H200, B, "torch"): "TorchBlockScaledMMLinearKernel", (H200, C, "torch"): "TorchScaledMMLinearKernel",
    (H200, T, "torch"): "TorchScaledMMLinearKernel", (H200, B, "triton"): "TritonBlockFp8LinearKernel",
    (H200, C, "triton"): "TritonBlockFp8LinearKernel", (H200, T, "triton"): None,
    (H200, B, "marlin"): "MarlinFp8LinearKernel", (H200, U, "marlin"): None, (H200, U, "triton"): None,
    (H200, U, "emulation"): "EmulationLinearKernel",
    (B200, B, "torch"): None, (B200, B, "triton"): "TritonBlockFp8LinearKernel",
}


@pytest.mark.parametrize("key", list(EXPLICIT), ids=lambda k: f"{k[0][1] or 'cpu'}-{k[1].value}-{k[2]}")
def test_explicit_backend_is_strict(key):
    spec, scheme, backend = key
    sel = select_linear_kernel(_platform(spec), _config(scheme), backend)
    expected = EXPLICIT[key]
    assert all(c.backend == backend for c in sel.candidates)
    if expected is not None:
        assert sel.require("model.layers.0.mlp.down_proj").kernel_name() == expected
        assert sel.error is None
        return
    assert sel.kernel is None
    with pytest.raises(KernelSelectionError) as err:
        sel.require("model.layers.0.mlp.down_proj")
    message = str(err.value)
    assert "model.layers.0.mlp.down_proj" in message and f"--linear-backend {backend}" in message
    # Every kernel of the backend is a candidate, and each one's reason is in the message.
    assert {c.kernel for c in sel.candidates} == {k.kernel_name() for k in ALL_LINEAR_KERNELS if k.backend == backend}
    for candidate in sel.candidates:
        assert f"{candidate.kernel}: {candidate.reason}" in message


def test_refusals_name_what_is_missing_and_what_is_there():
    sel = select_linear_kernel(_platform(A100), _config(B), "triton")
    assert sel.candidates[0].reason == "requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0"
    sel = select_linear_kernel(_platform(B200), _config(B), "torch")
    block = next(c for c in sel.candidates if c.kernel == "TorchBlockScaledMMLinearKernel")
    assert "9.x" in block.reason and "10.0" in block.reason
    assert "only on compute capability 9.x (Hopper)" in block.reason and "--linear-backend triton" in block.reason
    sel = select_linear_kernel(_platform(CPU), _config(B), "marlin")
    assert sel.candidates[0].reason.startswith("requires CUDA") and sel.candidates[0].reason.endswith("this is cpu")


@pytest.mark.parametrize("config, backend, words", [
    (_config(B, k=4000), "torch", "K a multiple of 512"),
    (_config(C, k=100), "torch", "multiples of 16"),
    (_config(C, dtype=torch.float16), "torch", "row-wise"),
    (_config(B, dtype=torch.float32), "marlin",
     "activation dtype float32 not handled (W8A16 computes in: bfloat16, float16)"),
    (_config(C, n=100), "torch", "this layer is K=4096, N=100"),
    (_config(B, n=4000), "torch", "N a multiple of 128 (cuBLASLt block-scale layout); this layer is K=4096, N=4000"),
    (LinearLayerConfig(4096, 4096, B, block_size=(128, 64)), "torch", "takes 128x128 weight blocks"),
    (LinearLayerConfig(4096, 4096, B, block_size=(128, 64)), "triton", "128 wide along K"),
    (LinearLayerConfig(4096, 4096, B, block_size=(128, 64)), "marlin", "128 wide along K"),
])
def test_shape_and_dtype_refusals(config, backend, words):
    sel = select_linear_kernel(_platform(H200), config, backend)
    assert sel.kernel is None
    assert words in sel.error


def test_disabled_kernels_are_skipped_with_a_reason(monkeypatch):
    monkeypatch.setenv(DISABLED_ENV, "TritonBlockFp8LinearKernel, TorchBlockScaledMMLinearKernel")
    sel = select_linear_kernel(_platform(H200), _config(B))
    assert sel.require().kernel_name() == "MarlinFp8LinearKernel"
    reasons = {c.kernel: c.reason for c in sel.rejected}
    assert reasons["TritonBlockFp8LinearKernel"] == f"disabled by {DISABLED_ENV}"
    assert reasons["TorchBlockScaledMMLinearKernel"] == f"disabled by {DISABLED_ENV}"
    # An explicit backend whose only kernel is disabled fails instead of falling back.
    with pytest.raises(KernelSelectionError, match="disabled by"):
        select_linear_kernel(_platform(H200), _config(B), "triton").require()


@pytest.mark.parametrize("value, hint", [("marlinfp8linearkernel", "did you mean 'MarlinFp8LinearKernel'"),
                                         ("torchscaledmm", "did you mean 'TorchScaledMMLinearKernel'"),
                                         ("TorchScaledMM", "did you mean 'TorchScaledMMLinearKernel'"),
                                         ("MarlinFp8LinearKernel;X", "separate names with commas")])
def test_a_disabled_name_that_is_no_kernel_class_is_an_error(monkeypatch, value, hint):
    # Ignored, it would leave marlin enabled while the debugging run believes it off.
    monkeypatch.setenv(DISABLED_ENV, value)
    with pytest.raises(UnknownBackendError, match=hint):
        select_linear_kernel(_platform(A100), _config(B))


def test_backend_names_are_normalised_with_a_suggestion():
    assert normalize_backend("Marlin", LINEAR_BACKENDS, "--linear-backend") == "marlin"
    assert select_linear_kernel(_platform(A100), _config(B), " MARLIN ").require().backend == "marlin"
    with pytest.raises(UnknownBackendError, match="did you mean 'marlin'"):
        select_linear_kernel(_platform(A100), _config(B), "marlinn")
    with pytest.raises(UnknownBackendError, match="known: auto, emulation, torch, triton, marlin"):
        select_linear_kernel(_platform(A100), _config(B), "cutlass")


def test_selection_report_shape():
    entry = select_linear_kernel(_platform(A100), _config(B)).to_dict()
    assert entry["layer"] == "linear" and entry["scheme"] == "fp8-block" and entry["requested"] == "auto"
    assert entry["selected"] == {"kernel": "MarlinFp8LinearKernel", "backend": "marlin"}
    assert entry["error"] is None
    assert all(set(c) == {"kernel", "backend", "supported", "reason"} for c in entry["candidates"])


def test_moe_selection_on_cpu_is_emulation():
    config = MoELayerConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128, scheme=B)
    sel = select_moe_kernel(_platform(CPU), config)
    assert sel.require().backend == "emulation"
    # The GPU kernels are listed, each saying what it needs and what runs here instead.
    reasons = {c.kernel: c.reason for c in sel.rejected}
    assert reasons["MarlinMoEKernel"] == ("requires CUDA (compute capability >= 8.0, bf16 tensor cores); this is cpu, "
                                          "where MoE layers run with --moe-backend emulation (what auto picks)")
    assert reasons["TritonFusedMoEKernel"].startswith("requires CUDA (compute capability >= 8.9, FP8 tensor cores)")


@pytest.mark.parametrize("spec", [CPU, A100, L40S, H200, B200])
@pytest.mark.parametrize("scheme", list(Scheme))
def test_moe_auto_lists_every_kernel_of_the_scheme(spec, scheme):
    config = MoELayerConfig(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768, scheme=scheme)
    sel = select_moe_kernel(_platform(spec), config)
    names = [c.kernel for c in sel.candidates]
    assert sorted(names) == sorted(k.kernel_name() for k in registry.ALL_MOE_KERNELS if scheme in k.schemes)
    assert all(c.reason for c in sel.rejected)


def test_kernel_modules_import_without_triton():
    # Selection runs on machines without triton: importing the registry must not import it.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'triton' or name.startswith('triton.'):\n"
        "            raise ImportError('triton blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from quantgate.kernels import registry, Platform, LinearLayerConfig, Scheme, select_linear_kernel\n"
        "import quantgate.kernels.linear.marlin, quantgate.kernels.linear.triton_block\n"
        "sel = select_linear_kernel(Platform.hypothetical('cuda', '8.0'), LinearLayerConfig(256, 256, Scheme.FP8_BLOCK))\n"
        "assert sel.require().backend == 'marlin'\n"
        "assert 'triton' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("scheme", list(Scheme))
def test_a_gpu_between_two_rows_takes_the_lower_one(scheme):
    """An 8.6 GPU (A10, RTX 3090) has no FP8 tensor cores: it selects and lists as an 8.0 one,
    never by the 8.9 row (whose first kernels it would only list as refused)."""
    ampere = [(c.kernel, c.supported) for c in select_linear_kernel(_platform(A100), _config(scheme)).candidates]
    sm86 = select_linear_kernel(_platform(("cuda", "8.6")), _config(scheme))
    assert [(c.kernel, c.supported) for c in sm86.candidates] == ampere
    assert sm86.require().kernel_name() == AUTO[A100][scheme]


def test_only_an_explicit_backend_is_told_to_choose_another():
    """auto has no other choice to make: its error ends with the candidates' reasons."""
    platform, config = _platform(CPU), _config(B)
    auto = select_linear_kernel(platform, config, disabled=frozenset({"EmulationLinearKernel"}))
    assert auto.kernel is None and auto.error.startswith("no linear kernel for scheme fp8-block on cpu with "
                                                         "--linear-backend auto: EmulationLinearKernel: disabled by")
    assert "Choose another" not in auto.error
    strict = select_linear_kernel(platform, config, "marlin")
    assert strict.error.endswith(". Choose another --linear-backend (see `quantgate kernels`) or 'auto'")


# platform -> scheme -> the candidates auto lists, in order: the priority row (benchmark order,
# kernels/registry.py), then the scheme's other kernels. Written out, not read from LINEAR_PRIORITY.
_LINEAR_CANDIDATES = {
    A100: {B: ["MarlinFp8", "Emulation", "TorchBlockScaledMM", "TritonBlockFp8"],
           C: ["MarlinFp8", "Emulation", "TorchScaledMM", "TritonBlockFp8"],
           T: ["MarlinFp8", "Emulation", "TorchScaledMM"]},
    L40S: {B: ["TritonBlockFp8", "MarlinFp8", "Emulation", "TorchBlockScaledMM"],
           C: ["TorchScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"],
           T: ["TorchScaledMM", "MarlinFp8", "Emulation"]},
    H200: {B: ["TorchBlockScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"],
           C: ["TorchScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"],
           T: ["TorchScaledMM", "MarlinFp8", "Emulation"]},
    CPU: {B: ["Emulation", "TorchBlockScaledMM", "TritonBlockFp8", "MarlinFp8"],
          C: ["Emulation", "TorchScaledMM", "TritonBlockFp8", "MarlinFp8"],
          T: ["Emulation", "TorchScaledMM", "MarlinFp8"]},
}


@pytest.mark.parametrize("spec", list(_LINEAR_CANDIDATES))
@pytest.mark.parametrize("scheme", [B, C, T])
def test_auto_lists_the_candidates_in_the_registrys_documented_order(spec, scheme):
    """The order decides what runs when the first kernel is refused (a disabled or unservable
    one): on 8.9 a block layer with TritonBlockFp8LinearKernel disabled takes marlin, not emulation."""
    sel = select_linear_kernel(_platform(spec), _config(scheme))
    assert [c.kernel for c in sel.candidates] == [f"{name}LinearKernel" for name in _LINEAR_CANDIDATES[spec][scheme]]


@pytest.mark.parametrize("spec", [CPU, A100, L40S, H200, B200, ("cuda", "7.5")])
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_falls_back_to_emulation_when_every_other_kernel_is_disabled(spec, scheme):
    """Emulation runs anywhere, so every priority row ends in it: auto never fails for want of it."""
    others = frozenset(k.kernel_name() for k in ALL_LINEAR_KERNELS) - {"EmulationLinearKernel"}
    sel = select_linear_kernel(_platform(spec), _config(scheme), disabled=others)
    assert sel.require().kernel_name() == "EmulationLinearKernel"


def test_an_explicit_backend_lists_the_kernel_of_the_platforms_row_first():
    """A strict error or `quantgate kernels --linear-backend torch` leads with the backend's kernel
    for this scheme, then the backend's other kernels."""
    sel = select_linear_kernel(_platform(H200), _config(B), "torch")
    assert [c.kernel for c in sel.candidates] == ["TorchBlockScaledMMLinearKernel", "UnquantizedLinearKernel",
                                                  "TorchScaledMMLinearKernel"]


def test_a_given_disabled_set_replaces_the_environment(monkeypatch):
    """`disabled=` is the whole answer, the empty set included: the variable is read only without it."""
    monkeypatch.setenv(DISABLED_ENV, "MarlinFp8LinearKernel")
    assert select_linear_kernel(_platform(A100), _config(B)).require().kernel_name() == "EmulationLinearKernel"
    sel = select_linear_kernel(_platform(A100), _config(B), disabled=frozenset())
    assert sel.require().kernel_name() == "MarlinFp8LinearKernel"


def test_a_scheme_refusal_names_the_schemes_the_kernel_handles():
    sel = select_linear_kernel(_platform(H200), _config(U), "marlin")
    assert sel.candidates[0].reason == "scheme unquantized not handled (handles: fp8-block, fp8-channel, fp8-tensor)"


def test_a_cuda_machine_without_triton_refuses_every_kernel_that_launches_triton():
    """The torch backend quantizes activations with Triton kernels on CUDA, as triton and marlin
    compute with them: without triton they would fail at the first forward, not at selection."""
    no_triton = Platform("cuda", (9, 0), "H100", frozenset({"cuda"}))
    missing = "triton is not installed (pip install triton)"
    for scheme in (B, C, T):
        sel = select_linear_kernel(no_triton, _config(scheme))
        assert sel.require().kernel_name() == "EmulationLinearKernel"
        assert {c.reason for c in sel.rejected} == {missing}
    moe = MoELayerConfig(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768, scheme=B)
    sel = select_moe_kernel(no_triton, moe)
    assert sel.require().kernel_name() == "EmulationMoEKernel"
    assert {c.reason for c in sel.rejected} == {missing}
    assert select_linear_kernel(no_triton, _config(U)).require().kernel_name() == "UnquantizedLinearKernel"


@pytest.mark.parametrize("scheme", [B, C])
def test_float32_activations_run_on_triton_where_it_runs(scheme):
    """Triton's W8A8 GEMM writes float32 outputs; cuBLASLt's and marlin's do not."""
    sel = select_linear_kernel(_platform(H200), _config(scheme, dtype=torch.float32))
    assert sel.require().kernel_name() == "TritonBlockFp8LinearKernel"


# platform -> scheme -> the candidates auto reports as able to serve ("ok" in `quantgate kernels`).
# A kernel the platform's row lists after the chosen one can serve; dropped from the row it would
# be shown as refused ("auto picks only from the priority list"), and a disabled first kernel
# could no longer fall back to it.
_LINEAR_SERVABLE = {
    CPU: {B: {"Emulation"}, C: {"Emulation", "TorchScaledMM"}, T: {"Emulation", "TorchScaledMM"},
          U: {"Unquantized", "Emulation"}},
    A100: {B: {"MarlinFp8", "Emulation"}, C: {"MarlinFp8", "Emulation"}, T: {"MarlinFp8", "Emulation"},
           U: {"Unquantized", "Emulation"}},
    L40S: {B: {"TritonBlockFp8", "MarlinFp8", "Emulation"},
           C: {"TorchScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"},
           T: {"TorchScaledMM", "MarlinFp8", "Emulation"}, U: {"Unquantized", "Emulation"}},
    H200: {B: {"TorchBlockScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"},
           C: {"TorchScaledMM", "TritonBlockFp8", "MarlinFp8", "Emulation"},
           T: {"TorchScaledMM", "MarlinFp8", "Emulation"}, U: {"Unquantized", "Emulation"}},
}


@pytest.mark.parametrize("spec", list(_LINEAR_SERVABLE))
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_shows_every_kernel_of_the_platforms_row_that_can_serve_as_ok(spec, scheme):
    sel = select_linear_kernel(_platform(spec), _config(scheme))
    servable = {c.kernel.removesuffix("LinearKernel") for c in sel.candidates if c.supported}
    assert servable == _LINEAR_SERVABLE[spec][scheme]
    assert all(c.reason is None for c in sel.candidates if c.supported)


def test_cpu_falls_back_to_torch_when_emulation_is_disabled():
    """On CPU the row goes on after emulation: row-wise `_scaled_mm` serves channel and tensor FP8."""
    for scheme in (C, T):
        sel = select_linear_kernel(_platform(CPU), _config(scheme), disabled=frozenset({"EmulationLinearKernel"}))
        assert sel.require().kernel_name() == "TorchScaledMMLinearKernel"


def test_a_kernel_refused_for_several_reasons_gives_the_first_check_that_fails():
    """The platform before the layer, and then the layer's checks in order (scheme, shape, dtype):
    a float32 unquantized layer on CPU asked of marlin is refused for the CPU, on 9.0 for the scheme."""
    config = _config(U, k=100, dtype=torch.float32)
    cpu = select_linear_kernel(_platform(CPU), config, "marlin")
    assert cpu.candidates[0].reason == "requires CUDA (compute capability >= 8.0, bf16 tensor cores); this is cpu"
    hopper = select_linear_kernel(_platform(H200), config, "marlin")
    assert hopper.candidates[0].reason == "scheme unquantized not handled (handles: fp8-block, fp8-channel, fp8-tensor)"
    # Shape before dtype: a K=100 float16 channel layer is refused by row-wise _scaled_mm for its K.
    torch_mm = select_linear_kernel(_platform(H200), _config(C, k=100, dtype=torch.float16), "torch")
    row_wise = next(c for c in torch_mm.candidates if c.kernel == "TorchScaledMMLinearKernel")
    assert "multiples of 16" in row_wise.reason and "row-wise" not in row_wise.reason
