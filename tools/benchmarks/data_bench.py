r"""Benchmark: the Grain input pipeline's batches/s against the step's demand.

Runbook:

  tools/bazel run //tools/benchmarks:data_bench -- [--shapes=default,gpu_1b]
      [--workers=0,2] [--batches=40] [--steps=30]
      [--device_kind="NVIDIA H200"] [--mfu=0.4] [--num_devices=1]
  # A shape shrunk or changed: --set=<shape>.<field>=<JSON value>, e.g.
  #   --set=gpu_1b.global_batch_size=8

The goal: the pipeline is never the bottleneck, i.e. the training loop waits
for its next batch at most `--goal_share` (2%) of its step time.

Data: the Python standard library's sources (`maxtext/text/stdlib_corpus`),
prepared in a temp dir by `maxtext.text.prepare` (a `--vocab`-piece
sentencepiece tokenizer trained on them, the library's default records and
shards), read by `maxtext.text.grain_dataset.GrainDataset`, the reader of
dataset_type="grain", at each shape's real batch x sequence. A shape is a
config file of `maxtext/configs/` whose vocabulary is raised to the
tokenizer's where smaller (default.py's 256 ids are fewer than any trained
tokenizer's), with `--set` overrides. Each shape is measured with each
`--workers` count (`grain_worker_count`: 0 reads in the trainer's process
with Grain's threads, n > 0 in n worker processes).

Per row:

  pipeline_b/s  batches/s that `get_batch` delivers when called back to
                back, after `--warmup_batches` (the iterator's start, worker
                processes' start-up); Grain's read-ahead buffer of a few
                batches counts into the first timed ones.
  demand_b/s    steps/s the training step runs at when data costs nothing:
                  cpu        (shapes in `--train_shapes`) measured here: the
                             engine's real steps on batches read beforehand;
                  <device>   (the others) from the model's FLOPs per step
                             (`maxtext.metrics.throughput`, the FLOPs the
                             trainer's MFU counts) over `--num_devices`
                             devices of `--device_kind` at `--mfu` of their
                             dense peak for the config's compute dtype.
  ratio         pipeline_b/s / demand_b/s (>= 1: the pipeline keeps up).
  step_ms, wait_ms, wait_share
                a training loop fed by the pipeline: per step the mean step
                time, the mean time spent in `get_batch` (the data wait) and
                their ratio, sum(waits) / sum(step times), over `--steps`
                steps after `--warmup_steps`. The loop does what the
                trainer's loop (`maxtext.trainer._train_loop`) does, in its
                order: dispatch the step's K micro-batches, read the next
                step's batch (timed: the wait) and put its micro-batches on
                the devices, then `update()`; a step's time runs from one
                `update()`'s return to the next's, as the trainer's does.
                For a `cpu` shape the step is the engine's real step on
                this machine (the pipeline's threads and the step share its
                cores, as they do in a CPU run). For the others the
                device's step is emulated: the host reads the batch, then
                sleeps until the demanded step time has passed since the
                step started (on an accelerator the host idles in
                `update()` while the device computes).

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
import jax

from maxtext import checks
from maxtext import config_lib
from maxtext import data
from maxtext import mesh as mesh_lib
from maxtext import model_setup
from maxtext.metrics import throughput
from maxtext.text import grain_dataset
from maxtext.text import prepare
from maxtext.text import stdlib_corpus

_SHAPES = flags.DEFINE_list(
    "shapes", ["default", "gpu_1b"], "Config files of maxtext/configs/."
)
_TRAIN_SHAPES = flags.DEFINE_list(
    "train_shapes",
    ["default"],
    "Shapes whose demand is measured by training here (the others' comes "
    "from their FLOPs at --device_kind and --mfu).",
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
    "warmup_steps", 3, "Training steps run before timing (compilation)."
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
_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir",
    "",
    "JAX's persistent compilation cache; empty = a temp dir of this run.",
)
_GOAL_SHARE = flags.DEFINE_float(
    "goal_share", 0.02, "Largest data wait share of the step time."
)

CPU_DEMAND = "cpu"


@dataclasses.dataclass(frozen=True)
class Row:
  """One (shape, worker count) measurement.

  Attributes:
    shape: the config file's name.
    workers: grain_worker_count.
    pipeline_rate: batches/s of the pipeline read alone.
    demand_rate: steps/s the training step needs.
    demand_from: "cpu" (measured here) or the device the FLOPs assume.
    step_s: mean step time of the loop fed by the pipeline (s).
    wait_s: mean time per step in `get_batch` in that loop (s).
    wait_share: sum of waits over sum of step times in that loop.
  """

  shape: str
  workers: int
  pipeline_rate: float
  demand_rate: float
  demand_from: str
  step_s: float
  wait_s: float
  wait_share: float

  @property
  def ratio(self) -> float:
    return self.pipeline_rate / self.demand_rate


def prepare_corpus(output_dir: str, files: int, vocab: int) -> dict:
  """Prepares `files` stdlib sources into `output_dir`; returns metadata."""
  return prepare.prepare(
      stdlib_corpus.files(files),
      output_dir,
      train_vocab_size=vocab,
      report=lambda line: None,
  )


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
):
  """`maxtext/configs/<name>.py` reading `data_dir` through Grain.

  Args:
    name: the config file's module name ("default", "gpu_1b", ...).
    data_dir: a prepared data directory.
    vocab: the prepared data's vocabulary; the config's is raised to it.
    workers: grain_worker_count.
    overrides: further fields to set, applied last.

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
  config.dataset_type = "grain"
  config.train_data_path = data_dir
  config.eval_data_path = ""
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
  # The model, batch and step fields; GrainDataset checks the data's own
  # (the data may not be prepared yet).
  check = config.copy_and_resolve_references()
  check.dataset_type = "synthetic"
  check.enable_mllog = False  # No MLPerf log: its rules do not apply.
  config_lib.validate(check)
  return config


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
  run = throughput.StepThroughput.for_run(config, [device_kind] * num_devices)
  if run.peak_flops_per_device is None:
    raise ValueError(
        f"device_kind={device_kind!r}: no {config.compute_dtype} peak in "
        f"maxtext/metrics/throughput.py (known: "
        f"{', '.join(throughput.known_device_kinds())})"
    )
  return run.flops_per_step / (num_devices * run.peak_flops_per_device * mfu)


def pipeline_rate(dataset, batches: int, warmup: int) -> float:
  """Batches/s of `dataset.get_batch` called back to back.

  Reads steps 0 .. warmup + batches - 1 and times the last `batches`.
  """
  for step in range(warmup):
    dataset.get_batch(step)
  start = time.perf_counter()
  for step in range(warmup, warmup + batches):
    dataset.get_batch(step)
  return batches / (time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class LoopTimes:
  """Per-step times of a training loop (s), index-aligned."""

  step: list[float]
  wait: list[float]

  @property
  def wait_share(self) -> float:
    return math.fsum(self.wait) / math.fsum(self.step)


class HostTraining:
  """The trainer's step on this host: its engine, its loop's order."""

  def __init__(self, config):
    self.config = config
    self.k = config.gradient_accumulation_steps
    self.engine, self.setup = model_setup.build_engine(config)

  def _micro_batches(self, batch) -> list:
    return [
        mesh_lib.global_batch(micro, self.setup.batch_sharding)
        for micro in data.split_micro_batches(batch, self.k)
    ]

  def loop(
      self, get_batch: Callable[[int], dict], steps: int, warmup: int
  ) -> LoopTimes:
    """Trains `warmup + steps` steps reading batches from `get_batch`.

    The order is the trainer's: the step's micro-batches are dispatched,
    then the next step's batch is read (timed: the data wait) and put on
    the devices, then `update()` waits for the step. Returns the last
    `steps` steps' times.
    """
    times, waits = [], []
    batches = self._micro_batches(get_batch(0))
    step_start = time.monotonic()
    for step in range(warmup + steps):
      for micro in batches:
        self.engine.fwd_bwd(micro)
      wait_start = time.monotonic()
      batch = get_batch(step + 1)
      waits.append(time.monotonic() - wait_start)
      batches = self._micro_batches(batch)
      self.engine.update(release=True)
      now = time.monotonic()
      times.append(now - step_start)
      step_start = now
    return LoopTimes(times[warmup:], waits[warmup:])

  def close(self) -> None:
    self.engine.close()


def paced_loop(
    get_batch: Callable[[int], dict], step_s: float, steps: int, warmup: int
) -> LoopTimes:
  """The trainer's loop with the device's step emulated by a wait.

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


def _preread(dataset, count: int) -> Callable[[int], dict]:
  """`get_batch` over `count` batches read beforehand, cycled: free data."""
  cached = [dataset.get_batch(step) for step in range(count)]
  return lambda step: cached[step % count]


def measure_shape(
    name: str,
    data_dir: str,
    vocab: int,
    workers: Sequence[int],
    overrides: Optional[dict],
    *,
    train: bool,
    batches: int,
    warmup_batches: int,
    steps: int,
    warmup_steps: int,
    device_kind: str,
    mfu: float,
    num_devices: int,
) -> tuple[list[Row], str]:
  """Rows of one shape, one per worker count, and its description line."""
  base = shape_config(name, data_dir, vocab, 0, overrides)
  flop_step = flops_step_time(base, device_kind, mfu, num_devices)
  flops = throughput.StepThroughput.for_run(base, ["cpu"]).flops_per_step
  tokens = base.global_batch_size * base.max_sequence_length
  line = (
      f"{name}: global batch {base.global_batch_size} x seq "
      f"{base.max_sequence_length} ({tokens:,} tokens) in "
      f"K={base.gradient_accumulation_steps}, vocab {base.vocab_size}, "
      f"{flops / 1e9:,.3g} GFLOP/step; {num_devices} x {device_kind} at "
      f"{mfu:.0%} MFU ({base.compute_dtype}): {flop_step * 1e3:,.4g} ms/step"
  )
  rows = []
  host = HostTraining(base) if train else None
  try:
    if host is not None:
      dataset = grain_dataset.GrainDataset(base)
      try:
        free = _preread(dataset, 4)
      finally:
        dataset.close()
      bare = host.loop(free, steps, warmup_steps)
      demand_step = math.fsum(bare.step) / len(bare.step)
      line += f"; this CPU: {demand_step * 1e3:,.4g} ms/step measured"
      demand_from = CPU_DEMAND
    else:
      demand_step = flop_step
      demand_from = device_kind.replace(" ", "_") + f"@{mfu:.0%}MFU"
    for count in workers:
      config = shape_config(name, data_dir, vocab, count, overrides)
      dataset = grain_dataset.GrainDataset(config)
      try:
        rate = pipeline_rate(dataset, batches, warmup_batches)
      finally:
        dataset.close()
      # A fresh pipeline for the loop, read from step 0 (steps in order).
      dataset = grain_dataset.GrainDataset(config)
      try:
        if host is not None:
          fed = host.loop(dataset.get_batch, steps, warmup_steps)
        else:
          fed = paced_loop(dataset.get_batch, flop_step, steps, warmup_steps)
      finally:
        dataset.close()
      rows.append(
          Row(
              shape=name,
              workers=count,
              pipeline_rate=rate,
              demand_rate=1.0 / demand_step,
              demand_from=demand_from,
              step_s=math.fsum(fed.step) / len(fed.step),
              wait_s=math.fsum(fed.wait) / len(fed.wait),
              wait_share=fed.wait_share,
          )
      )
  finally:
    if host is not None:
      host.close()
  return rows, line


def format_table(rows: Sequence[Row]) -> list[str]:
  """The table's lines: a header, then one line per row."""
  lines = [
      f"{'shape':<10} {'workers':>7} {'pipeline_b/s':>12} {'demand_b/s':>11} "
      f"{'ratio':>9} {'step_ms':>9} {'wait_ms':>8} {'wait_share':>10}  "
      "demand_from"
  ]
  for r in rows:
    lines.append(
        f"{r.shape:<10} {r.workers:>7d} {r.pipeline_rate:>12.2f} "
        f"{r.demand_rate:>11.3f} {r.ratio:>9.2f} {r.step_s * 1e3:>9.2f} "
        f"{r.wait_s * 1e3:>8.3f} {r.wait_share:>9.2%}  {r.demand_from}"
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
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
      flops_step_time(
          config, _DEVICE_KIND.value, _MFU.value, _NUM_DEVICES.value
      )
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from None
  output_dir = tempfile.mkdtemp(prefix="data_bench_")
  jax.config.update(
      "jax_compilation_cache_dir",
      _CACHE_DIR.value or os.path.join(output_dir, "jax_cache"),
  )
  try:
    data_dir = os.path.join(output_dir, "data")
    meta = prepare_corpus(data_dir, _CORPUS_FILES.value, _VOCAB.value)
    devices = jax.devices()
    print(
        f"data_bench: grain over {meta['input']['files']} stdlib files "
        f"({meta['splits']['train']['tokens']:,} train tokens, vocab "
        f"{meta['vocab_size']}, {meta['token_dtype']}, "
        f"{meta['record_tokens']} tokens per record); host {os.cpu_count()} "
        f"CPUs, training on {len(devices)} x {devices[0].device_kind} "
        f"({jax.default_backend()}); goal wait_share <= "
        f"{_GOAL_SHARE.value:.2%}",
        flush=True,
    )
    rows = []
    for name in shapes:
      got, line = measure_shape(
          name,
          data_dir,
          meta["vocab_size"],
          workers,
          overrides.get(name),
          train=name in _TRAIN_SHAPES.value,
          batches=_BATCHES.value,
          warmup_batches=_WARMUP_BATCHES.value,
          steps=_STEPS.value,
          warmup_steps=_WARMUP_STEPS.value,
          device_kind=_DEVICE_KIND.value,
          mfu=_MFU.value,
          num_devices=_NUM_DEVICES.value,
      )
      print(line, flush=True)
      rows.extend(got)
  finally:
    shutil.rmtree(output_dir, ignore_errors=True)
  for line in format_table(rows):
    print(line)
  print(verdict(rows, _GOAL_SHARE.value))


if __name__ == "__main__":
  app.run(main)
