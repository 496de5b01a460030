"""Train the shipped tiny models: a dense Qwen3 and a Qwen3-MoE, with transformers' own classes.

Training sequences are lm-eval-style few-shot text (solved problems joined by "\\n\\n", up to
1024 tokens) drawn from the generator's `stream` split, which never contains a test question's twin
(`synth_gsm8k.twin_key`: the same numbers and answer under other names or wording).
The loss covers the answers and the "Question:" that follows each one (so the model learns
to stop where lm-eval's stop string cuts), not the question bodies, whose numbers are noise.
Several checkpoints are evaluated during training with the exact lm-eval 5-shot prompts on
held-out test questions (batched greedy decoding, strict-match); the one whose accuracy is
inside [0.70, 0.97] and closest to 0.85 is kept, so a broken kernel shows as a drop.

One command trains both models concurrently on one GPU within a time budget:

    python models/recipes/train.py --model both --out $OUT --time-budget-s 450

and writes, per model, `<name>.tar` (the bf16 HF folder: config.json, model.safetensors with
per-expert MoE weights, tokenizer files, generation_config.json) and `<name>.json` (the run
log: command, seed, steps, loss curve, accuracy per evaluated checkpoint, wall time), plus
`summary.json`. `--device cpu --tiny` runs the whole path in about a minute on a CPU.
Re-running with `--steps N` (N from the log) repeats a run; the step count is otherwise set
from the measured step time so that the run fits the budget.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import io
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA init
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fewshot  # noqa: E402
import manifest  # noqa: E402
import synth_gsm8k  # noqa: E402
import tokenizer as tokenizer_recipe  # noqa: E402

MODEL_NAMES = {"dense": "tiny-qwen3", "moe": "tiny-qwen3-moe"}
TARGET_RANGE = (0.70, 0.97)
TARGET_ACCURACY = 0.85
IGNORE_INDEX = -100

_COMMON = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=768, max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, attention_dropout=0.0,
)
ARCHITECTURES = {
    "dense": dict(_COMMON),
    "moe": dict(
        _COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.01,
    ),
}
# --tiny: the same code path on a CPU in about a minute.
TINY_OVERRIDES = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=256, moe_intermediate_size=128)


@dataclasses.dataclass
class Recipe:
    seq_len: int = 1024
    batch_size: int = 64
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 150
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    max_steps: int = 20_000
    pool_problems: int = 600_000
    num_fewshot: int = 5
    eval_questions: int = 200
    final_eval_questions: int = 1000
    eval_batch_size: int = 200
    max_new_tokens: int = 160
    # Checkpoints evaluated, as fractions of the run: early ones too, in case the task saturates.
    eval_fractions: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    final_eval_batch_size: int = 250
    # Seconds kept for saving and the reload check, besides the evaluations.
    reserve_s: float = 20.0


# --pilot: a CPU learnability check of the data (single problems, 0-shot, the --tiny model).
PILOT_RECIPE = dict(seq_len=320, batch_size=16, warmup_steps=50, lr=3e-3, max_steps=100_000, pool_problems=50_000,
                    num_fewshot=0, eval_questions=100, final_eval_questions=200, eval_batch_size=100,
                    final_eval_batch_size=100, eval_fractions=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                    reserve_s=10.0)
TINY_RECIPE = dict(batch_size=2, warmup_steps=5, max_steps=16, pool_problems=2000, eval_questions=4,
                   final_eval_questions=6, eval_batch_size=4, final_eval_batch_size=3, max_new_tokens=24, eval_fractions=(0.5, 1.0),
                   reserve_s=5.0)


def recipe_for(args: argparse.Namespace) -> Recipe:
    r = Recipe(**(PILOT_RECIPE if args.pilot else TINY_RECIPE if args.tiny else {}))
    for field in ("seq_len", "batch_size", "lr", "num_fewshot", "eval_questions", "final_eval_questions"):
        if getattr(args, field) is not None:
            setattr(r, field, getattr(args, field))
    return r


def to_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """Cast parameters only: RoPE's inv_freq buffer stays float32, as in transformers' own bf16 loading."""
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model


def log(name: str, msg: str) -> None:
    print(f"[{name}] {msg}", flush=True)


# ---------------------------------------------------------------- data


def _pool_chunk(args: tuple[int, int, frozenset[str], str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start, stop, exclude, tokenizer_file = args
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    docs = [p for p in (synth_gsm8k.problem(synth_gsm8k.VERSION, "stream", i) for i in range(start, stop))
            if synth_gsm8k.twin_key(p) not in exclude]
    # Encoding each shot followed by the next shot's "Question:" gives exactly the tokens the
    # shot has inside a longer prompt: "\n\n" before text splits differently than at the end.
    encs = tok.encode_batch([fewshot.format_example(d) + "Question:" for d in docs])
    ids: list[int] = []
    mask: list[bool] = []
    lengths: list[int] = []
    body_start = len("Question:")
    for doc, enc in zip(docs, encs):
        body_end = len(fewshot.doc_to_text(doc))
        n = len(enc.ids) - 2  # drop the trailing "Question", ":"
        ids.extend(enc.ids[:n])
        mask.extend(not (body_start <= a < body_end) for a, _ in enc.offsets[:n])
        lengths.append(n)
    return np.array(ids, dtype=np.int16), np.array(mask, dtype=np.bool_), np.array(lengths, dtype=np.int64)


@dataclasses.dataclass
class Pool:
    """Tokenized training shots: flat ids and loss mask, with per-shot offsets."""

    ids: np.ndarray
    mask: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def build(cls, n_problems: int, held_out: list[synth_gsm8k.Problem], tokenizer_file: Path, workers: int) -> Pool:
        """The first `n_problems` stream problems that are no twin of a `held_out` one, as shots."""
        exclude = frozenset(map(synth_gsm8k.twin_key, held_out))
        chunk = 5000
        tasks = [(s, min(s + chunk, n_problems), exclude, str(tokenizer_file)) for s in range(0, n_problems, chunk)]
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                parts = pool.map(_pool_chunk, tasks)
        else:
            parts = [_pool_chunk(t) for t in tasks]
        ids, mask, lengths = (np.concatenate([p[i] for p in parts]) for i in range(3))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return cls(ids, mask, starts, lengths)

    def save(self, path: Path) -> None:
        np.savez(path, ids=self.ids, mask=self.mask, starts=self.starts, lengths=self.lengths)

    @classmethod
    def load(cls, path: Path) -> Pool:
        with np.load(path) as z:
            return cls(z["ids"], z["mask"], z["starts"], z["lengths"])

    def batch(self, step: int, seed: int, batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `step`: a pure function of (seed, step). Each row is the longest prefix of its
        random shots that fits in `seq_len`, right-padded; vectorized to keep the GPU fed."""
        rng = np.random.default_rng([seed, step])
        draws = seq_len // int(self.lengths.min()) + 1
        shots = rng.integers(len(self.lengths), size=(batch_size, draws))
        ends = np.cumsum(self.lengths[shots], axis=1)
        keep = ends <= seq_len  # a prefix of each row: lengths are positive
        row = np.nonzero(keep)[0]
        shot = shots[keep]
        n = self.lengths[shot]
        within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # token index inside its shot
        src = np.repeat(self.starts[shot], n) + within
        dst_row = np.repeat(row, n)
        dst_col = np.repeat(ends[keep] - n, n) + within
        ids = np.zeros((batch_size, seq_len), dtype=np.int64)
        labels = np.full((batch_size, seq_len), IGNORE_INDEX, dtype=np.int64)
        ids[dst_row, dst_col] = self.ids[src]
        labels[dst_row, dst_col] = np.where(self.mask[src], self.ids[src], IGNORE_INDEX)
        return torch.from_numpy(ids), torch.from_numpy(labels)


# ---------------------------------------------------------------- model


def build_model(kind: str, vocab_size: int, eos_id: int, tiny: bool, training: bool = True) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    arch = dict(ARCHITECTURES[kind])
    if tiny:
        arch.update({k: v for k, v in TINY_OVERRIDES.items() if k in arch})
    common = dict(vocab_size=vocab_size, bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id)
    if kind == "dense":
        return Qwen3ForCausalLM(Qwen3Config(**arch, **common))
    # The eager expert loop runs under autocast with float32 master weights; grouped_mm would not.
    # The router's load-balancing loss is only wanted while training.
    config = Qwen3MoeConfig(**arch, **common, output_router_logits=training, experts_implementation="eager")
    return Qwen3MoeForCausalLM(config)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def lr_at(step: int, total: int, r: Recipe) -> float:
    if step < r.warmup_steps:
        return r.lr * (step + 1) / r.warmup_steps
    progress = min(1.0, (step - r.warmup_steps) / max(1, total - r.warmup_steps))
    return r.lr * (r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, r: Recipe, device: torch.device) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "embed_tokens" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": r.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=r.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


# ---------------------------------------------------------------- evaluation

_CALC = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>")


def step_accuracy(texts: list[str]) -> float | None:
    """Share of the calculator annotations the model wrote whose result is right."""
    right = total = 0
    for text in texts:
        for a, op, b, c in _CALC.findall(fewshot.cut_at_stop(text)):
            a, b, c = int(a), int(b), int(c)
            total += 1
            right += (op == "/" and b != 0 and a == b * c) or (op != "/" and synth_gsm8k.OPS[op](a, b) == c)
    return right / total if total else None


@torch.no_grad()
def evaluate(model: torch.nn.Module, tok, prompts: list[str], docs: list[dict], r: Recipe, device: torch.device,
             batch_size: int) -> dict:
    """Greedy-decode `prompts` in left-padded batches (shortest first) and score with strict-match."""
    model.eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    responses: list[str] = [""] * len(prompts)
    t0 = time.time()
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True)
        input_ids, attention_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=r.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, stop_strings=["Question:"], tokenizer=tok,
        )
        texts = tok.batch_decode(out[:, input_ids.shape[1]:], skip_special_tokens=True)
        for i, text in zip(idx, texts):
            responses[i] = text
    correct = [fewshot.is_correct(resp, doc) for resp, doc in zip(responses, docs)]
    invalid = sum(fewshot.strict_match(resp) == "[invalid]" for resp in responses)
    return {
        "n": len(docs),
        "accuracy": sum(correct) / len(docs),
        "invalid_rate": invalid / len(docs),
        "step_accuracy": step_accuracy(responses),
        "seconds": round(time.time() - t0, 2),
        "examples": [{"response": fewshot.cut_at_stop(resp), "target": doc["answer"].split("#### ")[-1],
                      "correct": ok} for resp, doc, ok in list(zip(responses, docs, correct))[:3]],
    }


def in_target(e: dict) -> bool:
    return TARGET_RANGE[0] <= e["accuracy"] <= TARGET_RANGE[1]


def choose_checkpoint(evals: list[dict]) -> dict:
    """Inside the target range and closest to the target accuracy (the later step on a tie);
    outside it, the one nearest the range."""
    lo, hi = TARGET_RANGE

    def distance(e: dict) -> tuple[float, float]:
        acc = e["accuracy"]
        outside = lo - acc if acc < lo else acc - hi if acc > hi else 0.0
        return (outside, abs(acc - TARGET_ACCURACY), -e["step"])

    return min(evals, key=distance)


# ---------------------------------------------------------------- saving


def per_expert_state_dict(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """HF checkpoint layout: fused expert tensors (transformers 5.x in memory) become the
    per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` that vLLM and our quantizer read."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if tied and key == "lm_head.weight":
            continue
        if key.endswith("mlp.experts.gate_up_proj"):
            base, inter = key[: -len("gate_up_proj")], value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = value[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = value[e, inter:].contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = value[e].contiguous()
        else:
            out[key] = value.contiguous()
    return dict(sorted(out.items()))


def save_hf_folder(model: torch.nn.Module, folder: Path, tokenizer_dir: Path) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    folder.mkdir(parents=True)
    config = copy.deepcopy(model.config)
    config.dtype = torch.bfloat16
    config.use_cache = True
    config.architectures = [type(model).__name__]  # readers (vLLM, our quantizer) dispatch on it
    if hasattr(config, "output_router_logits"):
        config.output_router_logits = False
    config.save_pretrained(folder)
    # transformers 5 writes `num_local_experts`; released Qwen3-MoE checkpoints (and readers built
    # on transformers 4.x) use `num_experts`, which transformers 5 maps back by its attribute map.
    config_file = folder / "config.json"
    fields = json.loads(config_file.read_text())
    if "num_local_experts" in fields:
        fields["num_experts"] = fields.pop("num_local_experts")
        config_file.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=None, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(folder)
    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    save_file(per_expert_state_dict(state, config.tie_word_embeddings), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, folder / name)


def check_reload(model: torch.nn.Module, folder: Path, tok, device: torch.device) -> float:
    """Max |logit difference| between the in-memory bf16 model and transformers' reload of `folder`."""
    from transformers import AutoModelForCausalLM

    # The same expert kernel as the in-memory model, so any difference is the files' fault.
    same_kernels = {"experts_implementation": "eager"} if hasattr(model.config, "num_experts_per_tok") else {}
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, **same_kernels).to(device).eval()
    ids = tok("Question: A bus has 12 people.\nAnswer: 12+3=<<12+3=15>>15", return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        a = model(ids).logits.float()
        b = reloaded(ids).logits.float()
    return float((a - b).abs().max())


def write_tar(folder: Path, tar_path: Path) -> None:
    """Deterministic tar (sorted names, zero mtimes and owners) of `folder` under its own name."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.iterdir()):
            info = tarfile.TarInfo(f"{folder.name}/{path.name}")
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------- one model


def train_one(args: argparse.Namespace, t_start: float) -> int:
    from transformers import AutoTokenizer
    import transformers

    kind, name = args.model, MODEL_NAMES[args.model]
    r = recipe_for(args)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    deadline = t_start + args.time_budget_s
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))

    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    tok.padding_side = "left"
    train_docs = synth_gsm8k.read_jsonl(args.data_dir / "train.jsonl")
    test_docs = synth_gsm8k.read_jsonl(args.data_dir / "test.jsonl")
    test_prompts = fewshot.prompts(train_docs, test_docs, r.num_fewshot)

    if args.pool_file:
        pool = Pool.load(args.pool_file)
    else:
        pool = Pool.build(r.pool_problems, test_docs, args.tokenizer_dir / "tokenizer.json", args.workers)
    log(name, f"pool: {len(pool.lengths)} shots, {len(pool.ids)} tokens ({time.time() - t_start:.0f}s)")

    model = build_model(kind, len(tok), tok.eos_token_id, args.tiny or args.pilot).to(device)
    n_params = param_count(model)
    opt = make_optimizer(model, r, device)
    autocast = dict(device_type=device.type, dtype=torch.bfloat16)  # CPUs with AMX run bf16 matmuls fast too
    log(name, f"{type(model).__name__}: {n_params / 1e6:.2f}M parameters on {device}")

    eval_n = min(r.eval_questions, len(test_docs))
    n_final = min(r.final_eval_questions, len(test_docs))
    evals: list[dict] = []
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def evaluate_snapshot(step: int) -> dict:
        snap = to_bf16(copy.deepcopy(model))
        if hasattr(snap.config, "output_router_logits"):
            snap.config.output_router_logits = False
        res = evaluate(snap, tok, test_prompts[:eval_n], test_docs[:eval_n], r, device, r.eval_batch_size)
        res["step"] = step
        snapshots[step] = {k: v.detach().cpu().clone() for k, v in snap.state_dict().items()}
        model.train()
        return res

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    total = args.steps or r.max_steps
    eval_steps = {max(1, round(f * total)) for f in r.eval_fractions}
    calibrate_from = 5  # steps [calibrate_from, calibrate_to) are timed to size the run
    calibrate_to = max(calibrate_from + 3, min(25, r.warmup_steps))
    eval_batch_s = 0.0  # seconds per evaluation batch, an upper bound once measured
    losses: list[list[float]] = []
    stopped_early = False
    step_time = None
    t_cal = time.time()
    step = 0
    model.train()
    while step < total:
        if step == calibrate_from:
            sync()
            t_cal = time.time()
        if step == calibrate_to and not args.steps:
            sync()
            step_time = (time.time() - t_cal) / (calibrate_to - calibrate_from)
            # An untrained model never stops early, so this evaluation's time is an upper bound.
            probe = evaluate_snapshot(step)
            snapshots.pop(step)
            eval_batch_s = probe["seconds"] / math.ceil(eval_n / r.eval_batch_size)
            eval_cost = eval_batch_s * (len(r.eval_fractions) * math.ceil(eval_n / r.eval_batch_size)
                                        + math.ceil(n_final / r.final_eval_batch_size))
            room = deadline - time.time() - r.reserve_s - eval_cost
            total = max(step + 1, min(r.max_steps, int(room / step_time)))
            eval_steps = {max(1, round(f * total)) for f in r.eval_fractions}
            log(name, f"step time {step_time * 1e3:.1f} ms, evaluation <= {probe['seconds']:.1f}s -> {total} steps")
        input_ids, labels = pool.batch(step, args.seed, r.batch_size, r.seq_len)
        input_ids, labels = input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, r)
        with torch.autocast(**autocast):
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0 or step == total:
            losses.append([step, round(loss.item(), 4)])
        if step % 500 == 0:
            log(name, f"step {step}/{total} loss {loss.item():.4f} ({time.time() - t_start:.0f}s)")
        # Leave time for one more evaluation, the final test and saving.
        final_cost = eval_batch_s * (math.ceil(eval_n / r.eval_batch_size) + math.ceil(n_final / r.final_eval_batch_size))
        out_of_time = time.time() > deadline - r.reserve_s - final_cost
        if step in eval_steps or step == total or out_of_time:
            res = evaluate_snapshot(step)
            evals.append(res)
            eval_batch_s = max(eval_batch_s, res["seconds"] / math.ceil(eval_n / r.eval_batch_size))
            log(name, f"eval step {step}: strict-match {res['accuracy']:.3f} (n={res['n']}, invalid "
                      f"{res['invalid_rate']:.3f}, step accuracy {res['step_accuracy']}) in {res['seconds']}s")
            if out_of_time and step < total:
                stopped_early = True
                log(name, f"time budget nearly spent: stopping at step {step} of {total}")
                break
            if res["accuracy"] > TARGET_RANGE[1] and any(in_target(e) for e in evals):
                # Saturated, and an earlier checkpoint is already inside the range: more steps
                # cannot improve the choice.
                stopped_early = True
                log(name, f"saturated at step {step}; an earlier checkpoint is inside {TARGET_RANGE}")
                break

    chosen = choose_checkpoint(evals)
    final = to_bf16(build_model(kind, len(tok), tok.eos_token_id, args.tiny or args.pilot, training=False))
    final.load_state_dict(snapshots[chosen["step"]])
    final.to(device)
    final_eval = evaluate(final, tok, test_prompts[:n_final], test_docs[:n_final], r, device,
                          r.final_eval_batch_size)
    in_range = in_target(final_eval)
    log(name, f"chosen step {chosen['step']}: strict-match {final_eval['accuracy']:.3f} on {n_final} test "
              f"questions ({'inside' if in_range else 'OUTSIDE'} {TARGET_RANGE})")

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        save_hf_folder(final, folder, args.tokenizer_dir)
        files = {p.name: {"bytes": p.stat().st_size, "sha256": manifest.sha256(p)} for p in sorted(folder.iterdir())}
        write_tar(folder, args.out / f"{name}.tar")
        log(name, f"saved {args.out / (name + '.tar')}")
        try:
            reload_diff: float | str = check_reload(final, folder, tok, device)
        except Exception as exc:  # the tar is written; report the failed check instead of losing the run
            reload_diff = f"{type(exc).__name__}: {exc}"
    log(name, f"transformers reload: max |logit diff| {reload_diff}")

    run_log = {
        "model": name, "kind": kind, "architecture": type(model).__name__, "tiny": args.tiny,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "reproduce": f"python models/recipes/train.py --model {kind} --seed {args.seed} --steps {step} --out OUT"
                     + (" --tiny --device cpu" if args.tiny else ""),
        "seed": args.seed, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "data": {"version": synth_gsm8k.VERSION,
                 "sha256": {s: manifest.sha256(args.data_dir / f"{s}.jsonl") for s in ("train", "test")},
                 "pool_shots": int(len(pool.lengths))},
        "config": json.loads(final.config.to_json_string()),
        "recipe": dataclasses.asdict(r),
        "parameters": n_params,
        "steps": step, "planned_steps": total, "stopped_early": stopped_early,
        "step_time_s": step_time, "tokens_per_step": r.batch_size * r.seq_len,
        "losses": losses, "evals": evals,
        "chosen": {"step": chosen["step"], "accuracy_eval": chosen["accuracy"], "final_eval": final_eval,
                   "in_range": in_range, "target_range": TARGET_RANGE},
        "reload_max_abs_logit_diff": reload_diff,
        "files": files,
        "wall_s": round(time.time() - t_start, 1),
    }
    (args.out / f"{name}.json").write_text(json.dumps(run_log, indent=1) + "\n")
    return 0 if in_range and isinstance(reload_diff, float) and reload_diff < 1e-2 else 1


# ---------------------------------------------------------------- both models


def train_both(args: argparse.Namespace, t_start: float) -> int:
    """Both models at once on one device: tiny models leave most of a GPU idle, so two
    processes nearly double the work done in the budget. The shot pool is built once."""
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        r = recipe_for(args)
        test_docs = synth_gsm8k.read_jsonl(args.data_dir / "test.jsonl")
        pool = Pool.build(r.pool_problems, test_docs, args.tokenizer_dir / "tokenizer.json", args.workers)
        pool_file = Path(tmp) / "pool.npz"
        pool.save(pool_file)
        log("both", f"pool: {len(pool.lengths)} shots built in {time.time() - t_start:.0f}s")
        procs = {}
        for kind in MODEL_NAMES:
            argv = _replace_opt(args.argv, "--model", kind)
            argv = _replace_opt(argv, "--time-budget-s", f"{args.time_budget_s - (time.time() - t_start):.0f}")
            argv += ["--pool-file", str(pool_file)]
            procs[kind] = subprocess.Popen([sys.executable, __file__, *argv])
        codes = {kind: p.wait() for kind, p in procs.items()}
    rows = []
    for kind, name in MODEL_NAMES.items():
        path = args.out / f"{name}.json"
        if not path.is_file():
            rows.append({"model": name, "error": f"exit {codes[kind]}, no log"})
            continue
        lg = json.loads(path.read_text())
        fe = lg["chosen"]["final_eval"]
        rows.append({
            "model": name, "params_M": round(lg["parameters"] / 1e6, 2), "steps": lg["steps"],
            "step_ms": round((lg["step_time_s"] or 0) * 1e3, 1), "chosen_step": lg["chosen"]["step"],
            "acc_eval": lg["chosen"]["accuracy_eval"], "acc_test": fe["accuracy"], "n_test": fe["n"],
            "invalid": fe["invalid_rate"], "in_range": lg["chosen"]["in_range"],
            "MB": round(lg["files"]["model.safetensors"]["bytes"] / 1e6, 2), "wall_s": lg["wall_s"],
            "exit": codes[kind],
        })
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "models": rows}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n{'model':<16} {'params':>7} {'steps':>6} {'ms/step':>8} {'chosen':>7} {'acc@eval':>8} "
          f"{'acc@test':>8} {'n':>5} {'invalid':>7} {'range':>5} {'MB':>6} {'wall s':>7} {'exit':>4}")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:<16} {row['error']}")
            continue
        print(f"{row['model']:<16} {row['params_M']:>6}M {row['steps']:>6} {row['step_ms']:>8} {row['chosen_step']:>7} "
              f"{row['acc_eval']:>8.3f} {row['acc_test']:>8.3f} {row['n_test']:>5} {row['invalid']:>7.3f} "
              f"{'ok' if row['in_range'] else 'OUT':>5} {row['MB']:>6} {row['wall_s']:>7} {row['exit']:>4}")
    print(f"total wall {time.time() - t_start:.0f}s", flush=True)
    return 0 if all(c == 0 for c in codes.values()) else 1


def _replace_opt(argv: list[str], opt: str, value: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == opt:
            skip = True
            continue
        if a.startswith(opt + "="):
            continue
        out.append(a)
    return [*out, opt, value]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["dense", "moe", "both"], default="both")
    p.add_argument("--out", type=Path, required=True, help="output folder (tars, logs, summary)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="small model and few steps: a CPU smoke run of the whole path")
    p.add_argument("--time-budget-s", type=float, default=450.0, help="wall-clock budget per model, start to files")
    p.add_argument("--pilot", action="store_true", help="CPU learnability check: --tiny model, single problems, 0-shot")
    p.add_argument("--steps", type=int, help="fixed number of steps (default: as many as fit the budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--eval-questions", type=int)
    p.add_argument("--final-eval-questions", type=int)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="processes building the shot pool")
    p.add_argument("--data-dir", type=Path, default=synth_gsm8k.DATA_DIR)
    p.add_argument("--tokenizer-dir", type=Path, default=tokenizer_recipe.TOKENIZER_DIR)
    p.add_argument("--pool-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> int:
    t_start = time.time()
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA GPU; use --device cpu (with --tiny for a smoke run)", file=sys.stderr)
        return 3
    if args.model == "both":
        return train_both(args, t_start)
    return train_one(args, t_start)


if __name__ == "__main__":
    sys.exit(main())
