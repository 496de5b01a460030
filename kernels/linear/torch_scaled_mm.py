"""`torch` backend: FP8 GEMMs torch ships (`torch._scaled_mm`: cuBLASLt / CUTLASS on CUDA).

Two kernels because the platforms differ: per-tensor and per-channel (row-wise) scales run on
CPU and on CUDA >= 8.9; 1x128 x 128x128 block scales run only on Hopper (cuBLASLt 12.9+).
Activations are quantized per scheme with the Triton kernels on CUDA (one launch, scales
written in the layout `_scaled_mm` checks) and with the torch reference on CPU.

Prefill-sized eager calls are bound by host time, not by the GEMM (~5-15 us per torch op or
launch on the H200's host against ~20 us of GPU time at M=512, K=N=4096), so `apply` runs the
quantization launch (by handle, into the device scratch: act_quant.py) and `_scaled_mm`, nothing
else: the weight (and the block scales) are stored in the transposed layout `_scaled_mm` reads,
the bias joins in the GEMM epilogue (one rounding of the float32 sum, as the reference has), 2-D
activations are not reshaped, and rows are sliced only when padded.

Per-tensor on CPU runs row-wise: torch 2.13's CPU `_scaled_mm` with single-value scales took
~22 s at M=2048, K=256, N=768 against ~25 ms with row scales (~4 s against 14 ms at M=256), which
timed out the CPU per-tensor evals. The scales are passed as rows (activation [M, 1], weight
[1, N], float32 with unit strides: `_scaled_mm` rejects stride-0 views), the same values
multiplying the same float32 sums.
"""

from __future__ import annotations

import torch

from .. import quant
from ..base import LinearKernel, Verdict, bind_processed
from ..platform import CPU_ROWWISE_SCALED_MM, Platform
from ..schemes import LinearLayerConfig, Scheme
from .fp8_checkpoint import fp8_weight, static_input_scale, weight_scale
from .support import cuda_verdict, dtype_verdict, first_failure

_BLOCK = (128, 128)
# cuBLASLt reads the 1x128 activation scales column-major with a 16-byte aligned leading
# dimension: the row count is padded to a multiple of 4 (zero rows, sliced off after).
_BLOCK_ROW_MULTIPLE = 4


def _shape_verdict(config: LinearLayerConfig) -> Verdict:
    k, n = config.in_features, config.out_features
    if k % 16 or n % 16:
        return False, f"torch._scaled_mm needs K and N multiples of 16; this layer is K={k}, N={n}"
    return True, None


def _bias(bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return bias if bias is None or bias.dtype == dtype else bias.to(dtype)


class TorchScaledMMLinearKernel(LinearKernel):
    """Per-tensor and per-channel FP8: `torch._scaled_mm` tensor-wise (row-wise on CPU) / row-wise."""

    backend = "torch"
    schemes = frozenset({Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        if platform.device == "cpu":
            if CPU_ROWWISE_SCALED_MM in platform.libraries:
                return True, None
            return False, (f"torch {torch.__version__}'s CPU _scaled_mm takes one scale per tensor only, and this "
                           "kernel scales rows on CPU: install torch >= 2.13 or use --linear-backend emulation")
        # On CUDA `apply` quantizes activations with Triton kernels (act_quant.py).
        return cuda_verdict(platform, (8, 9), "FP8 tensor cores", triton=True)

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        # Row-wise scaling writes bfloat16 only on CUTLASS (sm_89) and older cuBLASLt.
        allowed = (torch.bfloat16,) if config.scheme is Scheme.FP8_CHANNEL else (torch.bfloat16, torch.float16)
        why = "row-wise _scaled_mm outputs" if config.scheme is Scheme.FP8_CHANNEL else "_scaled_mm outputs with bias"
        return first_failure(cls._scheme_verdict(config.scheme), _shape_verdict(config),
                             dtype_verdict(config, allowed, why))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        weight = fp8_weight(layer, cfg)
        scale = weight_scale(layer, cfg)
        input_scale = static_input_scale(layer, cfg)
        bind_processed(layer, "weight", weight.t())  # [K, N] column-major: _scaled_mm's mat2
        # Row-wise wants scale_b as a contiguous [1, N] row; tensor-wise a single value, except
        # on CPU, where per-tensor runs row-wise too (the module docstring says why).
        row_wise = cfg.scheme is Scheme.FP8_CHANNEL or weight.device.type == "cpu"
        bind_processed(layer, cfg.scale_name,
                       scale.reshape(1, -1).expand(1, cfg.out_features).contiguous() if row_wise else scale)
        if input_scale is not None:
            bind_processed(layer, "input_scale", input_scale)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.config
        x2 = _rows(x, cfg.in_features)
        if cfg.scheme is Scheme.FP8_CHANNEL:
            xq, xs = _quantize_per_token(x2)
        else:
            xq, xs = _quantize_per_tensor(x2, layer.input_scale if cfg.static_input_scale else None)
            if x2.device.type == "cpu":  # row-wise, as the weight scale (module docstring)
                xs = xs.reshape(1, 1).repeat(x2.shape[0], 1)  # not expand: a [1, 1] view keeps stride 0
        out = torch._scaled_mm(xq, layer.weight, scale_a=xs, scale_b=getattr(layer, cfg.scale_name),
                               bias=_bias(bias, x.dtype), out_dtype=x.dtype)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], cfg.out_features)


class TorchBlockScaledMMLinearKernel(LinearKernel):
    """Block FP8 (1x128 activations, 128x128 weights): `torch._scaled_mm` on Hopper."""

    backend = "torch"
    schemes = frozenset({Scheme.FP8_BLOCK})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        ok, reason = cuda_verdict(platform, (9, 0), "cuBLASLt 1x128/128x128 block scaling", triton=True,
                                  maximum_major=9)
        if not ok and platform.has_capability((10, 0)):  # refused by maximum_major alone
            # torch runs 1x128/128x128 block scaling only through cuBLASLt on sm_90 (its own tests
            # exercise it only on major 9; newer GPUs get MXFP8 1x32 block scaling instead).
            reason = (f"torch's block-wise _scaled_mm (cuBLASLt 1x128/128x128 block scaling) runs only on compute "
                      f"capability 9.x (Hopper); this GPU is {platform.capability_str}: use --linear-backend triton or "
                      "marlin (auto skips this kernel here)")
        return ok, reason

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        k, n = config.in_features, config.out_features
        verdict = first_failure(cls._scheme_verdict(config.scheme), _shape_verdict(config),
                                dtype_verdict(config, (torch.bfloat16, torch.float16), "_scaled_mm outputs"))
        if not verdict[0]:
            return verdict
        if tuple(config.block_size) != _BLOCK:
            return False, f"block-wise _scaled_mm takes 128x128 weight blocks; this checkpoint has {list(config.block_size)}"
        # The 128x128 weight scales are read with a row stride of K/128 floats, which cuBLASLt
        # needs 16-byte aligned; torch versions disagree on padding it, so it must be exact.
        if k % 512 or n % 128:
            return False, (f"block-wise _scaled_mm needs K a multiple of 512 and N a multiple of 128 "
                           f"(cuBLASLt block-scale layout); this layer is K={k}, N={n}")
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        weight = fp8_weight(layer, cfg)
        scale = weight_scale(layer, cfg)
        # The transposed views _scaled_mm reads: weight [K, N] column-major, scales
        # [ceil(K/128), N/128] with unit stride along K.
        bind_processed(layer, "weight", weight.t())
        bind_processed(layer, cfg.scale_name, scale.t())

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from ..triton.act_quant import quantize_per_token_group

        cfg = self.config
        x2 = _rows(x, cfg.in_features)
        m = x2.shape[0]
        xq, xs = quantize_per_token_group(x2, _BLOCK[1], column_major_scales=True, row_multiple=_BLOCK_ROW_MULTIPLE,
                                          transient=True)
        out = torch._scaled_mm(xq, layer.weight, scale_a=xs, scale_b=getattr(layer, cfg.scale_name),
                               bias=_bias(bias, x.dtype), out_dtype=x.dtype)
        if xq.shape[0] != m:
            out = out[:m]
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], cfg.out_features)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x as [M, K] with unit K stride, without a torch call when it already is."""
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        from ..triton.act_quant import quantize_per_token

        return quantize_per_token(x, transient=True)
    return quant.quantize_act_per_token(x)


def _quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        from ..triton.act_quant import quantize_per_tensor

        return quantize_per_tensor(x, scale, transient=True)
    return quant.quantize_act_per_tensor(x, scale)
