"""Runs the metrics_bench binary small: its dispatch counts and closing line.

Times are not checked. The dispatch counts are exact and machine-independent,
so they are: per step, K micro-steps and one optimizer apply for every way,
plus what each way adds to bring the metrics home (the engine: its gradient
measure and one concatenation); for the small MLP and for a small
mixture-of-experts model, whose MoE statistics add metrics.
"""

import re

from absl.testing import absltest

from testing import runfiles

_M = 5
_KS = (2, 8)


# The MoE model of moe_tiny.py made small enough for a quick step: a test of
# the counts, not of the model.
_SMALL_MOE_CONFIG = """
from maxtext.configs import moe_tiny


def get_config():
  config = moe_tiny.get_config()
  config.update(
      vocab_size=16, max_sequence_length=8, emb_dim=16, num_heads=2,
      num_kv_heads=2, head_dim=8, mlp_dim=32, moe_mlp_dim=8,
      global_batch_size=4, gradient_accumulation_steps=1,
  )
  return config
"""
# grpo_tiny.py's GRPO step on a small model: 2 prompts x 4 completions.
_SMALL_GRPO_CONFIG = """
from maxtext.configs import grpo_tiny


def get_config():
  config = grpo_tiny.get_config()
  config.update(
      vocab_size=32, max_sequence_length=16, emb_dim=16, num_heads=2,
      num_kv_heads=2, head_dim=8, mlp_dim=32, global_batch_size=8,
      gradient_accumulation_steps=1, grpo_num_generations=4,
      grpo_prompt_length=3, grpo_max_completion_length=4,
  )
  return config
"""
# Metrics of a dense model's loss: loss, loss_sum, num_tokens, num_correct,
# accuracy.
_DENSE_MODEL_METRICS = 5


def _expected_dispatches(k: int, m: int) -> dict[str, int]:
  """Dispatches per step of each way, at K=k micro-batches of m metrics."""
  plain = k + 1  # K micro-steps and the optimizer apply.
  return {
      "baseline": plain,
      "dict_step": plain,
      "a/append": plain + m * k,  # One append per metric and micro-batch.
      "b/stack": plain + m,  # One stack per metric.
      # One concatenation of the packed arrays in place of the baseline's
      # apply: the update rides the last micro-step with K > 1; with K = 1
      # it is a program of its own.
      "c/engine": plain if k > 1 else plain + 1,
      "d/per_name": plain + 1,  # M*K <= 256 values: one launch.
  }


# The ways the binary reports.
_WAYS = tuple(_expected_dispatches(1, 1))


class MetricsBenchTest(absltest.TestCase):

  def run_bench(self, *flags, ks=_KS, rounds=2):
    """Runs the binary; returns (M it reports, dispatches by (K, way))."""
    proc = runfiles.run_binary(
        "tools/benchmarks/metrics_bench",
        [
            *flags,
            f"--ks={','.join(map(str, ks))}",
            f"--rounds={rounds}",
            "--block=1",
        ],
        timeout_s=600,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    m = int(re.search(r" M=(\d+),", proc.stdout).group(1))
    dispatches = {}
    for line in proc.stdout.splitlines():
      fields = line.split()
      if len(fields) >= 4 and fields[0].isdigit() and fields[1] in _WAYS:
        dispatches[(int(fields[0]), fields[1])] = int(fields[-1])
    self.assertRegex(
        proc.stdout.strip().splitlines()[-1],
        r"^metrics_bench: engine/stack=-?\d+\.\d{4} "
        r"engine/append=-?\d+\.\d{4} per_name/append=-?\d+\.\d{4}$",
    )
    return m, dispatches

  def assert_dispatches(self, dispatches, m, ks=_KS):
    for k in ks:
      self.assertEqual(
          {w: dispatches[(k, w)] for w in _WAYS},
          _expected_dispatches(k, m),
          f"K={k}",
      )

  def test_dispatch_counts_and_closing_line(self):
    m, dispatches = self.run_bench(f"--num_metrics={_M}")
    self.assertEqual(m, _M)
    self.assert_dispatches(dispatches, _M)

  def test_an_moe_model_adds_its_metrics_and_no_flush_dispatch(self):
    path = self.create_tempfile("small_moe.py", _SMALL_MOE_CONFIG).full_path
    # One K and one round: every way compiles its own programs of the
    # model, which is most of this test's time.
    m, dispatches = self.run_bench(
        f"--model_config={path}", ks=_KS[-1:], rounds=1
    )
    # The MoE statistics come on top of the dense loss's metrics, and the
    # engine still brings them home in one dispatch per step.
    self.assertGreater(m, _DENSE_MODEL_METRICS)
    self.assert_dispatches(dispatches, m, ks=_KS[-1:])

  def test_the_grpo_metric_set(self):
    path = self.create_tempfile("small_grpo.py", _SMALL_GRPO_CONFIG).full_path
    # K=2: M*K stays within the one launch per_name's flush makes up to
    # 256 values, as _expected_dispatches assumes.
    m, dispatches = self.run_bench(
        "--grpo", f"--model_config={path}", ks=_KS[:1], rounds=1
    )
    # A GRPO step's device metrics come home in one engine dispatch per
    # step too: loss, 26 of the policy loss (pg_loss, kl, kl_loss, 3 clip
    # fractions, ppo_kl, entropy, 3 ratio and 5 advantage statistics, and
    # the reference loss's 10) and completion tokens. The rollout's
    # statistics are host values that never reach the devices
    # (maxtext/grpo/rollout/rollout_batches.py).
    self.assertEqual(m, 1 + 26 + 1)
    self.assert_dispatches(dispatches, m, ks=_KS[:1])


if __name__ == "__main__":
  absltest.main()
