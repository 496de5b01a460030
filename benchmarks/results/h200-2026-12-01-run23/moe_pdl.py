"""Run 23: what PDL on the MoE kernels (alignment, gate/up, down) buys in a CUDA graph.

One Qwen3-30B-A3B-shaped MoE layer (hidden 2048, expert intermediate 768, 128 experts, top-8)
per backend, bf16 activations. A graph captured as the engine captures its decode graphs
(`pdl.for_graph_capture`) of 8 layers' worth of calls, each routed from the previous call's
output through a router GEMM (torch) and `select_experts`, as a decode step chains its MoE
layers; GPU time per layer, median of 20 replays. Run once per kernels tree (the package shim
decides which) and compare.

    python benchmarks/results/h200-2026-12-01-run23/moe_pdl.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

from quantgate.kernels.moe import experts
from quantgate.kernels.moe.marlin import MarlinMoEKernel
from quantgate.kernels.moe.routing import select_experts
from quantgate.kernels.moe.triton import TritonFusedMoEKernel, TritonUnquantizedMoEKernel
from quantgate.kernels.schemes import MoELayerConfig, Scheme
from quantgate.kernels.triton import pdl
from quantgate.kernels.triton.tuning import replay_ms

LAYERS = 8
BACKENDS = {"triton fp8-block": (TritonFusedMoEKernel, Scheme.FP8_BLOCK),
            "marlin fp8-block": (MarlinMoEKernel, Scheme.FP8_BLOCK),
            "triton bf16": (TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED)}


def layer_ms(kernel_cls, scheme: Scheme, tokens: int) -> float:
    cfg = MoELayerConfig(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768, scheme=scheme,
                         act_dtype=torch.bfloat16, scale_name="weight_scale")
    w13 = torch.randn(128, 2 * 768, 2048, device="cuda") / 2048 ** 0.5
    w2 = torch.randn(128, 2048, 768, device="cuda") / 768 ** 0.5
    layer = torch.nn.Module()
    for name, tensor in experts.quantize_experts(w13, w2, cfg).items():
        layer.register_buffer(name, tensor, persistent=False)
    kernel = kernel_cls(cfg)
    kernel.process_weights_after_loading(layer)
    router = torch.randn(2048, 128, device="cuda", dtype=torch.bfloat16) / 2048 ** 0.5
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)

    def chain() -> torch.Tensor:
        h = x
        for _ in range(LAYERS):
            weights, ids = select_experts(h @ router, 8, renormalize=True)
            h = kernel.apply(layer, h, weights, ids)
        return h

    with pdl.for_graph_capture():
        chain()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
    return replay_ms(graph, 20) / LAYERS


def main(path: str) -> None:
    rows = []
    for name, (kernel_cls, scheme) in BACKENDS.items():
        for tokens in (1, 16, 64, 256):
            ms = layer_ms(kernel_cls, scheme, tokens)
            rows.append({"backend": name, "tokens": tokens, "us_per_layer": 1e3 * ms})
            print(f"{name:18s} {tokens:5d} tokens {1e3 * ms:8.1f} us per layer (routing included)", flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
