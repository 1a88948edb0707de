"""Tokenizes text into a data directory for dataset_type="grain".

Run:

  tools/bazel run //tools:prepare_data -- \
      --input=PATH [--input=PATH ...] --output_dir=DIR \
      (--tokenizer=FILE | --train_tokenizer_vocab_size=N)

`--input` names text files (one document each), `.jsonl` files (one document
per line, its `--text_field`), or directories of them. `--tokenizer` is a
sentencepiece `.model` or a Hugging Face `tokenizer.json`;
`--train_tokenizer_vocab_size` trains a sentencepiece BPE tokenizer on the
input first (offline). The directory then holds ArrayRecord shards of the
train and eval splits, the tokenizer, and metadata.json; train on it with

  tools/bazel run //maxtext:train_main -- --config.dataset_type=grain \
      --config.train_data_path=DIR --config.vocab_size=N

A bad input is a one-line error (exit status 2). Relative paths resolve
against the directory `bazel run` was started from.
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.core import progress
from maxtext.text import prepare
from tools import command_line

_INPUT = flags.DEFINE_multi_string(
    "input", [], "Text file, .jsonl file or directory; repeatable."
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Directory to write (must not be prepared already)."
)
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", "", "sentencepiece .model or Hugging Face tokenizer.json."
)
_TRAIN_VOCAB = flags.DEFINE_integer(
    "train_tokenizer_vocab_size",
    0,
    "Train a sentencepiece BPE tokenizer of this many ids (>= 260) instead.",
)
_TEXT_FIELD = flags.DEFINE_string(
    "text_field", "text", "The text field of .jsonl records."
)
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every",
    20,
    "Document i (from 0, input order) goes to eval when i % eval_every == 0.",
)
_TOKEN_DTYPE = flags.DEFINE_enum(
    "token_dtype", "auto", ["auto", "uint16", "uint32"], "Stored id dtype."
)
_EOD_TOKEN = flags.DEFINE_string(
    "eod_token", None, "End-of-document token; default: the tokenizer's."
)
_PROGRESS_S = flags.DEFINE_float(
    "progress_interval_s",
    10.0,
    "Seconds between progress lines on stderr when it is not a terminal.",
)


def main(argv: list[str]) -> None:
  command_line.check(argv, _OUTPUT_DIR)
  with command_line.user_errors("prepare_data"):
    prepare.prepare(
        [caller_paths.resolve_local_path(p) for p in _INPUT.value],
        caller_paths.resolve_local_path(_OUTPUT_DIR.value),
        tokenizer_path=(
            caller_paths.resolve_local_path(_TOKENIZER.value)
            if _TOKENIZER.value
            else ""
        ),
        train_vocab_size=_TRAIN_VOCAB.value,
        text_field=_TEXT_FIELD.value,
        eval_every=_EVAL_EVERY.value,
        token_dtype=_TOKEN_DTYPE.value,
        eod_token=_EOD_TOKEN.value,
        report=lambda line: print(line, flush=True),
        progress=progress.Reporter(progress.stderr(), _PROGRESS_S.value),
    )


if __name__ == "__main__":
  app.run(main)
