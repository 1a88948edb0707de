r"""Benchmark: the training loop's step time against a bare jitted loop.

Runbook:

  tools/bazel run //tools/benchmarks:engine_bench -- [--rounds=9] [--steps=40]
      [--pairing=step|block]
  # Another model or config: any --config.x override of configs/default.py.

Two ways train the same model (the `--config`, by default configs/default.py)
on the same data in one process:

  trainer  `maxtext.run.trainer.run`, everything on: engine, metrics recorder,
           console/JSONL/TensorBoard writers, MLPerf log, eval every
           `eval_interval` steps, checkpoints every `checkpoint_period`
           steps. Step times come from the step records a run listener
           sees; the trainer leaves eval time out of them, and this
           benchmark leaves out each
           run's first `--warmup_steps` (compilation) and every step that
           follows an eval or a checkpoint save.
  bare     K jitted micro-steps (forward, backward, gradient accumulation),
           one jitted optimizer update and one fetch of the step's mean loss:
           the least any loop must do per step. Same params, optimizer,
           batches and shardings as the trainer.

How they interleave (`--pairing`):

  step     (default) Blocks of one step. Each round is one trainer run of
           `--steps` steps; as every trainer step after the first starts, a
           run listener waits for the trainer's device work (every live
           array ready), then runs and times one bare step, up to the end of
           its optimizer update. That trainer step's time, which includes
           the listener's, is counted without the bare step. So each step,
           trainer or bare, runs from an idle device to an idle device and
           pays for its own update; neighbouring steps see the same machine,
           so the slow drifts of a shared machine (several percent over
           seconds) cancel in the pairs. The round's ratio is the median
           over its pairs of trainer time / bare time. Neither side overlaps
           its update with the next step's host work, which both do in
           production: little noise, and the trainer's remaining host work
           is fully exposed.
  block    Each round runs one trainer run of `--steps` steps and
           one bare block of as many steps, in alternating order; the round's
           ratio is the trainer's median step time over the bare block's. The
           trainer runs as in production (its device queue never drained by
           the benchmark), but drifts between blocks add noise.

The table shows every round, the summary the median ratio over rounds with
its spread (min, max). Tokens/s, TFLOP/s per device and MFU are the
trainer's, from `maxtext.metrics.throughput` (the same figures the console,
`metrics.jsonl` and the MLPerf log report): model FLOPs per token 6 x matmul
parameters + full-sequence attention, over the devices' dense peak for the
config's compute dtype; MFU "n/a" where no peak is known, as on a CPU. The
last line is:

  engine_bench: ratio=R tokens_per_s=T
"""

import functools
import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import optax

from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.data import dataset_kinds
from maxtext.runtime import mesh as mesh_lib
from maxtext.model import transformer
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.config import optimizer as optimizer_lib
from maxtext import workloads
from maxtext.configs import default
from maxtext.listeners import interface
from maxtext.metrics import throughput

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(default.__file__),
    "Model and run config (default: configs/default.py).",
    lock_config=True,
)
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Rounds (trainer runs).")
_STEPS = flags.DEFINE_integer(
    "steps", 40, "Steps per trainer run (and bare block)."
)
_PAIRING = flags.DEFINE_enum(
    "pairing",
    "step",
    ["step", "block"],
    "Interleave single steps or whole blocks (see above).",
)
_WARMUP = flags.DEFINE_integer(
    "warmup_steps", 3, "Steps left out at the start of every block."
)


class BareLoop:
  """The least a training step does: K micro-steps, an update, a loss fetch."""

  def __init__(self, config):
    self.config = config
    self.k = config.gradient_accumulation_steps
    setup = model_setup.setup_model(
        model_config.of(config),
        mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
    )
    self.batch_sharding = setup.batch_sharding
    self.params = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    settings = optimizer_lib.OptimizerConfig.from_config(config)
    optimizer = optimizer_lib.make_optimizer(
        settings, optimizer_lib.make_schedule(settings)
    )
    self.opt_state = jax.jit(optimizer.init)(self.params)
    self.dataset = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config)
    )
    loss_fn = functools.partial(transformer.loss_fn, config=config)
    k = self.k

    def micro_step(params, grad_acc, loss_acc, batch):
      (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch
      )
      return jax.tree.map(jnp.add, grad_acc, grads), loss_acc + loss

    def update(params, opt_state, grad_acc):
      grads = jax.tree.map(lambda g: g / k, grad_acc)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return (
          optax.apply_updates(params, updates),
          opt_state,
          jax.tree.map(jnp.zeros_like, grad_acc),
      )

    self._micro_step = jax.jit(micro_step, donate_argnums=(1, 2))
    self._update = jax.jit(update, donate_argnums=(2,))
    self.grad_acc = jax.jit(lambda p: jax.tree.map(jnp.zeros_like, p))(
        self.params
    )

  def step(self, step: int) -> float:
    """Runs training step `step`; returns its mean micro-batch loss, fetched."""
    loss_acc = jnp.zeros((), jnp.float32)
    for micro in builtin_datasets.split_micro_batches(
        self.dataset.get_batch(step), self.k
    ):
      self.grad_acc, loss_acc = self._micro_step(
          self.params,
          self.grad_acc,
          loss_acc,
          mesh_lib.global_batch(micro, self.batch_sharding),
      )
    self.params, self.opt_state, self.grad_acc = self._update(
        self.params, self.opt_state, self.grad_acc
    )
    return float(loss_acc) / self.k

  def block(self, first_step: int, steps: int) -> list[float]:
    """Step times (s) of `steps` steps from `first_step`."""
    times = []
    for step in range(first_step, first_step + steps):
      start = time.perf_counter()
      self.step(step)
      times.append(time.perf_counter() - start)
    return times


def _timed_steps(config, times: dict, warmup: int) -> list[int]:
  """The completed-step numbers whose times count: after the warm-up, and not
  following an eval or a checkpoint save (their times hold that work)."""
  period = config.checkpoint_period or config.steps
  return [
      c
      for c in sorted(times)
      if c > warmup
      and (c - 1) % period != 0
      and (c - 1) % config.eval_interval != 0
  ]


class _StepTimes(interface.RunListener):
  """Each trainer step's time by its completed-step number (1-based)."""

  name = "engine_bench"

  def __init__(self):
    self.times = {}

  def on_step(self, record: interface.StepRecord) -> None:
    self.times[record.step + 1] = record.step_time


def _run_trainer(
    config, output_dir: str, name: str, listener: interface.RunListener
) -> None:
  """Trains one fresh run of `config` with `listener` watching it."""
  config = config.copy_and_resolve_references()
  config.run_name = name
  config.base_output_directory = output_dir
  result = workloads.run(
      config, config_filename="engine_bench", extra_listeners=[listener]
  )
  if result.final_step != config.steps:
    raise RuntimeError(
        f"trainer run {name} stopped at step {result.final_step} "
        f"({result.status.value}); expected {config.steps}"
    )


def trainer_block(
    config, output_dir: str, name: str, warmup: int
) -> list[float]:
  """Step times (s) of one fresh trainer run.

  Warm-up steps and the steps after an eval or a save are left out.
  """
  steps = _StepTimes()
  _run_trainer(config, output_dir, name, steps)
  return [steps.times[c] for c in _timed_steps(config, steps.times, warmup)]


def paired_round(
    config,
    bare: BareLoop,
    output_dir: str,
    name: str,
    warmup: int,
    first_bare_step: int,
) -> tuple[list[float], list[float]]:
  """One trainer run with a bare step after each of its steps.

  Returns:
    (trainer step times, bare step times) in seconds, index-aligned pairs: a
    trainer step and the bare step that ran just before it.
  """

  class Paired(_StepTimes):
    """Runs a bare step as each trainer step after the first starts."""

    def __init__(self):
      super().__init__()
      self.bare_times = {}  # By the completed-step number of its trainer step.

    def on_step_start(self, step: int) -> None:
      if step == 0:
        return
      # The previous trainer step's remaining device work (its optimizer
      # apply) is the trainer's own: wait for it here, where its time counts
      # toward this trainer step (only the bare step's is left out).
      jax.block_until_ready(jax.live_arrays())
      start = time.perf_counter()
      bare.step(first_bare_step + step)
      # The bare step's update is its own too: its time ends with the
      # device idle.
      jax.block_until_ready((bare.params, bare.opt_state))
      self.bare_times[step + 1] = time.perf_counter() - start

    def on_step(self, record: interface.StepRecord) -> None:
      completed = record.step + 1
      self.times[completed] = record.step_time - self.bare_times.get(
          completed, 0.0
      )

  paired = Paired()
  _run_trainer(config, output_dir, name, paired)
  steps = [
      c
      for c in _timed_steps(config, paired.times, warmup)
      if c in paired.bare_times
  ]
  return [paired.times[c] for c in steps], [paired.bare_times[c] for c in steps]


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:8.2f}"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  rounds, steps, warmup = _ROUNDS.value, _STEPS.value, _WARMUP.value
  if rounds < 1 or steps <= warmup + 1 or warmup < 0:
    raise app.UsageError(
        "need --rounds >= 1 and --steps > --warmup_steps + 1 >= 1"
    )
  output_dir = tempfile.mkdtemp(prefix="engine_bench_")
  config = _bench_config(steps, output_dir)
  devices = jax.devices()
  run = throughput.StepThroughput.for_run(
      throughput.ThroughputConfig.from_config(config),
      [d.device_kind for d in devices],
  )
  try:
    bare = BareLoop(config)
    bare.block(0, warmup)  # Compiles the bare loop's functions.
    rows = [
        _round(config, bare, output_dir, r, warmup, steps)
        for r in range(rounds)
    ]
  finally:
    shutil.rmtree(output_dir, ignore_errors=True)
  _report(config, devices, run, rows, steps)


def _bench_config(steps: int, output_dir: str):
  """The run config of every block: --config with `steps` steps, its full
  budget each, and a compilation cache (in `output_dir` unless set)."""
  config = _CONFIG.value.copy_and_resolve_references()
  # The config's learning-rate schedule whatever the block length, so short
  # blocks stay valid (warmup within the schedule).
  if not config.lr_schedule_steps:
    config.lr_schedule_steps = config.steps
  config.steps = steps
  config.target_eval_loss = 0.0  # Every block runs its full budget.
  if not config.jax_compilation_cache_dir:
    config.jax_compilation_cache_dir = os.path.join(output_dir, "jax_cache")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  return config


def _round(config, bare, output_dir: str, r: int, warmup: int, steps: int):
  """Round `r`: the trainer's and the bare loop's step times.

  --pairing=step interleaves them step by step; otherwise each runs a
  block, in alternating order from round to round.

  Returns:
    (r, trainer's median step, bare's median step, their ratio, the
    trainer's timed steps, the bare loop's).
  """
  got = {}
  if _PAIRING.value == "step":
    got["trainer"], got["bare"] = paired_round(
        config,
        bare,
        output_dir,
        f"round{r}",
        warmup,
        warmup + r * (steps + 1),
    )
    ratio = statistics.median(
        t / b for t, b in zip(got["trainer"], got["bare"])
    )
  else:
    order = ("trainer", "bare") if r % 2 == 0 else ("bare", "trainer")
    for way in order:
      if way == "trainer":
        got[way] = trainer_block(config, output_dir, f"round{r}", warmup)
      else:
        got[way] = bare.block(warmup + r * steps, steps)[warmup:]
    ratio = statistics.median(got["trainer"]) / statistics.median(got["bare"])
  return (
      r,
      statistics.median(got["trainer"]),
      statistics.median(got["bare"]),
      ratio,
      len(got["trainer"]),
      len(got["bare"]),
  )


def _report(config, devices, run, rows, steps: int) -> None:
  """The header, one line a round, the medians and the closing line."""
  print(
      f"engine_bench: {len(devices)} x {devices[0].device_kind} "
      f"({jax.default_backend()}), emb {config.emb_dim}, {config.num_layers} "
      f"layers, seq {config.max_sequence_length}, global batch "
      f"{config.global_batch_size} in K={config.gradient_accumulation_steps} "
      f"micro-batches, eval every {config.eval_interval}, checkpoint every "
      f"{config.checkpoint_period}, {steps} steps per run, "
      f"pairing={_PAIRING.value}"
  )
  print("round  trainer_ms   bare_ms   ratio  timed_steps(trainer/bare)")
  for r, t_med, b_med, ratio, nt, nb in rows:
    print(f"{r:5d}  {_ms(t_med)}  {_ms(b_med)}  {ratio:6.3f}  {nt}/{nb}")
  ratios = [row[3] for row in rows]
  ratio = statistics.median(ratios)
  trainer_step = statistics.median(row[1] for row in rows)
  bare_step = statistics.median(row[2] for row in rows)
  figures = run.figures(trainer_step)
  tokens_per_s = figures[throughput.TOKENS_PER_SECOND_KEY]
  mfu = (
      f"{figures[throughput.MFU_KEY]:.1%}"
      if throughput.MFU_KEY in figures
      else "n/a"
  )
  print(
      f"median ratio {ratio:.3f} (min {min(ratios):.3f}, "
      f"max {max(ratios):.3f}) over {len(rows)} rounds"
  )
  print(
      f"trainer: median step {trainer_step * 1e3:.2f} ms, {tokens_per_s:,.0f} "
      f"tokens/s, {figures[throughput.TFLOPS_PER_DEVICE_KEY]:.4g} TFLOP/s "
      f"per device, MFU {mfu}"
  )
  print(
      f"bare:    median step {bare_step * 1e3:.2f} ms, "
      f"{run.tokens_per_step / bare_step:,.0f} tokens/s"
  )
  print(f"engine_bench: ratio={ratio:.3f} tokens_per_s={tokens_per_s:.0f}")


if __name__ == "__main__":
  app.run(main)
