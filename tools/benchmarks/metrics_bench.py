r"""Benchmark: the cost of recording M metrics over K micro-batches per step.

Runbook:

  bazel run //tools/benchmarks:metrics_bench -- [--rounds=9] [--block=3]

Every way (`metric_ways`: baseline, dict_step, a/append, b/stack, c/engine,
d/per_name) runs the same training step, K jitted micro-steps of a small
MLP's forward/backward with gradient accumulation, then one jitted optimizer
apply, and ends the step with all metric values on the host.

With `--model_config=FILE` the micro-step is that config's model instead
(its parameters, a synthetic batch of its shape and
`maxtext.model.transformer.loss_fn`, whose metrics a mixture-of-experts config
extends with the MoE statistics), and M is the number of metrics it reports:

  bazel run //tools/benchmarks:metrics_bench -- \
      --model_config=maxtext/configs/moe_tiny.py

With `--grpo` the micro-step is that config's GRPO loss on a synthetic
rollout micro-batch, and M is a GRPO step's device metric set (the loss's
metrics; the rollout's statistics are host values, added to the record on
the host):

  bazel run //tools/benchmarks:metrics_bench -- --grpo \
      --model_config=maxtext/configs/grpo_tiny.py

The ways run interleaved in blocks (a shuffled order each round) so machine
noise hits them alike. The overhead of a way is its block's mean step time
minus the baseline block's of the same round; the table shows the median over
rounds and the interquartile range. Device dispatches per step are counted by
wrapping the executable launch with JAX's C++ dispatch fast path off (a
separate, untimed run). The last line holds the ratios of median overheads at
M=100, K=16:

  metrics_bench: engine/stack=R1 engine/append=R2 per_name/append=R3
"""

import time

from absl import app
from absl import flags
import jax
import numpy as np

from maxtext.config import config_lib
from tools import command_line
from tools.benchmarks import metric_ways

_NUM_METRICS = flags.DEFINE_integer(
    "num_metrics", 100, "M, metrics per micro-batch (loss included)."
)
_KS = flags.DEFINE_list("ks", ["4", "16", "64"], "Micro-batches per step.")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Interleaved rounds per K.")
_BLOCK = flags.DEFINE_integer("block", 2, "Steps per way per round.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the block order.")
_MODEL_CONFIG = flags.DEFINE_string(
    "model_config",
    "",
    "A config file: the micro-step is its model's loss on a synthetic batch "
    "of its shape (M = the metrics it reports; --num_metrics is unused). "
    "'' = the small MLP with --num_metrics metrics.",
)

_GRPO = flags.DEFINE_bool(
    "grpo",
    False,
    "With --model_config: the micro-step is the GRPO loss "
    "(maxtext/grpo/loss/train_loss.py) of that model on a synthetic rollout "
    "micro-batch of the config's grpo_* shape; M = a GRPO step's device "
    "metric set.",
)


def _measure(
    problem: metric_ways.Problem, k: int, rounds: int, block: int, rng
):
  """Returns (overheads: way -> list of seconds, base times, dispatches)."""
  ways = metric_ways.make_ways(problem, k)
  batch = problem.batch
  for _ in range(2):  # Compile every length and path.
    metric_ways.check_values(ways, problem, k)
  times = {w: [] for w in metric_ways.WAYS}
  for _ in range(rounds):
    for w in rng.permutation(len(metric_ways.WAYS)):
      name = metric_ways.WAYS[w]
      start = time.perf_counter()
      for _ in range(block):
        ways[name].step(batch)
      times[name].append((time.perf_counter() - start) / block)
  base = np.array(times["baseline"])
  overheads = {
      w: np.array(times[w]) - base for w in metric_ways.WAYS if w != "baseline"
  }
  return overheads, base, metric_ways.dispatches_per_step(ways, batch)


def _fmt_ms(x: float) -> str:
  return f"{x * 1e3:9.3f}"


def main(argv):
  command_line.check(argv)
  if _GRPO.value and not _MODEL_CONFIG.value:
    raise app.UsageError("--grpo needs --model_config (a GRPO config file)")
  if _GRPO.value:
    config = config_lib.load_config_file(_MODEL_CONFIG.value)
    config_lib.validate(config)
    config_lib.validate_grpo(config)
    problem = metric_ways.grpo_problem(config)
    what = f"{_MODEL_CONFIG.value}'s GRPO step"
  elif _MODEL_CONFIG.value:
    problem = metric_ways.model_problem(_MODEL_CONFIG.value)
    what = f"{_MODEL_CONFIG.value}'s model"
  else:
    problem = metric_ways.mlp_problem(_NUM_METRICS.value)
    what = "a small MLP"
  m = len(problem.names)
  ks = [int(k) for k in _KS.value]
  rng = np.random.default_rng(_SEED.value)
  print(
      f"metrics_bench: {what}, M={m}, K in {ks}, {_ROUNDS.value} "
      f"interleaved rounds x {_BLOCK.value} steps per way; "
      f"jax {jax.__version__} on {jax.devices()[0].platform}"
  )
  print(
      "overhead = way step time - baseline step time (same round); "
      "median [p25, p75] in ms; dispatches per step."
  )
  header = (
      f"{'K':>3} {'way':<11} {'overhead_ms':>11} {'p25':>9} "
      f"{'p75':>9} {'step_ms':>9} {'dispatches':>10}"
  )
  medians = {}
  for k in ks:
    overheads, base, dispatches = _measure(
        problem, k, _ROUNDS.value, _BLOCK.value, rng
    )
    print(header)
    print(
        f"{k:>3} {'baseline':<11} {_fmt_ms(0.0):>11} {'':>9} {'':>9} "
        f"{_fmt_ms(np.median(base))} {dispatches['baseline']:>10}"
    )
    for w in metric_ways.WAYS[1:]:
      o = overheads[w]
      medians[(k, w)] = float(np.median(o))
      print(
          f"{k:>3} {w:<11} {_fmt_ms(np.median(o)):>11} "
          f"{_fmt_ms(np.percentile(o, 25))} {_fmt_ms(np.percentile(o, 75))} "
          f"{_fmt_ms(np.median(base + o))} {dispatches[w]:>10}"
      )
  k_ref = 16 if 16 in ks else ks[0]

  def ratio(a, b):
    return medians[(k_ref, a)] / medians[(k_ref, b)]

  print(
      f"metrics_bench: engine/stack={ratio('c/engine', 'b/stack'):.4f} "
      f"engine/append={ratio('c/engine', 'a/append'):.4f} "
      f"per_name/append={ratio('d/per_name', 'a/append'):.4f}"
  )


if __name__ == "__main__":
  app.run(main)
