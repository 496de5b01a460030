"""Weight reloads: a second `process_weights_after_loading` keeps the storage of every processed
tensor and workspace (captured CUDA graphs keep reading the right addresses), computes with the
new weights, and refuses a checkpoint whose processed shapes differ."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import IncompatibleBufferError, LinearLayerConfig, Platform, Scheme
from quantgate.kernels.linear.emulation import EmulationLinearKernel
from quantgate.kernels.linear.marlin import MarlinFp8LinearKernel
from quantgate.kernels.linear.torch_scaled_mm import TorchScaledMMLinearKernel
from quantgate.kernels.linear.triton_block import TritonBlockFp8LinearKernel

from .linear_cases import (  # noqa: F401
    load_checkpoint,
    make_case,
    processed_storage,
    reference_w8a8,
    reference_w8a16,
    rel_error,
    reload,
    untuned,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, C, T = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR

# (kernel, scheme, dtype) runnable here: torch natively, Triton under the interpreter on CPU.
CASES = [
    (EmulationLinearKernel, B, torch.float16), (EmulationLinearKernel, T, torch.float16),
    (TorchScaledMMLinearKernel, C, torch.bfloat16), (TorchScaledMMLinearKernel, T, torch.float16),
    (TritonBlockFp8LinearKernel, B, torch.float16), (TritonBlockFp8LinearKernel, C, torch.float16),
    (MarlinFp8LinearKernel, B, torch.float16), (MarlinFp8LinearKernel, C, torch.float16),
    (MarlinFp8LinearKernel, T, torch.float16),
]


def _reference(kernel_cls, case, x):
    if kernel_cls is MarlinFp8LinearKernel:
        return reference_w8a16(case, x, case.config.act_dtype)
    return reference_w8a8(case, x)


def _runnable(kernel_cls) -> bool:
    # On CPU every kernel runs (Triton ones under the interpreter); on a GPU only supported ones.
    return DEVICE == "cpu" or kernel_cls.is_supported(Platform.detect("cuda"))[0]


@pytest.mark.parametrize("kernel_cls, scheme, dtype", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_reload_keeps_storage_and_uses_new_weights(seed, kernel_cls, scheme, dtype):
    if not _runnable(kernel_cls):
        pytest.skip(f"{kernel_cls.__name__} does not run on this GPU")
    case = make_case(144, 272, scheme, act_dtype=dtype, bias=True, static_input_scale=scheme is T, device=DEVICE)
    kernel = kernel_cls(case.config)
    kernel.process_weights_after_loading(case.layer)
    before = processed_storage(case.layer)
    if kernel_cls is MarlinFp8LinearKernel:
        assert set(before) == {"weight", case.config.scale_name, "workspace"}  # the workspace's storage is kept too
    x = torch.randn(3, 272, device=DEVICE).to(dtype)
    first = kernel.apply(case.layer, x, case.layer.bias)

    new = reload(case)
    kernel.process_weights_after_loading(new.layer)
    assert processed_storage(new.layer) == before
    out = kernel.apply(new.layer, x, new.layer.bias)
    bf16 = dtype == torch.bfloat16
    assert rel_error(out, _reference(kernel_cls, new, x), round_ref=bf16) < 1e-3
    assert not torch.equal(out, first)


@pytest.mark.parametrize("kernel_cls", [EmulationLinearKernel, TorchScaledMMLinearKernel, TritonBlockFp8LinearKernel,
                                        MarlinFp8LinearKernel])
def test_reload_with_other_shapes_raises(kernel_cls):
    scheme = C  # served by all four
    case = make_case(128, 256, scheme, act_dtype=torch.bfloat16, device=DEVICE)
    kernel_cls(case.config).process_weights_after_loading(case.layer)
    bigger = LinearLayerConfig(384, 128, scheme, act_dtype=torch.bfloat16)
    load_checkpoint(case.layer, bigger, DEVICE)
    with pytest.raises(IncompatibleBufferError, match="does not fit the bound buffer"):
        kernel_cls(bigger).process_weights_after_loading(case.layer)


def test_reload_with_another_activation_dtype_raises():
    # Same shapes, but the marlin scales would be bf16 where fp16 ones are bound: refused, not
    # copied into the fp16 buffer (a CUDA graph would keep reading them as fp16).
    case = make_case(128, 256, C, act_dtype=torch.float16, device=DEVICE)
    MarlinFp8LinearKernel(case.config).process_weights_after_loading(case.layer)
    as_bf16 = LinearLayerConfig(256, 128, C, act_dtype=torch.bfloat16)
    load_checkpoint(case.layer, as_bf16, DEVICE)
    with pytest.raises(IncompatibleBufferError, match=r"weight_scale: new tensor \(1, 128\) torch.bfloat16 .* "
                       r"does not fit the bound buffer \(1, 128\) torch.float16"):
        MarlinFp8LinearKernel(as_bf16).process_weights_after_loading(case.layer)


@pytest.mark.parametrize("kernel_cls, scheme, n, k, dtype", [
    (EmulationLinearKernel, B, 128, 256, torch.float16), (MarlinFp8LinearKernel, B, 128, 256, torch.float16),
    # N == K: the torch backend binds the weight as its transposed [K, N] view, of the checkpoint's
    # shape and dtype; only its layout tells it from a checkpoint weight.
    (TorchScaledMMLinearKernel, C, 256, 256, torch.bfloat16), (TorchScaledMMLinearKernel, T, 256, 256, torch.float16)],
    ids=lambda v: getattr(v, "__name__", getattr(v, "value", str(v))))
def test_processing_twice_without_a_reload_is_refused(kernel_cls, scheme, n, k, dtype):
    """A second processing of already processed tensors is refused with the clear message, not
    run (it would transpose or scale twice). Guards against the weight check accepting a
    non-contiguous (transposed) weight whose shape matches because N == K."""
    if not _runnable(kernel_cls):
        pytest.skip(f"{kernel_cls.__name__} does not run on this GPU")
    case = make_case(n, k, scheme, act_dtype=dtype, device=DEVICE)
    kernel = kernel_cls(case.config)
    kernel.process_weights_after_loading(case.layer)
    with pytest.raises(ValueError, match="load the checkpoint tensors again"):
        kernel.process_weights_after_loading(case.layer)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_cls, scheme", [(TritonBlockFp8LinearKernel, B), (MarlinFp8LinearKernel, B),
                                                (MarlinFp8LinearKernel, C), (TorchScaledMMLinearKernel, C)],
                         ids=lambda v: getattr(v, "__name__", getattr(v, "value", str(v))))
@pytest.mark.usefixtures("untuned")
def test_cuda_graph_replays_with_reloaded_weights(seed, kernel_cls, scheme):
    ok, reason = kernel_cls.is_supported(Platform.detect("cuda"))
    if not ok:
        pytest.skip(reason)
    case = make_case(512, 1024, scheme, act_dtype=torch.bfloat16, device="cuda")
    kernel = kernel_cls(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(4, 1024, device="cuda").bfloat16()
    kernel.apply(case.layer, x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.apply(case.layer, x)
    new = reload(case)
    kernel.process_weights_after_loading(new.layer)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(out, _reference(kernel_cls, new, x), round_ref=True) < 1e-3
