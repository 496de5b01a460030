"""Byte-level BPE tokenizer for the tiny models, trained offline on generated problems.

Digits are split one per token so that arithmetic is learnable digit by digit. The result
is a standard HF tokenizer folder (tokenizer.json + tokenizer_config.json with a Qwen-style
chat template) that transformers loads offline. Training is deterministic: the corpus is a
fixed slice of the generator and `tokenizers`' BPE trainer breaks ties by byte order.

    python models/recipes/tokenizer.py            # write models/data/tokenizer-v1/
    python models/recipes/tokenizer.py --check    # verify the shipped files
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fewshot  # noqa: E402
import synth_gsm8k  # noqa: E402

# The tokenizer predates data v2 and is kept: its corpus is v1 draws, which no data file holds.
CORPUS_VERSION = "v1"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / f"tokenizer-{CORPUS_VERSION}"
VOCAB_SIZE = 960  # a multiple of 64; the corpus yields about 965 distinct tokens
CORPUS_PROBLEMS = 20_000
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]
MAX_LENGTH = 2048
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus() -> list[str]:
    # Text shaped like the few-shot prompts the model sees, from a split no file uses.
    stream = synth_gsm8k.problems("tokenizer", version=CORPUS_VERSION)
    return [fewshot.format_example(next(stream)) for _ in range(CORPUS_PROBLEMS)]


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "model_max_length": MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def tokenizer_files() -> dict[str, bytes]:
    """File name -> bytes of the tokenizer folder."""
    return {
        "tokenizer.json": train_tokenizer().to_str(pretty=True).encode(),
        "tokenizer_config.json": (json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n").encode(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TOKENIZER_DIR, help="output folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="verify the files in --out instead of writing them")
    args = parser.parse_args(argv)
    files = tokenizer_files()
    if args.check:
        bad = [name for name, data in files.items() if not (args.out / name).is_file() or (args.out / name).read_bytes() != data]
        if bad:
            print(f"error: {', '.join(bad)} in {args.out} differ from a fresh training; regenerate with "
                  f"`python models/recipes/tokenizer.py --out {args.out}`", file=sys.stderr)
            return 1
        print(f"ok: {args.out} matches a fresh training")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
    print(f"wrote {args.out} (vocab {VOCAB_SIZE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
