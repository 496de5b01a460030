"""Host time of one MoE layer call at one token (qwen3-30b-a3b shape), and of its pieces.

    python benchmarks/results/h200-2026-11-30-run11/moe_host_profile.py OUT_DIR

Host us per call with the GPU asleep (no call waits for it), for the triton FP8-block and
marlin MoE apply and for each launch inside, then a cProfile of the triton apply.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_linear  # noqa: E402
import bench_moe  # noqa: E402
from quantgate.kernels.moe import experts  # noqa: E402
from quantgate.kernels.triton import act_quant, fused_moe, moe_align  # noqa: E402


def host_us(fn) -> float:
    """bench_linear's host time per call (the GPU asleep, best of three), in us."""
    return bench_linear.host_ms(fn) * 1e3


def main(out: Path) -> None:
    shape = bench_moe.SHAPES["qwen3-30b-a3b"]
    layer = bench_moe.Layer(shape)
    (x, w, ids), = bench_moe._inputs(shape, 1)
    lines = []
    for method in ("triton_fp8_block", "marlin_fp8_block", "grouped_mm_bf16"):
        fn = bench_moe._method_fn(layer, method)
        lines.append(f"{method:24s} apply  {host_us(lambda: fn(x, w, ids)):7.1f} us")

    kernel, module = layer.kernel("triton_fp8_block")
    cfg = fused_moe.config_for(1, fp8=True)
    ids32 = ids.to(torch.int32).contiguous()
    align = moe_align.moe_align_block_size(ids32, shape["num_experts"], cfg.block_m)
    xq, xs = act_quant.quantize_per_token_group(x, 128)
    rows = align[0].numel()
    inter = shape["intermediate_size"]
    inter_q = torch.empty((rows, inter), dtype=xq.dtype, device=x.device)
    inter_s = torch.empty((rows, inter // 128), dtype=torch.float32, device=x.device)
    w13s = fused_moe.block_scales(getattr(module, experts.scale_attr(kernel.config, experts.GATE_UP)), inter)
    w2s = fused_moe.block_scales(getattr(module, experts.scale_attr(kernel.config, experts.DOWN)))
    slot_out = torch.empty((ids.numel(), x.shape[1]), dtype=x.dtype, device=x.device)
    wf = w.float().contiguous()
    pieces = {
        "topk float/int32 casts": lambda: (w.float().contiguous(), ids.to(torch.int32).contiguous()),
        "moe_align launch": lambda: moe_align.moe_align_block_size(ids32, shape["num_experts"], cfg.block_m),
        "group quant launch": lambda: act_quant.quantize_per_token_group(x, 128),
        "torch.empty x2": lambda: (torch.empty((rows, inter), dtype=xq.dtype, device=x.device),
                                   torch.empty((rows, inter // 128), dtype=torch.float32, device=x.device)),
        "gate_up launch": lambda: fused_moe._launch_gate_up(xq, xs, fused_moe.A_GROUPWISE, module.w13_weight, w13s,
                                                                  inter_q, inter_s, align, ids.numel(), shape["top_k"], cfg),
        "down launch": lambda: fused_moe._launch_down(inter_q, inter_s, fused_moe.A_GROUPWISE, module.w2_weight,
                                                            w2s, slot_out, wf, align, ids.numel(), cfg),
        "sum_slots": lambda: fused_moe.sum_slots(slot_out, 1, shape["top_k"]),
        "block_scales x2": lambda: (fused_moe.block_scales(w13s.tensor, inter), fused_moe.block_scales(w2s.tensor)),
    }
    for name, fn in pieces.items():
        lines.append(f"  {name:26s} {host_us(fn):7.1f} us")

    fn = bench_moe._method_fn(layer, "triton_fp8_block")
    prof = cProfile.Profile()
    torch.cuda._sleep(bench_linear.HOST_SLEEP_CYCLES)
    prof.enable()
    for _ in range(bench_linear.HOST_CALLS):
        fn(x, w, ids)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    header = f"\n\ncProfile, triton_fp8_block apply x {bench_linear.HOST_CALLS}\n"
    (out / "moe_host.txt").write_text(text + header + s.getvalue())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
