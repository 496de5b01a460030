"""Model building blocks: kernel-backed linear and MoE layers, RMSNorm, rotary embedding.

`QuantLinear` and `FusedMoE` hold the checkpoint's raw tensors (FP8 weights and scales, or
plain weights) as buffers under the names of the kernel contract, then hand them to the
kernel chosen by the registry. A reload re-sets the raw tensors and re-runs
`process_weights_after_loading`; the kernel copies into the storage it bound the first time
(`bind_processed`), and raw tensors no kernel processed (a bias) are copied in place, so
every buffer a captured CUDA graph reads keeps its address.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from quantgate.kernels import LinearKernel, LinearLayerConfig, MoEKernel, MoELayerConfig, Scheme
from quantgate.kernels.base import processed_names
from quantgate.kernels.registry import Selection

from .checkpoint import CheckpointError

logger = logging.getLogger("quantgate.engine")

FP8 = torch.float8_e4m3fn
Spec = tuple[tuple[int, ...], torch.dtype]
_WEIGHTS = ("weight", "w13_weight", "w2_weight")  # a linear's and stacked experts'; the rest are scales or biases


def _scale_shape(scheme: Scheme, rows: int, cols: int, block: tuple[int, int] | None) -> tuple[int, ...]:
    if scheme is Scheme.FP8_BLOCK:
        return (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if scheme is Scheme.FP8_CHANNEL:
        return (rows, 1)
    return ()


class KernelLayer(nn.Module):
    """A layer whose math is one kernel of the registry; see the module docstring for reloads."""

    layer_config: LinearLayerConfig | MoELayerConfig

    def __init__(self, name: str, device: torch.device) -> None:
        super().__init__()
        self.module_name = name
        self.device = device
        self.selection: Selection | None = None
        self.kernel: LinearKernel | MoEKernel | None = None
        self._processed_once = False

    def raw_specs(self) -> dict[str, Spec]:
        """Checkpoint tensors this layer expects: attribute name -> (shape, dtype after loading)."""
        raise NotImplementedError

    def bind_kernel(self, selection: Selection) -> None:
        self.selection = selection
        kernel_class = selection.require(self.module_name)
        self.kernel = kernel_class(self.layer_config)
        logger.info("Selected %s for %s", kernel_class.kernel_name(), self.module_name)

    def check_raw(self, name: str, tensor: torch.Tensor, source: str) -> torch.Tensor:
        """`tensor` as `set_raw` would store it, or CheckpointError naming `source`; stores nothing
        (a reload checks every tensor before it overwrites any)."""
        shape, dtype = self.raw_specs()[name]
        if tuple(tensor.shape) != shape and _same_but_singletons(tuple(tensor.shape), shape):
            tensor = tensor.reshape(shape)  # e.g. per-tensor scales saved as [1], channel scales as [N]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"{source}: shape {tuple(tensor.shape)} does not match {shape} expected from config.json "
                f"for {self.module_name}.{name}"
            )
        if dtype != FP8 and not tensor.dtype.is_floating_point:
            raise CheckpointError(self._not_float(name, tensor, source))
        if dtype == FP8 and tensor.dtype != FP8:
            raise CheckpointError(
                f"{source}: expected float8_e4m3fn weights for {self.module_name} (quantization_config says "
                f"it is quantized), found {tensor.dtype}; add it to the ignore list (or leave it out of the "
                "compressed-tensors targets) or re-quantize the checkpoint"
            )
        if dtype != FP8 and tensor.dtype.itemsize == 1 and name not in _WEIGHTS:  # a float8 dtype, any variant
            raise CheckpointError(f"{source}: {self.module_name}.{name} is stored as FP8; scales must be stored in "
                                  "float32, bf16 or fp16: re-export the checkpoint")
        if dtype != FP8 and tensor.dtype.itemsize == 1:
            raise CheckpointError(
                f"{source}: {self.module_name} is stored in FP8 but runs unquantized (lm_head and the MoE router "
                "always do; other modules when quantization_config ignores or does not target them); re-quantize "
                "the checkpoint leaving it in the model dtype, or fix the config's ignore list (or compressed-tensors "
                "targets)"
            )
        return tensor

    def _not_float(self, name: str, tensor: torch.Tensor, source: str) -> str:
        """Why an integer or bool tensor cannot stand for a float one: the cast to floats would keep
        the codes (int8 weights without their scales, 0/1 for bools) and serve wrong numbers."""
        if name in _WEIGHTS:
            what, fix = "unquantized weights", "with it in the model dtype (or quantized to FP8 with its scales)"
        elif name == "bias":
            what, fix = "biases", "with it in the model dtype"
        else:
            what, fix = "scales", "with float32 scales"
        return (f"{source}: stored as {tensor.dtype}; {what} must be float32, bfloat16 or float16 (a cast to floats "
                f"would serve its integer codes as values): re-export the checkpoint {fix}")

    def set_raw(self, name: str, tensor: torch.Tensor, source: str) -> None:
        dtype = self.raw_specs()[name][1]
        # A copy even where device and dtype match: on the CPU safetensors hands out views of the
        # memory-mapped file, which overwriting the file (before a reload) would change under the
        # model. A parameter of the model itself (the embeddings a tied lm_head reads) stays shared.
        tensor = self.check_raw(name, tensor, source).to(device=self.device, dtype=dtype,
                                                         copy=not isinstance(tensor, nn.Parameter))
        current = getattr(self, name, None)
        if self._processed_once and name not in processed_names(self):
            current.copy_(tensor)
            return
        if name in self._parameters:
            del self._parameters[name]
        self.register_buffer(name, tensor.contiguous(), persistent=False)

    def process_weights(self) -> None:
        self.kernel.process_weights_after_loading(self)
        self._processed_once = True

    def report(self) -> dict:
        sel = self.selection
        return {
            "layer": sel.layer,
            "scheme": sel.scheme.value,
            "kernel": sel.kernel.kernel_name(),
            "backend": sel.kernel.backend,
            # which checkpoint name the scales were read from: a format that names its scale
            # differently from what the kernel reads is the bug this report exists to expose
            "scale_attr": self.layer_config.scale_name if sel.scheme.is_fp8 else None,
            "rejected": [{"kernel": c.kernel, "reason": c.reason} for c in sel.rejected],
        }


class QuantLinear(KernelLayer):
    """One kernel-backed linear. `shards` (checkpoint module name, output rows) makes it a merged
    projection (q/k/v as `qkv_proj`, gate/up as `gate_up_proj`): the loader concatenates those
    modules' tensors along the output rows, so one GEMM streams all of their weights."""

    def __init__(self, name: str, config: LinearLayerConfig, device: torch.device,
                 shards: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__(name, device)
        self.layer_config = config
        self.shards = shards
        self.register_buffer("bias", None, persistent=False)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A merged projection's output -> one view per shard (no copy)."""
        return out.split([rows for _, rows in self.shards], dim=-1)

    def raw_specs(self) -> dict[str, Spec]:
        cfg = self.layer_config
        n, k = cfg.out_features, cfg.in_features
        specs: dict[str, Spec] = {}
        if cfg.scheme.is_fp8:
            specs["weight"] = ((n, k), FP8)
            specs[cfg.scale_name] = (_scale_shape(cfg.scheme, n, k, cfg.block_size), torch.float32)
            if cfg.static_input_scale:
                specs["input_scale"] = ((), torch.float32)
        else:
            specs["weight"] = ((n, k), cfg.act_dtype)
        if cfg.has_bias:
            specs["bias"] = ((n,), cfg.act_dtype)
        return specs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.apply(self, x, self.bias)


class FusedMoE(KernelLayer):
    """Stacked experts in the MoE kernel layout (`w13_weight` [E, 2I, H], `w2_weight` [E, H, I])."""

    def __init__(self, name: str, config: MoELayerConfig, device: torch.device) -> None:
        super().__init__(name, device)
        self.layer_config = config

    def raw_specs(self) -> dict[str, Spec]:
        cfg = self.layer_config
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        if not cfg.scheme.is_fp8:
            return {"w13_weight": ((e, 2 * i, h), cfg.act_dtype), "w2_weight": ((e, h, i), cfg.act_dtype)}
        specs: dict[str, Spec] = {"w13_weight": ((e, 2 * i, h), FP8), "w2_weight": ((e, h, i), FP8)}
        if cfg.scheme is Scheme.FP8_TENSOR:
            w13_scale, w2_scale = (e, 2), (e,)
        else:
            w13_scale = (e, *_scale_shape(cfg.scheme, 2 * i, h, cfg.block_size))
            w2_scale = (e, *_scale_shape(cfg.scheme, h, i, cfg.block_size))
        specs[f"w13_{cfg.scale_name}"] = (w13_scale, torch.float32)
        specs[f"w2_{cfg.scale_name}"] = (w2_scale, torch.float32)
        if cfg.static_input_scale:
            specs["w13_input_scale"] = ((e,), torch.float32)
            specs["w2_input_scale"] = ((e,), torch.float32)
        return specs

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return self.kernel.apply(self, x, topk_weights, topk_ids)


def uses_triton_ops(x: torch.Tensor) -> bool:
    """Whether the fused Triton kernels of `triton_ops` run on this tensor's device (CUDA); tests
    patch it to run them under the interpreter."""
    return x.is_cuda


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalised in float32, scaled in the input dtype (as transformers does).

    With `residual`, normalises x + residual and also returns that sum (the next residual), so
    the residual add of a decoder layer and the norm after it are one kernel on CUDA."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if uses_triton_ops(x):
            from . import triton_ops  # triton is optional on CPU installs

            out = triton_ops.rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        if residual is not None:
            residual = x + residual
            return self.weight * F.rms_norm(residual.float(), self.weight.shape, eps=self.eps).to(x.dtype), residual
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE with cos/sin precomputed in float32 for every position up to `max_len`."""

    def __init__(self, head_dim: int, theta: float, max_len: int, device: torch.device) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
        freqs = torch.arange(max_len, device=device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin) [T, 1, D] in `dtype`, for `apply_rotary`."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated as transformers' Qwen3 does (halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; gate and up may be column views of one merged projection's output."""
    if uses_triton_ops(gate):
        from . import triton_ops

        return triton_ops.silu_and_mul(gate, up)
    return F.silu(gate, inplace=True).mul_(up)


def _same_but_singletons(found: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """A lossless reshape: the same sizes once dimensions of 1 are dropped ([N] and [N, 1], [] and
    [1]); never a transpose such as [2, 6] for [6, 2]."""
    return [d for d in found if d != 1] == [d for d in expected if d != 1]
