"""Experiment: are bench_linear's torch-overhead ratios at large M drift (peer and backend timed
seconds apart) or a systematic difference? Alternates graph_ms of the peer and the torch backend."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import bench_linear as bl  # noqa: E402

l2 = torch.cuda.get_device_properties(0).L2_cache_size
for k, n in ((4096, 4096), (4096, 14336)):
    ops = bl.Operands(k, n, torch.bfloat16, l2)
    for m in (512, 8192):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        peers = ops.peer_calls(x)
        for scheme, peer in ((bl.B, "scaled_mm_block"), (bl.T, "scaled_mm_tensorwise")):
            calls, err = ops.backend_calls("torch", scheme, x)
            est = bl.eager_ms(calls[0])
            quant = bl._quant_calls(x, ops.w.input_scale)["act_quant_group" if scheme is bl.B else "act_quant_tensor_static"]
            seq = []
            for i in range(5):
                p = bl.graph_ms(peers[peer], est)
                b = bl.graph_ms(calls, est)
                q = bl.graph_ms([quant], est / 10)
                seq.append((p, b, q))
            print(f"M={m} K={k} N={n} {scheme.value}: " + " | ".join(
                f"peer {1e3*p:.1f} torch {1e3*b:.1f} q {1e3*q:.1f} r {b/p:.3f}" for p, b, q in seq), flush=True)
        del x, peers
    del ops
    torch.cuda.empty_cache()
