"""Experiment: where the torch backend's time beyond quant + bare GEMM goes at large M."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import bench_linear as bl  # noqa: E402
from quantgate.kernels.triton import act_quant  # noqa: E402

l2 = torch.cuda.get_device_properties(0).L2_cache_size
k, n = 4096, 4096
ops = bl.Operands(k, n, torch.bfloat16, l2)
for m in (8192, 512, 2048):
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    peers = ops.peer_calls(x)
    calls, _ = ops.backend_calls("torch", bl.B, x)
    est = bl.eager_ms(calls[0])
    xq_p, xs_p = act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4)
    xq_s, xs_s = act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4, transient=True)
    xq_c, xs_c = xq_s.clone(), xs_s.clone()
    print("peer xq", xq_p.shape, xq_p.stride(), xq_p.data_ptr() % 1024, "xs", xs_p.shape, xs_p.stride(),
          "| scratch xq", xq_s.shape, xq_s.stride(), xq_s.data_ptr() % 1024, "xs", xs_s.shape, xs_s.stride(),
          xs_s.data_ptr() % 1024)

    def gemm(xq, xs, wq, ws):
        return F.scaled_mm(xq, wq.t(), xs, F.ScalingType.BlockWise1x128, ws.t(), F.ScalingType.BlockWise128x128,
                           output_dtype=torch.bfloat16)

    def quant():
        return act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4, transient=True)

    variants = {
        "peer": peers["scaled_mm_block"],
        "backend": calls,
        "quant": [quant],
        "quant_fresh": [lambda: act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4)],
        "quant+peer_gemm": [lambda wq=wq, ws=ws: (quant(), gemm(xq_p, xs_p, wq, ws)) for wq, ws in ops.peer_weights[bl.B]],
        "gemm_on_scratch_copy": [lambda wq=wq, ws=ws: gemm(xq_c, xs_c, wq, ws) for wq, ws in ops.peer_weights[bl.B]],
        "fresh_quant+gemm": [lambda wq=wq, ws=ws: gemm(*act_quant.quantize_per_token_group(
            x, 128, column_major_scales=True, row_multiple=4), wq, ws) for wq, ws in ops.peer_weights[bl.B]],
        "backend_layers_gemm_peer_x": [
            lambda kernel=kernel, layer=layer: torch._scaled_mm(
                xq_p, layer.weight, scale_a=xs_p, scale_b=getattr(layer, kernel.config.scale_name), out_dtype=torch.bfloat16)
            for kernel, layer in ops.layers[("torch", bl.B)][0]],
    }
    for rep in range(3):
        line = f"M={m} rep{rep}:"
        for name, cs in variants.items():
            r, err = bl._attempt(lambda: bl.graph_ms(cs, est))
            line += f" {name} {1e3 * r:.1f}" if r else f" {name} ERR {err}"
        print(line, flush=True)
