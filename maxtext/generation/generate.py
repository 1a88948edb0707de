"""Loads a trained run for sampling: its config, parameters and tokenizer.

`load_run(run_dir, step=None)` reads what a run directory holds:

* the model's config (`model_config.ModelConfig`) and the run's paths
  (`run_dir.RunDirConfig`: its checkpoints, its data) from the run's
  record (`config.json` and `config_history.jsonl`,
  `maxtext.storage.run_record`);
* the parameters of the newest checkpoint, or of `step`, restored alone
  (`checkpointing.restore_params_only`: no optimizer state is read) onto
  this process's first device, whatever mesh the run trained on;
* for a run trained on prepared text (`dataset_type="grain"`), the
  tokenizer its data directory holds, checked against the SHA-256 the run
  recorded, so ids are decoded as the model learned them. Runs on
  synthetic data or token files have no tokenizer: they are sampled from
  token ids.

`generate(run, prompt, options)` and `generate_ids(run, prompt_ids, options)`
then continue a prompt as one `sampling.SamplingOptions` says, with the
key/value-cache decoder (`maxtext.generation.decoder`): a prompt plus
`max_new_tokens` must fit in the model's `max_sequence_length`. Every
problem a user can fix (no run there, no checkpoint, a missing or changed
tokenizer, a prompt too long) is a ValueError with one line naming the path
or option.
"""

import dataclasses
import os
from typing import Any, Optional, Sequence

import jax

from maxtext.core import caller_paths
from maxtext.core import checks
from maxtext.generation import decoder
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.storage import checkpointing
from maxtext.storage import gcs_mirror
from maxtext.storage import run_dir as run_dir_lib
from maxtext.storage import run_record
from maxtext.text import metadata as metadata_lib
from maxtext.generation import sampling
from maxtext.text import tokenizer as tokenizer_lib


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  """A trained run, ready to sample from.

  Attributes:
    run_dir: the run directory.
    step: the checkpoint's step (training steps completed).
    config: the run's model config, its attention set to "auto".
    paths: the paths the run wrote and read (its checkpoints, its data).
    params: the model's parameters on one device.
    tokenizer: the tokenizer of the run's data, or None for a run not
      trained on prepared text.
    eod_id: the end-of-document id of the run's data, or None.
  """

  run_dir: str
  step: int
  config: model_config.ModelConfig
  paths: run_dir_lib.RunDirConfig
  params: Any
  tokenizer: Optional[tokenizer_lib.Tokenizer]
  eod_id: Optional[int]


def _read_record(run_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(config, provenance) the run recorded.

  The config is the newest attempt's (only resumable fields such as
  `steps` may differ between attempts, never the model or its data); the
  provenance is config.json's.
  """
  if not os.path.isdir(run_dir):
    raise ValueError(f"run_dir={run_dir!r}: is not a directory")
  config = run_record.load_recorded_config(run_dir)
  if config is None:
    raise ValueError(
        f"run_dir={run_dir!r}: holds no {run_record.CONFIG_JSON}; is it a "
        "run directory written by train_main?"
    )
  # Without config.json (only the history kept) the config is still enough
  # to sample.
  document = run_record.read_config_json(run_dir) or {}
  return config, document.get("provenance") or {}


def _checkpoint_dir(run_dir: str, paths: run_dir_lib.RunDirConfig) -> str:
  directory = paths.checkpoint_directory or ""
  if not directory:
    return os.path.join(run_dir, "checkpoints")
  if gcs_mirror.is_gs_url(directory):
    return directory
  return caller_paths.resolve_local_path(directory)


def _checkpoint_steps(checkpoint_dir: str) -> list[int]:
  """The committed steps of a local checkpoint directory, ascending.

  Orbax renames a save into its step-numbered directory only once complete,
  so unfinished saves (`<step>.orbax-checkpoint-tmp-*`) and checkpoints set
  aside (`<step>.corrupt-*`) are not listed.
  """
  try:
    names = os.listdir(checkpoint_dir)
  except FileNotFoundError:
    return []
  return sorted(
      int(n)
      for n in names
      if n.isdigit() and os.path.isdir(os.path.join(checkpoint_dir, n))
  )


def _choose_step(checkpoint_dir: str, step: Optional[int]) -> str:
  """The checkpoint path to restore: a step directory, or (for gs://) the
  directory itself, whose newest step orbax picks."""
  if gcs_mirror.is_gs_url(checkpoint_dir):
    return checkpoint_dir if step is None else f"{checkpoint_dir}/{step}"
  steps = _checkpoint_steps(checkpoint_dir)
  if not steps:
    raise ValueError(
        f"{checkpoint_dir}: holds no checkpoint; train the run first (a "
        "run saves every checkpoint_period steps and at its end)"
    )
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(
        f"step={step}: no checkpoint of that step in {checkpoint_dir}; "
        f"it holds steps {steps}"
    )
  return os.path.join(checkpoint_dir, str(step))


def _load_tokenizer(
    paths: run_dir_lib.RunDirConfig, provenance: dict[str, Any]
) -> tuple[Optional[tokenizer_lib.Tokenizer], Optional[int]]:
  """The tokenizer and end-of-document id of a grain run's data."""
  if paths.dataset_type != "grain":
    return None, None
  data = provenance.get("data") or {}
  data_dir = data.get("data_dir") or paths.train_data_path or ""
  try:
    meta = metadata_lib.load(data_dir)
  except ValueError as e:
    raise ValueError(
        f"the run's training data (its tokenizer is needed): {e}"
    ) from None
  path = os.path.join(data_dir, meta["tokenizer"]["file"])
  recorded = data.get("tokenizer_sha256") or meta["tokenizer"]["sha256"]
  if not os.path.isfile(path):
    raise ValueError(
        f"tokenizer {path}: missing; the run trained with the tokenizer "
        f"of sha256 {recorded[:12]}... from that data directory"
    )
  actual = tokenizer_lib.file_sha256(path)
  if actual != recorded:
    raise ValueError(
        f"tokenizer {path}: changed since the run trained (sha256 "
        f"{actual[:12]}..., the run recorded {recorded[:12]}...); its ids "
        "would decode to other text"
    )
  tokenizer = tokenizer_lib.load(path)
  return tokenizer, int(meta["eod_id"])


def load_run(run_dir: str, step: Optional[int] = None) -> LoadedRun:
  """Loads a run's config, checkpointed parameters and tokenizer.

  Args:
    run_dir: the run directory (`<base_output_directory>/<run_name>`).
    step: the checkpoint's step; None = the newest.

  Returns:
    The LoadedRun.

  Raises:
    ValueError: one line naming the path or value: no run directory or
      record there, no checkpoint (of `step`), the run's data directory or
      tokenizer missing, or the tokenizer changed since the run trained.
  """
  if step is not None:
    step = checks.check_int("step", step, 0)
  run_dir = os.path.abspath(run_dir)
  values, provenance = _read_record(run_dir)
  paths = run_dir_lib.RunDirConfig.from_config(values)
  tokenizer, eod_id = _load_tokenizer(paths, provenance)
  path = _choose_step(_checkpoint_dir(run_dir, paths), step)
  # What the run trained with runs here on one device of any backend: the
  # attention the run chose (e.g. a TPU kernel) may not exist here.
  config = model_config.ModelConfig.from_config(values, attention="auto")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = transformer.abstract_params(config, device)
  try:
    params = checkpointing.restore_params_only(path, abstract)
  except FileNotFoundError as e:
    raise ValueError(str(e).replace("load_parameters_path ", "")) from None
  restored_step = step
  if restored_step is None:
    name = os.path.basename(path.rstrip("/"))
    restored_step = int(name) if name.isdigit() else -1
  return LoadedRun(
      run_dir, restored_step, config, paths, params, tokenizer, eod_id
  )


def generate_ids(
    run: LoadedRun,
    prompt_ids: Sequence[int],
    options: sampling.SamplingOptions,
) -> list[list[int]]:
  """Continues `prompt_ids`; one list of new ids per sample, each ending
  at its first stop id (kept) or after `options.max_new_tokens` ids.

  Args and Raises: as `decoder.generate` for one prompt. With a tokenizer,
  ids it does not know are never drawn.
  """
  out = decoder.generate(
      run.params,
      run.config,
      [prompt_ids],
      options,
      allowed_vocab=(
          min(run.tokenizer.vocab_size, run.config.vocab_size)
          if run.tokenizer
          else 0
      ),
  )
  return [
      [int(i) for i in row[:length]]
      for row, length in zip(out.ids, out.lengths)
  ]


def encode_prompt(run: LoadedRun, prompt: str) -> list[int]:
  """The prompt's ids; an empty prompt is the end-of-document id, i.e. the
  start of a new document.

  Raises:
    ValueError: the run has no tokenizer (sample it from token ids).
  """
  if run.tokenizer is None:
    raise ValueError(
        f"run_dir={run.run_dir!r}: trained on dataset_type="
        f"{run.paths.dataset_type!r}, which has no tokenizer; give the "
        "prompt as token ids (--prompt_ids=1,2,3)"
    )
  return run.tokenizer.encode(prompt) if prompt else [run.eod_id]


def until_end_of_document(run: LoadedRun, ids: Sequence[int]) -> list[int]:
  """`ids` up to (not including) the first end-of-document id."""
  ids = list(ids)
  if run.eod_id is not None and run.eod_id in ids:
    return ids[: ids.index(run.eod_id)]
  return ids


def generate(
    run: LoadedRun, prompt: str, options: sampling.SamplingOptions
) -> list[str]:
  """Continues the text `prompt`; one decoded continuation per sample.

  A continuation ends at the first end-of-document id (the model finished
  a document; it is a stop id besides `options.stop_ids`), at a stop id, or
  after `options.max_new_tokens` ids.

  Args and Raises: as `generate_ids` and `encode_prompt`.
  """
  ids = encode_prompt(run, prompt)
  if run.eod_id is not None and run.eod_id not in options.stop_ids:
    options = dataclasses.replace(
        options, stop_ids=options.stop_ids + (run.eod_id,)
    )
  rows = generate_ids(run, ids, options)
  return [run.tokenizer.decode(until_end_of_document(run, r)) for r in rows]
