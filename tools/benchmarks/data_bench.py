r"""Benchmark: the input pipeline against the training step's demand.

Runbook:

  tools/bazel run //tools/benchmarks:data_bench -- [--shapes=default,gpu_1b]
      [--workers=0,2] [--batches=40] [--steps=30] [--warmup_steps=3]
      [--device_kind="NVIDIA H200"] [--mfu=0.4] [--num_devices=1]
      [--output_dir=DIR] [--dataset_type=grain|megatron]
  # A shape changed: --set=<shape>.<field>=<JSON value>, e.g.
  #   --set=gpu_1b.global_batch_size=8
  # --set=<shape>.grain_worker_count=N measures that shape at N workers only.

The goal: the pipeline is never the bottleneck, i.e. the training loop waits
for its next batch at most `--goal_share` (2%) of its step time, as the
trainer's own step timing reports it.

Data: the Python standard library's sources (`testing/stdlib_corpus`),
prepared by `maxtext.text.prepare` (a `--vocab`-piece sentencepiece
tokenizer trained on them, the library's default records and shards), read
through dataset_type="grain" (`maxtext.data.grain_dataset.GrainDataset`) at
each shape's real batch x sequence. A shape is a config file of
`maxtext/configs/` whose vocabulary is raised to the tokenizer's where
smaller (default.py's 256 ids are fewer than any trained tokenizer's), with
`--set` overrides. Each shape is measured with each `--workers` count
(`grain_worker_count`: 0 reads in the trainer's process with Grain's
threads, n > 0 in n worker processes).

`--dataset_type=megatron` reads Megatron indexed datasets instead
(`maxtext.data.megatron_dataset`, the MLPerf references' data): the same
corpus's train split (each document ending in the tokenizer's
end-of-document id, one sequence per document) written as
`train_text_document.{idx,bin}` (int32, `megatron_index.write`), read in the
trainer's thread (the workers column is 0). It is the eval prefix too: the
corpus's eval split is too short for long sequences, and evaluation is
untimed.

Per row:

  pipeline_b/s  batches/s that `get_batch` delivers when called back to
                back, after `--warmup_batches` (the iterator's start, worker
                processes' start-up); Grain's read-ahead buffer of a few
                batches counts into the first timed ones.
  steps, step_ms, wait_ms, wait_share
                the loop fed by the pipeline, over `--steps` steps after
                `--warmup_steps`: steps counted, mean step time, mean data
                wait per step, sum(waits) / sum(step times). `times_from`:
    metrics.jsonl   (shapes in `--train_shapes`) the trainer's own timing:
        `workloads.run(config)` trains the shape on the prepared data, and
        the figures are its train records' `step_time_s` and `data_wait_s`
        (the step's seconds in the data set's `get_batch`; see
        `maxtext/run/trainer.py`). The config's model, batch, K and learning
        rate schedule; one evaluation and one checkpoint, after the last
        step (outside the step times); no MLPerf log.
    paced_stand-in  (the others: too big to train on this host) NOT the
        trainer: a stand-in for the device's step. Per step the host reads
        the next batch (timed: the wait), then sleeps until the FLOP-based
        step time has passed since the step started, as it idles in
        `update()` while an accelerator computes.
  demand_b/s    steps/s of the training step when data costs nothing:
    trainer     (trained shapes) the row's trainer run:
        1 / mean(step_time_s - data_wait_s); on a CPU the pipeline's
        threads and processes share the cores with the step, as they do in
        any CPU run.
    <device>    (the others) the model's FLOPs per step
        (`maxtext.metrics.throughput`, the FLOPs the trainer's MFU counts)
        over `--num_devices` devices of `--device_kind` at `--mfu` of their
        dense peak for the config's compute dtype.
  ratio         pipeline_b/s / demand_b/s (>= 1: the pipeline keeps up).

`--output_dir` keeps the prepared data (data/) and the runs
(runs/<shape>_workers<n>/metrics.jsonl); by default a temp dir, removed.
The last line is:

  data_bench: min_ratio=R worst_wait_share=S% goal=met|missed

goal=met when every row's wait_share is at most `--goal_share` and its ratio
at least 1.
"""

import dataclasses
import importlib
import json
import math
import os
import shutil
import tempfile
import time
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags
import grain
import jax
import numpy as np

from maxtext.core import checks
from maxtext.config import config_lib
from maxtext.data import data_config
from maxtext.data import dataset_kinds
from maxtext.config import optimizer
from maxtext import workloads
from maxtext.metrics import jsonl
from maxtext.metrics import throughput
from maxtext.text import megatron_index
from maxtext.text import metadata as text_metadata
from maxtext.text import prepare
from testing import stdlib_corpus

_SHAPES = flags.DEFINE_list(
    "shapes", ["default", "gpu_1b"], "Config files of maxtext/configs/."
)
_TRAIN_SHAPES = flags.DEFINE_list(
    "train_shapes",
    ["default"],
    "Shapes the trainer trains here (the others are paced at their FLOP "
    "step time on --device_kind at --mfu).",
)
_SET = flags.DEFINE_multi_string(
    "set", [], "<shape>.<field>=<JSON value> overrides of a shape's config."
)
_WORKERS = flags.DEFINE_list(
    "workers", ["0", "2"], "grain_worker_count values to measure."
)
_BATCHES = flags.DEFINE_integer(
    "batches", 40, "Batches timed when reading the pipeline alone."
)
_WARMUP_BATCHES = flags.DEFINE_integer(
    "warmup_batches", 4, "Batches read before timing the pipeline alone."
)
_STEPS = flags.DEFINE_integer("steps", 30, "Training steps timed per row.")
_WARMUP_STEPS = flags.DEFINE_integer(
    "warmup_steps",
    3,
    "Training steps before the timed ones (compilation, the pipeline's "
    "start); a trainer run trains warmup_steps + steps steps.",
)
_DEVICE_KIND = flags.DEFINE_string(
    "device_kind",
    "NVIDIA H200",
    "Device whose peak sets the FLOP-based demand (a kind in "
    "maxtext/metrics/throughput.py's table).",
)
_MFU = flags.DEFINE_float(
    "mfu", 0.4, "Fraction of the device's dense peak the step reaches."
)
_NUM_DEVICES = flags.DEFINE_integer(
    "num_devices", 1, "Devices sharing one step, all fed by this process."
)
_CORPUS_FILES = flags.DEFINE_integer(
    "corpus_files", 25, "Standard library source files in the corpus."
)
_VOCAB = flags.DEFINE_integer(
    "vocab", 512, "Pieces of the sentencepiece tokenizer trained on it."
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    "",
    "Keeps the prepared data and the trainer's runs here (empty or absent); "
    "empty = a temp dir, removed at the end.",
)
_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir",
    "",
    "JAX's persistent compilation cache; empty = a dir under the output.",
)
_DATASET_TYPE = flags.DEFINE_enum(
    "dataset_type",
    "grain",
    ["grain", "megatron"],
    "The data set kind read: prepared text through Grain, or the same "
    "tokens as Megatron indexed datasets.",
)
_GOAL_SHARE = flags.DEFINE_float(
    "goal_share", 0.02, "Largest data wait share of the step time."
)

TRAINER_DEMAND = "trainer"
FROM_RECORDS = "metrics.jsonl"
FROM_PACED = "paced_stand-in"
_WORKERS_FIELD = "grain_worker_count"


@dataclasses.dataclass(frozen=True)
class LoopTimes:
  """Per-step times of a training loop (s), index-aligned, non-empty."""

  step: list[float]
  wait: list[float]

  @property
  def wait_share(self) -> float:
    return math.fsum(self.wait) / math.fsum(self.step)

  @property
  def busy_rate(self) -> float:
    """Steps/s of the loop with its data waits taken out."""
    return len(self.step) / (math.fsum(self.step) - math.fsum(self.wait))


@dataclasses.dataclass(frozen=True)
class Row:
  """One (shape, worker count) measurement.

  Attributes:
    shape: the config file's name.
    workers: grain_worker_count.
    pipeline_rate: batches/s of the pipeline read alone.
    demand_rate: steps/s the training step needs.
    demand_from: "trainer" (its run's records) or the device the FLOPs
      assume.
    times: the timed steps of the loop fed by the pipeline.
    times_from: "metrics.jsonl" (the trainer's records) or
      "paced_stand-in" (the device's step emulated).
  """

  shape: str
  workers: int
  pipeline_rate: float
  demand_rate: float
  demand_from: str
  times: LoopTimes
  times_from: str

  @property
  def ratio(self) -> float:
    return self.pipeline_rate / self.demand_rate

  @property
  def wait_share(self) -> float:
    return self.times.wait_share


def prepare_corpus(output_dir: str, files: int, vocab: int) -> dict:
  """Prepares `files` stdlib sources into `output_dir`; returns metadata."""
  return prepare.prepare(
      stdlib_corpus.files(files),
      output_dir,
      train_vocab_size=vocab,
      report=lambda line: None,
  )


MEGATRON_PREFIX = "train_text_document"


def write_megatron(data_dir: str) -> str:
  """The prepared corpus's train split as a Megatron indexed dataset (int32).

  Its documents, in order, each ending in its end-of-document id, as the
  prepared records hold them; one sequence per document.

  Returns:
    The prefix written.
  """
  meta = text_metadata.load(data_dir)
  eod = int(meta["eod_id"])
  prefixes = {}
  for split, name in (("train", MEGATRON_PREFIX),):
    source = grain.sources.ArrayRecordDataSource(
        [os.path.join(data_dir, n) for n in meta["splits"][split]["shards"]]
    )
    stream = np.concatenate(
        [
            np.frombuffer(source[i], np.dtype(meta["token_dtype"]))
            for i in range(len(source))
        ]
    )
    ends = np.flatnonzero(stream == eod) + 1
    documents = [[piece] for piece in np.split(stream, ends) if piece.size]
    prefix = os.path.join(data_dir, name)
    megatron_index.write(prefix, documents, np.int32)
    prefixes[split] = prefix
  return prefixes["train"]


def _parse_overrides(items: Sequence[str]) -> dict[str, dict]:
  """`<shape>.<field>=<JSON>` items -> {shape: {field: value}}."""
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    shape, dot, field = key.partition(".")
    if not sep or not dot or not shape or not field:
      raise ValueError(
          f"--set={item!r}: want <shape>.<field>=<JSON value>, e.g. "
          "gpu_1b.global_batch_size=8"
      )
    try:
      parsed = json.loads(value)
    except json.JSONDecodeError:
      parsed = value
    out.setdefault(shape, {})[field] = parsed
  return out


def shape_config(
    name: str,
    data_dir: str,
    vocab: int,
    workers: int,
    overrides: Optional[dict] = None,
    dataset_type: str = "grain",
):
  """`maxtext/configs/<name>.py` reading `data_dir` through Grain.

  Args:
    name: the config file's module name ("default", "gpu_1b", ...).
    data_dir: a prepared data directory (with `write_megatron`'s files for
      dataset_type "megatron").
    vocab: the prepared data's vocabulary; the config's is raised to it.
    workers: grain_worker_count.
    overrides: further fields to set, applied last.
    dataset_type: "grain" or "megatron".

  Raises:
    ValueError, TypeError: `name` is no config file, an override names no
      field, or the config does not validate (`config_lib.validate`).
  """
  try:
    module = importlib.import_module(f"maxtext.configs.{name}")
  except ImportError:
    raise ValueError(
        f"--shapes: {name!r} is no maxtext/configs/ file"
    ) from None
  config = module.get_config()
  _read_data_dir(config, data_dir, dataset_type)
  config.vocab_size = max(config.vocab_size, vocab)
  config.grain_worker_count = workers
  # A training step of this benchmark runs on this host's devices.
  config.hardware = "auto"
  config.data_parallelism = 1
  config.fsdp_parallelism = -1
  for field, value in (overrides or {}).items():
    if field not in config:
      raise ValueError(f"--set: {name} has no field {field!r}")
    config[field] = value
  if dataset_type == "megatron":
    # The eval set (untimed) is the prefix's first few rows (a divisor of
    # the micro-batch, so the mesh takes it): a shape's own eval set may
    # want more rows than the small corpus has.
    config.eval_steps = 1
    config.eval_batch_size = math.gcd(
        config.global_batch_size // config.gradient_accumulation_steps, 8
    )
  _validate_shape(config)
  return config


def _read_data_dir(config, data_dir: str, dataset_type: str) -> None:
  """Points `config`'s train data at `data_dir` read as `dataset_type`
  ("grain" or "megatron": the prefix `write_megatron` wrote), with no eval
  data of its own."""
  config.dataset_type = dataset_type
  if dataset_type == "megatron":
    config.train_data_path = os.path.join(data_dir, MEGATRON_PREFIX)
    config.eval_data_path = config.train_data_path
    config.megatron_eval_samples = 0
  else:
    config.train_data_path = data_dir
    config.eval_data_path = ""


def _validate_shape(config) -> None:
  """Validates `config`'s model, batch and step fields; GrainDataset checks
  the data's own (the data may not be prepared yet).

  Raises:
    ValueError, TypeError: as `config_lib.validate`.
  """
  check = config.copy_and_resolve_references()
  check.dataset_type = "synthetic"
  check.enable_mllog = False  # No MLPerf log: its rules do not apply.
  config_lib.validate(check)


def shape_workers(
    workers: Sequence[int], overrides: Optional[dict]
) -> list[int]:
  """The worker counts a shape is measured at: --set's one, else `workers`.

  Raises:
    ValueError: the override's grain_worker_count is no int >= 0.
  """
  if overrides and _WORKERS_FIELD in overrides:
    return [checks.check_int(_WORKERS_FIELD, overrides[_WORKERS_FIELD], 0)]
  return list(workers)


def flops_step_time(
    config, device_kind: str, mfu: float, num_devices: int
) -> float:
  """Seconds one step of `config` takes at `mfu` of the devices' peak.

  Raises:
    ValueError: the table has no peak for `device_kind` and the config's
      compute dtype, or `mfu` is not in (0, 1].
  """
  mfu = checks.check_number("mfu", mfu, finite=True, positive=True)
  if mfu > 1:
    raise ValueError(f"mfu={mfu}: must be in (0, 1]")
  num_devices = checks.check_int("num_devices", num_devices, 1)
  run = throughput.StepThroughput.for_run(
      throughput.ThroughputConfig.from_config(config),
      [device_kind] * num_devices,
  )
  if run.peak_flops_per_device is None:
    raise ValueError(
        f"device_kind={device_kind!r}: no {config.compute_dtype} peak in "
        f"maxtext/metrics/throughput.py (known: "
        f"{', '.join(throughput.known_device_kinds())})"
    )
  return run.flops_per_step / (num_devices * run.peak_flops_per_device * mfu)


def pipeline_rate(config, batches: int, warmup: int) -> float:
  """Batches/s of a fresh pipeline's `get_batch` called back to back.

  Reads steps 0 .. warmup + batches - 1 and times the last `batches`.
  """
  dataset = dataset_kinds.make_dataset(
      data_config.DataConfig.from_config(config)
  )
  try:
    for step in range(warmup):
      dataset.get_batch(step)
    start = time.perf_counter()
    for step in range(warmup, warmup + batches):
      dataset.get_batch(step)
    return batches / (time.perf_counter() - start)
  finally:
    dataset.close()


def train_config(
    config, runs_dir: str, run_name: str, steps: int, cache_dir: str
):
  """`config` (a `shape_config`) as a trainer run of `steps` steps.

  The run, `<runs_dir>/<run_name>`, keeps the config's model, batch, K and
  learning-rate schedule; it evaluates and checkpoints only after its last
  step (outside every step's time), writes no MLPerf log and does not stop
  early.
  """
  config = config.copy_and_resolve_references()
  config.lr_schedule_steps = optimizer.schedule_length(
      config.lr_schedule_steps, config.steps
  )
  config.steps = steps
  config.base_output_directory = runs_dir
  config.run_name = run_name
  config.eval_interval = steps
  config.eval_steps = 1
  config.checkpoint_period = 0
  config.target_eval_loss = 0.0
  config.enable_mllog = False
  config.profiler_steps = 0
  config.jax_compilation_cache_dir = cache_dir
  return config


def record_times(run_dir: str, warmup: int) -> LoopTimes:
  """The step and data wait times of a run's train records past `warmup`.

  Args:
    run_dir: a trainer run's directory (its metrics.jsonl).
    warmup: train records of steps below this are left out.

  Raises:
    ValueError: no train record past the warm-up, or one lacks
      step_time_s or data_wait_s.
  """
  path = os.path.join(run_dir, jsonl.METRICS_FILENAME)
  timed = [
      r
      for r in jsonl.read_jsonl(path)
      if r[jsonl.KIND_KEY] == jsonl.TRAIN and r[jsonl.STEP_KEY] >= warmup
  ]
  if not timed:
    raise ValueError(f"{path}: no train record of a step >= {warmup}")
  for record in timed:
    for key in (jsonl.STEP_TIME_KEY, jsonl.DATA_WAIT_KEY):
      if key not in record:
        raise ValueError(
            f"{path}: step {record[jsonl.STEP_KEY]}'s record has no {key!r}"
        )
  return LoopTimes(
      [r[jsonl.STEP_TIME_KEY] for r in timed],
      [r[jsonl.DATA_WAIT_KEY] for r in timed],
  )


def trainer_times(config, warmup: int) -> LoopTimes:
  """Trains `config` with the trainer; its records' times past `warmup`."""
  result = workloads.run(config, config_filename="data_bench")
  if result.final_step != config.steps:
    raise RuntimeError(
        f"{result.run_dir}: the run ended at step {result.final_step} of "
        f"{config.steps} ({result.status})"
    )
  return record_times(result.run_dir, warmup)


def paced_loop(
    get_batch: Callable[[int], dict], step_s: float, steps: int, warmup: int
) -> LoopTimes:
  """A stand-in for the trainer's loop whose device step is a wait.

  Per step the host reads the next batch (timed: the data wait), then
  idles until `step_s` has passed since the step started, as it does in
  `update()` while an accelerator computes. Returns the last `steps`
  steps' times.
  """
  times, waits = [], []
  get_batch(0)
  step_start = time.monotonic()
  for step in range(warmup + steps):
    wait_start = time.monotonic()
    get_batch(step + 1)
    waits.append(time.monotonic() - wait_start)
    rest = step_start + step_s - time.monotonic()
    if rest > 0:
      time.sleep(rest)
    now = time.monotonic()
    times.append(now - step_start)
    step_start = now
  return LoopTimes(times[warmup:], waits[warmup:])


def paced_times(config, step_s: float, steps: int, warmup: int) -> LoopTimes:
  """`paced_loop` over a fresh pipeline of `config`, read from step 0."""
  dataset = dataset_kinds.make_dataset(
      data_config.DataConfig.from_config(config)
  )
  try:
    return paced_loop(dataset.get_batch, step_s, steps, warmup)
  finally:
    dataset.close()


def _shape_line(
    name: str,
    base,
    flop_step: float,
    device_kind: str,
    mfu: float,
    num_devices: int,
) -> str:
  """The first part of a shape's description line: its batch, FLOPs a
  step and the FLOP-based step time on `num_devices` x `device_kind`."""
  flops = throughput.StepThroughput.for_run(
      throughput.ThroughputConfig.from_config(base), ["cpu"]
  ).flops_per_step
  tokens = base.global_batch_size * base.max_sequence_length
  return (
      f"{name}: global batch {base.global_batch_size} x seq "
      f"{base.max_sequence_length} ({tokens:,} tokens) in "
      f"K={base.gradient_accumulation_steps}, vocab {base.vocab_size}, "
      f"{flops / 1e9:,.3g} GFLOP/step; {num_devices} x {device_kind} at "
      f"{mfu:.0%} MFU ({base.compute_dtype}): {flop_step * 1e3:,.4g} "
      "ms/step; "
  )


def _loop_note(train: bool, train_steps: int) -> str:
  """The end of a shape's description line: where its wait share comes
  from (the trainer's `train_steps` steps a row, or a paced stand-in)."""
  if train:
    return (
        f"trained here by trainer.run ({train_steps} steps per "
        "row): wait share from its metrics.jsonl"
    )
  return (
      "not trained here: wait share from a paced stand-in for the device "
      "step, not from the trainer"
  )


def measure_shape(
    name: str,
    data_dir: str,
    vocab: int,
    workers: Sequence[int],
    overrides: Optional[dict],
    *,
    train: bool,
    runs_dir: str,
    cache_dir: str,
    batches: int,
    warmup_batches: int,
    steps: int,
    warmup_steps: int,
    device_kind: str,
    mfu: float,
    num_devices: int,
    dataset_type: str = "grain",
) -> tuple[list[Row], str]:
  """Rows of one shape, one per worker count, and its description line.

  A `train` shape's loop is the trainer's (`trainer.run`, its records); the
  others' is `paced_loop` at the FLOP-based step time.
  """
  base = shape_config(name, data_dir, vocab, 0, overrides, dataset_type)
  flop_step = flops_step_time(base, device_kind, mfu, num_devices)
  line = _shape_line(
      name, base, flop_step, device_kind, mfu, num_devices
  ) + _loop_note(train, warmup_steps + steps)
  device = device_kind.replace(" ", "_") + f"@{mfu:.0%}MFU"
  rows = []
  for count in shape_workers(workers, overrides):
    config = shape_config(name, data_dir, vocab, count, overrides, dataset_type)
    rate = pipeline_rate(config, batches, warmup_batches)
    if train:
      config = train_config(
          config,
          runs_dir,
          f"{name}_workers{count}",
          warmup_steps + steps,
          cache_dir,
      )
      times = trainer_times(config, warmup_steps)
      demand, demand_from, times_from = (
          times.busy_rate,
          TRAINER_DEMAND,
          FROM_RECORDS,
      )
    else:
      times = paced_times(config, flop_step, steps, warmup_steps)
      demand, demand_from, times_from = 1.0 / flop_step, device, FROM_PACED
    rows.append(Row(name, count, rate, demand, demand_from, times, times_from))
  return rows, line


def format_table(rows: Sequence[Row]) -> list[str]:
  """The table's lines: a header, then one line per row."""
  lines = [
      f"{'shape':<10} {'workers':>7} {'pipeline_b/s':>12} {'demand_b/s':>11} "
      f"{'ratio':>9} {'steps':>5} {'step_ms':>9} {'wait_ms':>8} "
      f"{'wait_share':>10}  {'times_from':<14}  demand_from"
  ]
  for r in rows:
    t = r.times
    lines.append(
        f"{r.shape:<10} {r.workers:>7d} {r.pipeline_rate:>12.2f} "
        f"{r.demand_rate:>11.3f} {r.ratio:>9.2f} {len(t.step):>5d} "
        f"{math.fsum(t.step) / len(t.step) * 1e3:>9.2f} "
        f"{math.fsum(t.wait) / len(t.wait) * 1e3:>8.3f} "
        f"{r.wait_share:>9.2%}  {r.times_from:<14}  {r.demand_from}"
    )
  paced = sorted({r.shape for r in rows if r.times_from == FROM_PACED})
  if paced:
    lines.append(
        f"{FROM_PACED} rows ({', '.join(paced)}): not trained here; their "
        "wait_share is a stand-in loop's (the host sleeps through the "
        "FLOP-based device step), not the trainer's step timing"
    )
  return lines


def verdict(rows: Sequence[Row], goal_share: float) -> str:
  """The closing line: the worst row's ratio and wait share, the goal."""
  min_ratio = min(r.ratio for r in rows)
  worst = max(r.wait_share for r in rows)
  met = worst <= goal_share and min_ratio >= 1
  return (
      f"data_bench: min_ratio={min_ratio:.2f} worst_wait_share={worst:.2%} "
      f"goal={'met' if met else 'missed'}"
  )


def _output_dir(path: str) -> str:
  """--output_dir made ready: a new temp dir for "", else `path` (empty)."""
  if not path:
    return tempfile.mkdtemp(prefix="data_bench_")
  path = os.path.abspath(path)
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise app.UsageError(
        f"--output_dir={path!r}: want an empty or absent directory (the "
        "trainer would resume runs left there)"
    )
  os.makedirs(path, exist_ok=True)
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  workers, overrides = _checked_flags()
  shapes = _SHAPES.value
  output_dir = _output_dir(_OUTPUT_DIR.value)
  cache_dir = os.path.abspath(
      _CACHE_DIR.value or os.path.join(output_dir, "jax_cache")
  )
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  try:
    data_dir = os.path.join(output_dir, "data")
    meta = _prepare(data_dir)
    rows = []
    for name in shapes:
      got, line = measure_shape(
          name,
          data_dir,
          meta["vocab_size"],
          workers,
          overrides.get(name),
          train=name in _TRAIN_SHAPES.value,
          runs_dir=os.path.join(output_dir, "runs"),
          cache_dir=cache_dir,
          batches=_BATCHES.value,
          warmup_batches=_WARMUP_BATCHES.value,
          steps=_STEPS.value,
          warmup_steps=_WARMUP_STEPS.value,
          device_kind=_DEVICE_KIND.value,
          mfu=_MFU.value,
          num_devices=_NUM_DEVICES.value,
          dataset_type=_DATASET_TYPE.value,
      )
      print(line, flush=True)
      rows.extend(got)
  finally:
    if not _OUTPUT_DIR.value:
      shutil.rmtree(output_dir, ignore_errors=True)
  for line in format_table(rows):
    print(line)
  print(verdict(rows, _GOAL_SHARE.value))


def _checked_flags():
  """The flags checked, every shape's config and demand included, before
  any data is prepared.

  Returns:
    (the worker counts to measure, --set's overrides by shape).

  Raises:
    app.UsageError: naming the bad flag or shape.
  """
  if _BATCHES.value < 1 or _STEPS.value < 1:
    raise app.UsageError("need --batches >= 1 and --steps >= 1")
  if _WARMUP_BATCHES.value < 0 or _WARMUP_STEPS.value < 0:
    raise app.UsageError("need --warmup_batches >= 0 and --warmup_steps >= 0")
  try:
    workers = [int(w) for w in _WORKERS.value]
  except ValueError:
    raise app.UsageError(f"--workers={_WORKERS.value}: want ints") from None
  if not workers or min(workers) < 0:
    raise app.UsageError(f"--workers={_WORKERS.value}: want ints >= 0")
  if _DATASET_TYPE.value == "megatron":
    workers = [0]  # Read in the trainer's thread: no worker processes.
  try:
    overrides = _parse_overrides(_SET.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  shapes = _SHAPES.value
  unknown = set(overrides) - set(shapes)
  if unknown:
    raise app.UsageError(f"--set names shapes not in --shapes: {unknown}")
  # Every shape's config and demand, checked before any data is prepared.
  try:
    for name in shapes:
      config = shape_config(name, "", _VOCAB.value, 0, overrides.get(name))
      shape_workers(workers, overrides.get(name))
      flops_step_time(
          config, _DEVICE_KIND.value, _MFU.value, _NUM_DEVICES.value
      )
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from None
  return workers, overrides


def _prepare(data_dir: str) -> dict:
  """Prepares the corpus in `data_dir` (and its Megatron copy for
  --dataset_type=megatron); prints the header line.

  Returns:
    The prepared data's metadata.
  """
  meta = prepare_corpus(data_dir, _CORPUS_FILES.value, _VOCAB.value)
  if _DATASET_TYPE.value == "megatron":
    write_megatron(data_dir)
    layout = "int32 Megatron indexed datasets, one sequence per document"
  else:
    layout = f"{meta['token_dtype']}, {meta['record_tokens']} tokens per record"
  devices = jax.devices()
  print(
      f"data_bench: {_DATASET_TYPE.value} over {meta['input']['files']} "
      f"stdlib files ({meta['splits']['train']['tokens']:,} train tokens, "
      f"vocab {meta['vocab_size']}, {layout}); host {os.cpu_count()} "
      f"CPUs, training on {len(devices)} x {devices[0].device_kind} "
      f"({jax.default_backend()}); goal wait_share <= "
      f"{_GOAL_SHARE.value:.2%}",
      flush=True,
  )
  return meta


if __name__ == "__main__":
  app.run(main)
