"""Prints continuations of a prompt by a trained run. The runbook:

  # Greedy continuation by the newest checkpoint of a run trained on
  # prepared text (dataset_type=grain):
  tools/bazel run //tools:generate -- --run_dir=DIR --prompt="def main("

  # Three samples at temperature 0.8 among the 40 likeliest tokens, from the
  # checkpoint of step 500, seed 7 (the same seed prints the same text):
  tools/bazel run //tools:generate -- --run_dir=DIR --step=500 \\
      --prompt="import os" --temperature=0.8 --top_k=40 --num_samples=3 \\
      --seed=7

  # Nucleus sampling: draw among the likeliest tokens that make up 90% of
  # the probability, and end a sample at token id 10 (a newline, say):
  tools/bazel run //tools:generate -- --run_dir=DIR --prompt="import os" \\
      --temperature=0.7 --top_p=0.9 --stop=10

  # A run on synthetic data or a tokens file has no tokenizer: give ids.
  tools/bazel run //tools:generate -- --run_dir=DIR --prompt_ids=1,2,3

DIR is `<base_output_directory>/<run_name>`; a relative one resolves against
the directory `bazel run` was started from. Generation uses the
key/value-cache decoder (`maxtext.generation.decoder`): the prompt plus
--max_new_tokens must fit in the model's max_sequence_length. With
--prompt, each sample prints as a header line and the prompt followed by
its continuation (which ends at the end of a document, after a --stop id,
or after --max_new_tokens tokens); with --prompt_ids, as the new ids,
comma-separated (a --stop id ends them, and is printed). A bad input is a
one-line error (exit status 2).
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.generation import generate
from maxtext.generation import sampling
from tools import command_line

_RUN_DIR = flags.DEFINE_string("run_dir", None, "The run directory.")
_STEP = flags.DEFINE_integer(
    "step", None, "Checkpoint step to load; default: the newest."
)
_PROMPT = flags.DEFINE_string(
    "prompt", None, "Text to continue (runs trained on prepared text)."
)
_PROMPT_IDS = flags.DEFINE_list(
    "prompt_ids", None, "Token ids to continue, comma-separated."
)
_MAX_NEW = flags.DEFINE_integer(
    "max_new_tokens", 64, "Tokens to generate per sample."
)
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "Softmax temperature; 0 = greedy (argmax)."
)
_TOP_K = flags.DEFINE_integer(
    "top_k", 0, "Draw among the k likeliest tokens; 0 = all."
)
_TOP_P = flags.DEFINE_float(
    "top_p",
    1.0,
    "Draw among the likeliest tokens whose probabilities first reach this "
    "sum (nucleus sampling); 1 = all.",
)
_STOP = flags.DEFINE_list(
    "stop", [], "Token ids that end a sample, comma-separated."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the draws.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Continuations to print.")


def _ids(flag: str, values: list[str]) -> list[int]:
  try:
    return [int(v) for v in values]
  except ValueError:
    raise ValueError(
        f"{flag}={','.join(values)!r}: expected comma-separated integers"
    ) from None


def _generate() -> None:
  """Loads the run and prints its samples; ValueError for a bad input."""
  if (_PROMPT.value is None) == (_PROMPT_IDS.value is None):
    raise ValueError("give exactly one of --prompt and --prompt_ids")
  # The sampling options are checked before the (slower) load.
  options = sampling.SamplingOptions(
      max_new_tokens=_MAX_NEW.value,
      temperature=_TEMPERATURE.value,
      top_k=_TOP_K.value,
      top_p=_TOP_P.value,
      seed=_SEED.value,
      num_samples=_NUM_SAMPLES.value,
      stop_ids=tuple(_ids("stop", _STOP.value)),
  )
  prompt_ids = (
      _ids("prompt_ids", _PROMPT_IDS.value)
      if _PROMPT_IDS.value is not None
      else None
  )
  run = generate.load_run(
      caller_paths.resolve_local_path(_RUN_DIR.value), _STEP.value
  )
  how = (
      "greedy"
      if options.greedy
      else f"temperature {options.temperature:g}, top_k {options.top_k}, "
      f"top_p {options.top_p:g}, seed {options.seed}"
  )
  if prompt_ids is not None:
    rows = generate.generate_ids(run, prompt_ids, options)
    print(f"generate: {run.run_dir} step {run.step}, {how}")
    for row in rows:
      print(",".join(str(i) for i in row))
    return
  texts = generate.generate(run, _PROMPT.value, options)
  print(f"generate: {run.run_dir} step {run.step}, {how}")
  for i, text in enumerate(texts):
    print(f"=== sample {i + 1}/{len(texts)} ===")
    print(_PROMPT.value + text, flush=True)


def main(argv: list[str]) -> None:
  command_line.check(argv, _RUN_DIR)
  with command_line.user_errors("generate"):
    _generate()


if __name__ == "__main__":
  app.run(main)
