"""Engine throughput, decode and prefill speed on randomly initialised Qwen3 checkpoints.

Four measurements, one command each:

  # CPU: a fixed request set at concurrency 1 (one request at a time) and 32 (continuous batching)
  python benchmarks/bench_engine.py throughput --shape tiny --concurrency 1 32

  # CPU: the embedded eval's workload on a shipped model, without HTTP and lm-eval around it
  python benchmarks/bench_engine.py gsm8k --model models/tiny-qwen3-fp8-block-native \
      --linear-backend emulation --requests 500 --concurrency 64

  # CUDA: decode tokens/s at batch 1, CUDA graphs vs --enforce-eager, bf16 vs FP8 block (one run
  # per FP8 backend), with a per-step breakdown: host ms, GPU ms, kernels per step, graph captures,
  # and the graphs' tokens/s without overlapped decode (the host reads each step before the next);
  # --batch 1 32 adds graph runs of 32 sequences decoding together (tokens/s over all of them)
  python benchmarks/bench_engine.py decode --shape qwen3-1.7b --variants bf16 fp8-block \
      --linear-backend marlin triton --out $OUT

  # CUDA: one prefill (eager, as the engine runs it) of each prompt length, per backend: wall ms,
  # the GPU's kernel ms inside it (profiled), and prompt tokens/s
  python benchmarks/bench_engine.py prefill --shape qwen3-1.7b --prompt-len 512 2048 \
      --linear-backend torch triton marlin --out $OUT

For throughput, decode and prefill the checkpoints are written to a temporary folder from random
weights (FP8 variants are quantized with quantgate.kernels.quant, native block format), so
the numbers measure the engine, not a model. Prints a table; with --out writes the full results as
JSON, DIR/bench_engine_<mode>.json: a list of rows (decode adds {"ratios": ...} and
{"tuned": ...}), ending with {"provenance": {commit, date, argv, torch, triton, ...}}
(benchmarks/provenance.py; on the device the commit is QUANTGATE_COMMIT, see gpu_env.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from quantgate.engine import LLMEngine, LoadedModel, SamplingParams, load_model
from quantgate.kernels import quant

import provenance  # noqa: E402 - benchmarks/provenance.py, next to this script

SHAPES = {
    # about 5M parameters: the size of the shipped tiny models
    "tiny": dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def write_random_checkpoint(path: Path, shape: dict, dtype: torch.dtype, fp8_block: bool, device: str,
                            seed: int = 0) -> Path:
    """config.json + model.safetensors of a random Qwen3; FP8 block (native format) when asked."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, i, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d

    def randn(*size: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=device) * std).to(dtype)

    tensors = {"model.embed_tokens.weight": randn(shape["vocab_size"], h),
               "model.norm.weight": torch.ones(h, dtype=dtype)}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        linears = {
            "self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i),
        }
        for name, (n, k) in linears.items():
            w = randn(n, k)
            if fp8_block:
                wq, scale = quant.quantize_weight_block(w)
                tensors[f"{p}.{name}.weight"], tensors[f"{p}.{name}.weight_scale_inv"] = wq, scale
            else:
                tensors[f"{p}.{name}.weight"] = w
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{p}.{norm}.weight"] = torch.ones(h, dtype=dtype)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            tensors[f"{p}.{norm}.weight"] = torch.ones(d, dtype=dtype)
    if not shape["tie_word_embeddings"]:
        tensors["lm_head.weight"] = randn(shape["vocab_size"], h)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(path / "model.safetensors"))
    config = dict(shape, architectures=["Qwen3ForCausalLM"], model_type="qwen3", rms_norm_eps=1e-6,
                  max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                  dtype=str(dtype).removeprefix("torch."))
    if fp8_block:
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def param_count(shape: dict) -> int:
    h, i, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * i
    heads = 1 if shape["tie_word_embeddings"] else 2
    return shape["num_hidden_layers"] * per_layer + heads * shape["vocab_size"] * h


def run_requests(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, concurrency: int,
                 texts: dict[int, str] | None = None) -> dict:
    """Keep `concurrency` requests in flight (a new one joins as one finishes), like concurrent
    clients; the generated text of request i goes to texts[i]."""
    pending = list(enumerate(prompts))
    in_flight, generated, steps = 0, 0, 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and in_flight < concurrency:
            index, prompt = pending.pop(0)
            engine.add_request(str(index), prompt, params)
            in_flight += 1
        for out in engine.step():
            generated += len(out.new_token_ids)
            in_flight -= out.finished
            if texts is not None:
                texts[int(out.request_id)] = texts.get(int(out.request_id), "") + out.new_text
        steps += 1
    seconds = time.perf_counter() - start
    prompt_tokens = sum(len(p) for p in prompts)
    return {
        "concurrency": concurrency, "requests": len(prompts), "seconds": seconds, "steps": steps,
        "prompt_tokens": prompt_tokens, "generated_tokens": generated,
        "total_tokens_per_s": (prompt_tokens + generated) / seconds, "generated_tokens_per_s": generated / seconds,
        "requests_per_s": len(prompts) / seconds, "cpu_threads": torch.get_num_threads(),
        "cpu_load_1min": os.getloadavg()[0], "torch": torch.__version__,
    }


def throughput(args: argparse.Namespace) -> list[dict]:
    shape = SHAPES[args.shape]
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, shape["vocab_size"], (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.requests)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_random_checkpoint(Path(tmp), shape, DTYPES[args.dtype], args.variant == "fp8-block", "cpu")
        loaded = load_model(path, device=args.device, linear_backend=args.linear_backend)
        max_len = args.prompt_len + args.gen_tokens
        params = SamplingParams(max_tokens=args.gen_tokens, temperature=0, ignore_eos=True)
        for concurrency in args.concurrency:
            engine = LLMEngine(loaded, max_num_seqs=max(args.concurrency), max_model_len=max_len, enforce_eager=True)
            run_requests(engine, prompts[: min(4, len(prompts))], params, concurrency)  # warm-up
            rows.append(dict(run_requests(engine, prompts, params, concurrency), shape=args.shape,
                             params=param_count(shape), variant=args.variant, dtype=args.dtype))
    base = next((r for r in rows if r["concurrency"] == 1), None)
    for r in rows:
        r["speedup_vs_concurrency_1"] = r["total_tokens_per_s"] / base["total_tokens_per_s"] if base else None
    print(f"\n{args.shape} ({param_count(shape) / 1e6:.1f}M params, {args.variant}, {args.dtype}, "
          f"{torch.get_num_threads()} CPU threads), "
          f"{args.requests} requests x ({args.prompt_len} prompt + {args.gen_tokens} generated) tokens")
    print(f"{'concurrency':>11} {'seconds':>8} {'total tok/s':>12} {'gen tok/s':>10} {'req/s':>7} {'vs c=1':>7}")
    for r in rows:
        ratio = f"{r['speedup_vs_concurrency_1']:.2f}x" if r["speedup_vs_concurrency_1"] else "-"
        print(f"{r['concurrency']:>11} {r['seconds']:>8.2f} {r['total_tokens_per_s']:>12.0f} "
              f"{r['generated_tokens_per_s']:>10.0f} {r['requests_per_s']:>7.2f} {ratio:>7}")
    return rows


ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k strict-match


def gsm8k(args: argparse.Namespace) -> list[dict]:
    """5-shot prompts in lm-eval's gsm8k format, greedy, its stop strings; strict-match accuracy."""
    train, test = ([json.loads(line) for line in open(args.data / name)] for name in ("train.jsonl", "test.jsonl"))
    shots = "".join(f"Question: {q['question']}\nAnswer: {q['answer']}\n\n" for q in train[: args.fewshot])
    test = test[: args.requests]
    loaded = load_model(args.model, device=args.device, linear_backend=args.linear_backend)
    prompts = [loaded.tokenizer.encode(shots + f"Question: {q['question']}\nAnswer:").ids for q in test]
    engine = LLMEngine(loaded, max_num_seqs=args.concurrency, max_model_len=args.max_model_len)
    params = SamplingParams(max_tokens=256, temperature=0, stop=["Question:", "</s>", "<|im_end|>"])
    texts: dict[int, str] = {}
    row = run_requests(engine, prompts, params, args.concurrency, texts)
    answers = [ANSWER.search(texts.get(i, "")) for i in range(len(test))]
    correct = sum(a is not None and a.group(1) == q["answer"].split("#### ")[-1] for a, q in zip(answers, test))
    row.update(model=str(args.model), linear_backend=args.linear_backend, strict_match=correct / len(test))
    n = len(test)
    print(f"\n{args.model} ({args.linear_backend}): {n} GSM8K prompts of ~{row['prompt_tokens'] / n:.0f} tokens, "
          f"{row['generated_tokens'] / n:.0f} generated, concurrency {args.concurrency}, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"{row['seconds']:.1f} s ({row['requests_per_s']:.2f} requests/s), strict-match {row['strict_match']:.3f}")
    return [row]


class TimedForward:
    """Wraps the engine's model to time each forward, synchronised (eager steps read the sampled
    tokens on the host right after it anyway)."""

    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.model, self.device, self.seconds = model, device, 0.0

    def __call__(self, *args):
        start = time.perf_counter()
        out = self.model(*args)
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return out


def decode_speed(engine: LLMEngine, prompt_len: int, gen_tokens: int, repeats: int, batch: int = 1) -> dict:
    """Decode of `batch` sequences together, best of `repeats`: the prefill steps are not timed."""
    best: dict = {}
    for r in range(repeats):
        for i in range(batch):
            engine.add_request(f"d{r}-{i}", list(range(1, prompt_len + 1)),
                               SamplingParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True))
        # Prefills and the first tokens (over several steps if the prompts exceed a step's token
        # budget); step() ends by reading the sampled tokens on the host.
        engine.step()
        while engine.scheduler.waiting:
            engine.step()
        captures = engine.graphs.num_captures if engine.graphs else 0
        forward = engine.model
        if engine.graphs is None:
            engine.model = forward = TimedForward(forward, engine.device.type)
        start, tokens, steps = time.perf_counter(), 0, 0
        while engine.has_unfinished():
            tokens += sum(len(o.new_token_ids) for o in engine.step())
            steps += 1
        seconds = time.perf_counter() - start
        if isinstance(forward, TimedForward):
            engine.model = forward.model
        if tokens / seconds > best.get("decode_tokens_per_s", 0.0):
            best = {"decode_tokens_per_s": tokens / seconds, "step_ms": 1e3 * seconds / steps,
                    "captures_during_timing": (engine.graphs.num_captures - captures) if engine.graphs else 0,
                    "forward_ms": 1e3 * forward.seconds / steps if isinstance(forward, TimedForward) else None}
    return best


def graph_gpu_ms(engine: LLMEngine, context: int, batch: int = 1, replays: int = 50) -> float:
    """GPU time of one decode graph of `batch` sequences: back-to-back replays between CUDA events
    (the host launches run ahead, so this is what a step would cost with no host time at all)."""
    graph = engine.graphs.graphs[engine.graphs.buckets(batch, context)][0]
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / replays


def kernels_per_step(engine: LLMEngine, prompt_len: int) -> tuple[int, float, list[dict]]:
    """(CUDA kernels, their summed GPU ms, per kernel name: calls and us, largest first) of one
    profiled decode step (graph kernels included)."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request("profiled", list(range(1, prompt_len + 1)),
                       SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.step()
    engine.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    by_name: dict[str, dict] = {}
    for e in kernels:
        entry = by_name.setdefault(e.name[:80], {"kernel": e.name[:80], "calls": 0, "us": 0.0})
        entry["calls"] += 1
        entry["us"] += e.time_range.elapsed_us()
    breakdown = sorted(by_name.values(), key=lambda r: -r["us"])
    return len(kernels), sum(e.time_range.elapsed_us() for e in kernels) / 1e3, breakdown


def prefill_time(engine: LLMEngine, prompt_len: int, repeats: int) -> dict:
    """Wall time of the steps that prefill one `prompt_len`-token prompt and sample its first
    token (best of `repeats`, after a warm-up), and the GPU kernel time of one such prefill."""
    from torch.profiler import ProfilerActivity, profile

    def once(request_id: str) -> float:
        engine.add_request(request_id, list(range(1, prompt_len + 1)),
                           SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - start

    once("warm-up")  # tuners and Triton compilation for these shapes
    best = min(once(f"p{r}") for r in range(repeats))
    row = {"prompt_len": prompt_len, "prefill_ms": 1e3 * best, "prompt_tokens_per_s": prompt_len / best}
    if engine.device.type == "cuda":
        try:  # the profiler (CUPTI) only explains the wall time: its failure must not lose it
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                once("profiled")
                torch.cuda.synchronize()
            row["kernel_ms"] = sum(e.time_range.elapsed_us() for e in prof.events()
                                   if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
        except Exception as err:  # noqa: BLE001
            print(f"prefill profile failed: {err!r}", file=sys.stderr)
    return row


def loaded_models(args: argparse.Namespace) -> Iterator[tuple[str, str, str, LoadedModel, list[str]]]:
    """(device, variant, backend, model, its linear kernels) for each requested variant and FP8
    backend (bf16 runs once, with auto), on random checkpoints written to a temporary folder.
    Each model is released, and the CUDA cache emptied, before the next one loads."""
    shape = SHAPES[args.shape]
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            path = write_random_checkpoint(Path(tmp) / variant, shape, DTYPES[args.dtype], variant == "fp8-block",
                                           "cuda" if device == "cuda" else "cpu")
            for backend in args.linear_backend if variant != "bf16" else ["auto"]:
                loaded = load_model(path, device=device, linear_backend=backend)
                kernels = sorted({m["kernel"] for m in loaded.kernel_report()["modules"].values()})
                yield device, variant, backend, loaded, kernels
                del loaded
                if device == "cuda":
                    torch.cuda.empty_cache()


def prefill(args: argparse.Namespace) -> list[dict]:
    rows = []
    for _, variant, backend, loaded, kernels in loaded_models(args):
        engine = LLMEngine(loaded, max_num_seqs=1, max_model_len=max(args.prompt_len) + 2, enforce_eager=True,
                           kv_cache_memory=2**30, max_prefill_tokens=max(args.prompt_len))
        for n in args.prompt_len:
            rows.append({"variant": variant, "linear_backend": backend, **prefill_time(engine, n, args.repeats),
                         "kernels": kernels, "shape": args.shape, "device": loaded.platform.name})
        del engine, loaded
    print(f"\nprefill, {args.shape}: one prompt, eager (as the engine prefills); kernel ms = GPU time inside")
    print(f"{'variant':>10} {'backend':>8} {'tokens':>6} {'ms':>8} {'kernel ms':>9} {'tok/s':>9}  linear kernels")
    for r in rows:
        kernel = f"{r['kernel_ms']:.2f}" if r.get("kernel_ms") is not None else "-"
        print(f"{r['variant']:>10} {r['linear_backend']:>8} {r['prompt_len']:>6} {r['prefill_ms']:>8.2f} "
              f"{kernel:>9} {r['prompt_tokens_per_s']:>9.0f}  {', '.join(r['kernels'])}")
    return rows


def decode_runs(device: str, batches: list[int]) -> list[tuple[int, bool]]:
    """(batch, eager) runs per model: graphs at every batch on CUDA, and eager at batch 1, which
    only checks the graphs' gain; eager at every batch elsewhere."""
    if device != "cuda":
        return [(batch, True) for batch in batches]
    return [(batch, False) for batch in batches] + [(1, True)] * (1 in batches)


def decode(args: argparse.Namespace) -> list[dict]:
    rows = []
    for device, variant, backend, loaded, kernels in loaded_models(args):
        for batch, eager in decode_runs(device, args.batch):
            # Eager decode is slow and only checks the graphs' gain: fewer tokens, one timed run.
            gen_tokens, repeats = (args.eager_tokens, 1) if eager else (args.gen_tokens, args.repeats)
            max_model_len = args.prompt_len + args.gen_tokens + 1
            # Room for the batch and the cache's scratch slot, at least 1 GiB.
            kv_bytes = (batch + 1) * max_model_len * loaded.model_config.kv_bytes_per_token(loaded.dtype)
            engine = LLMEngine(loaded, max_num_seqs=batch, max_model_len=max_model_len, enforce_eager=eager,
                               kv_cache_memory=max(2**30, kv_bytes))
            decode_speed(engine, args.prompt_len, gen_tokens, 1, batch)  # warm-up (tuners, Triton compilation)
            row = {"variant": variant, "linear_backend": backend, "graphs": not eager, "batch": batch,
                   **decode_speed(engine, args.prompt_len, gen_tokens, repeats, batch), "kernels": kernels,
                   "shape": args.shape, "device": loaded.platform.name, "gen_tokens": gen_tokens}
            if device == "cuda":
                if not eager:
                    row["gpu_ms"] = graph_gpu_ms(engine, args.prompt_len + args.gen_tokens // 2, batch)
                    row["overlapped_steps"] = engine.num_overlapped_steps
                if batch == 1:
                    explain_batch_one(engine, row, args, gen_tokens, repeats)
            # Host time per step: what the GPU waits for (graphs), or step minus forward (eager).
            busy = row.get("gpu_ms") or row["forward_ms"]
            row["host_ms"] = row["step_ms"] - busy if busy is not None else None
            rows.append(row)
            del engine
        del loaded
    print_decode_table(args, rows)
    tuned = tuned_shapes()
    print_tuned(tuned)
    return rows + [{"ratios": decode_ratios(rows)}, {"tuned": tuned}]


def explain_batch_one(engine: LLMEngine, row: dict, args: argparse.Namespace, gen_tokens: int, repeats: int) -> None:
    """Adds to a batch-1 CUDA row what overlapped decode gains and the kernels of one step."""
    if row["graphs"]:
        # The same graphs with the host reading each step before launching the next: what
        # overlapped decode gains. Kernels are then profiled one step at a time.
        engine.overlap_decode = False
        row["sync_tokens_per_s"] = decode_speed(engine, args.prompt_len, gen_tokens, repeats)["decode_tokens_per_s"]
    try:  # the profiler (CUPTI) only explains the numbers: its failure must not lose them
        row["kernels_per_step"], row["kernel_ms_per_step"], row["kernel_breakdown"] = kernels_per_step(
            engine, args.prompt_len)
    except Exception as err:  # noqa: BLE001
        print(f"kernel profile of {row['variant']}/{row['linear_backend']} failed: {err!r}", file=sys.stderr)


def tuned_shapes() -> list[dict]:
    """What the kernels' tuners measured while the models warmed up (tuning.graph_time_ms: in a
    CUDA graph, L2 evicted, after a one-program kernel, with PDL where the engine uses it): per GEMM shape, each candidate's time and the choice."""
    from quantgate.kernels.triton.tuning import tuning_report

    return [{"kernel": t["kernel"], "key": [str(v) for v in t["key"]], "chosen": repr(t["chosen"]),
             "candidates": [{"config": repr(c["config"]), "ms": c["ms"], "error": c["error"]} for c in t["candidates"]]}
            for t in tuning_report()]


def print_tuned(tuned: list[dict]) -> None:
    if not tuned:
        return
    print("\ntuned GEMM shapes (us of GPU time in a CUDA graph, L2 evicted, PDL): chosen config, then the best of each family")
    for t in tuned:
        best: dict[str, float] = {}
        for c in t["candidates"]:
            family = c["config"].split("(")[0] + ("/mma" if "block_m=16" in c["config"] else "")
            if c["ms"] is not None:
                best[family] = min(best.get(family, float("inf")), 1e3 * c["ms"])
        chosen = next((1e3 * c["ms"] for c in t["candidates"] if c["config"] == t["chosen"]), float("nan"))
        families = ", ".join(f"{f} {us:.1f}" for f, us in sorted(best.items()))
        print(f"  {t['kernel']:<14} N={t['key'][1]:>6} K={t['key'][2]:>6} {chosen:6.1f}  [{families}]")


def decode_ratios(rows: list[dict]) -> dict[str, float]:
    """Speed-ups in tokens/s (the bars, at batch 1), and with graphs also in GPU time per step
    (`..._gpu_time`: what the ratio would be without the host's part of a step). Ratios at a
    larger batch end in `_batchN`."""
    by = {(r["variant"], r["linear_backend"], r["graphs"], r.get("batch", 1)): r for r in rows}
    ratios = {}
    for (variant, backend, graphs, batch), row in by.items():
        if variant != "fp8-block" or not graphs:
            continue
        suffix = "" if batch == 1 else f"_batch{batch}"
        bf16 = by.get(("bf16", "auto", True, batch))
        if bf16 is not None:
            ratios[f"fp8_{backend}_graphs_vs_bf16_graphs{suffix}"] = (row["decode_tokens_per_s"]
                                                                      / bf16["decode_tokens_per_s"])
            if row.get("gpu_ms") and bf16.get("gpu_ms"):
                ratios[f"fp8_{backend}_graphs_vs_bf16_graphs{suffix}_gpu_time"] = bf16["gpu_ms"] / row["gpu_ms"]
        eager = by.get((variant, backend, False, batch))
        if eager is not None:
            ratios[f"fp8_{backend}_graphs_vs_fp8_{backend}_eager{suffix}"] = (row["decode_tokens_per_s"]
                                                                              / eager["decode_tokens_per_s"])
    return ratios


def print_decode_table(args: argparse.Namespace, rows: list[dict]) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in rows:
        if r.get("kernel_breakdown"):
            print(f"\nkernels of one step, {r['variant']}/{r['linear_backend']} graphs={r['graphs']}: calls, us")
            for k in r["kernel_breakdown"][:12]:
                print(f"  {k['calls']:>4} {k['us']:>8.1f}  {k['kernel']}")
    print(f"\ndecode at batch {', '.join(map(str, args.batch))}, {args.shape}, {args.gen_tokens} tokens after a "
          f"{args.prompt_len}-token prompt (eager: {args.eager_tokens}); ms per step: step = host + GPU; "
          "tok/s over the batch")
    print("(graphs: host = step - GPU, below 0 while overlapped decode hides the host's part; sync = tokens/s "
          "with the host reading each step before launching the next)")
    print(f"{'variant':>10} {'backend':>8} {'graphs':>6} {'batch':>5} {'tok/s':>7} {'sync':>7} {'step':>6} {'GPU':>6} {'host':>6} "
          f"{'kernels':>7} {'kern ms':>7} {'captures':>8}  linear kernels")
    for r in rows:
        sync = f"{r['sync_tokens_per_s']:.1f}" if r.get("sync_tokens_per_s") else "-"
        print(f"{r['variant']:>10} {r['linear_backend']:>8} {str(r['graphs']):>6} {r.get('batch', 1):>5} "
              f"{r['decode_tokens_per_s']:>7.1f} "
              f"{sync:>7} {ms(r['step_ms']):>6} {ms(r.get('gpu_ms') or r['forward_ms']):>6} {ms(r['host_ms']):>6} "
              f"{r.get('kernels_per_step') or '-':>7} {ms(r.get('kernel_ms_per_step')):>7} "
              f"{r['captures_during_timing']:>8}  {', '.join(r['kernels'])}")
    for name, value in decode_ratios(rows).items():
        if name.endswith("_gpu_time"):
            print(f"{name}: {value:.2f}x (GPU time per step, without the host's part; the target is on tokens/s)")
            continue
        if "_batch" in name:
            print(f"{name}: {value:.2f}x (information: the targets are at batch 1)")
            continue
        target = 1.2 if "bf16" in name else 3.0
        print(f"{name}: {value:.2f}x (target >= {target}x: {'met' if value >= target else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput", help="a fixed request set at several concurrencies")
    t.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    t.add_argument("--requests", type=int, default=64)
    t.add_argument("--prompt-len", type=int, default=700)
    t.add_argument("--gen-tokens", type=int, default=80)
    t.add_argument("--variant", choices=["bf16", "fp8-block"], default="bf16")
    d = sub.add_parser("decode", help="decode tokens/s at batch 1 (and --batch N), CUDA graphs vs eager")
    d.add_argument("--variants", nargs="+", choices=["bf16", "fp8-block"], default=["bf16", "fp8-block"])
    d.add_argument("--prompt-len", type=int, default=64)
    d.add_argument("--gen-tokens", type=int, default=256)
    d.add_argument("--repeats", type=int, default=3)
    d.add_argument("--eager-tokens", type=int, default=64, help="tokens generated in the eager runs")
    d.add_argument("--batch", type=int, nargs="+", default=[1],
                   help="sequences decoding together, one graph run each (eager runs only at batch 1 on CUDA)")
    d.add_argument("--linear-backend", nargs="+", default=["auto"],
                   help="backends for the FP8 layers, one run each (e.g. marlin triton)")
    t.add_argument("--linear-backend", default="auto", help="backend for the FP8 layers (e.g. triton, torch, marlin)")
    f = sub.add_parser("prefill", help="one prefill of each prompt length, eager, per backend")
    f.add_argument("--variants", nargs="+", choices=["bf16", "fp8-block"], default=["bf16", "fp8-block"])
    f.add_argument("--prompt-len", type=int, nargs="+", default=[512, 2048])
    f.add_argument("--repeats", type=int, default=3)
    f.add_argument("--linear-backend", nargs="+", default=["auto"],
                   help="backends for the FP8 layers, one run each (e.g. torch triton marlin)")
    g = sub.add_parser("gsm8k", help="the embedded eval's workload on a shipped model folder")
    g.add_argument("--model", type=Path, default=Path("models/tiny-qwen3-fp8-block-native"))
    g.add_argument("--data", type=Path, default=Path("models/data/synth-gsm8k-v2"))
    g.add_argument("--requests", type=int, default=500)
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--fewshot", type=int, default=5)
    g.add_argument("--max-model-len", type=int, default=1280)
    g.add_argument("--device", default="cpu")
    g.add_argument("--linear-backend", default="emulation")
    g.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
    g.add_argument("--out", type=Path, help="directory for results JSON")
    for p in (t, d, f):
        p.add_argument("--shape", choices=sorted(SHAPES), default="tiny" if p is t else "qwen3-1.7b")
        p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
        p.add_argument("--device", default="cpu" if p is t else "auto")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
        p.add_argument("--out", type=Path, help="directory for results JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {"throughput": throughput, "decode": decode, "prefill": prefill, "gsm8k": gsm8k}[args.mode](args)
    if args.out:
        record = provenance.record(command_line(argv))
        path = write_results(args.out, args.mode, rows, record)
        print(f"written to {path} (commit {record['commit']})")
    return 0


def command_line(argv: list[str] | None) -> list[str]:
    """The command as run (main() called with argv from a test or script has no sys.argv of its own)."""
    return sys.argv[:] if argv is None else ["benchmarks/bench_engine.py", *argv]


def write_results(out: Path, mode: str, rows: list[dict], record: dict) -> Path:
    """DIR/bench_engine_<mode>.json: the rows, then their provenance (provenance.record) as the
    last entry. A list, as earlier runs' results are, so their readers keep working."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_engine_{mode}.json"
    path.write_text(json.dumps([*rows, {"provenance": record}], indent=2))
    return path


if __name__ == "__main__":
    sys.exit(main())
