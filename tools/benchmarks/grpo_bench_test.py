"""Runs the grpo_bench binary small: its phase table and closing line.

Times are not checked. What is: the table has every phase, old log-probs
take no phase of their own (generation computes them), the closing line's
metric count is a real step's record, and the dispatch counts are exact and
machine-independent: a reward function adds a host value to the record and
no device work (neither the recorder's dispatches nor per-metric appends
grow).
"""

import re

from absl.testing import absltest

from testing import runfiles

_LAST_LINE = re.compile(
    r"^grpo_bench: rollout_share=(\d+\.\d{4}) metrics=(\d+) "
    r"recorder_dispatches=(\d+) append_dispatches=(\d+)$"
)
_K = 2
# grpo_tiny.py on a smaller model: 2 prompts x 4 completions, K = 2.
_SMALL = (
    "--config.vocab_size=32",
    "--config.max_sequence_length=16",
    "--config.emb_dim=16",
    "--config.num_heads=2",
    "--config.num_kv_heads=2",
    "--config.head_dim=8",
    "--config.mlp_dim=32",
    "--config.num_layers=1",
    "--config.global_batch_size=8",
    f"--config.gradient_accumulation_steps={_K}",
    "--config.grpo_num_generations=4",
    "--config.grpo_prompt_length=3",
    "--config.grpo_max_completion_length=4",
    "--config.grpo_eval_prompts=8",
    "--steps=2",
)
_TASK = "maxtext.grpo.progression_task"
# Metrics of a step's record besides one per reward function: on the
# devices, the loss, the policy loss's 26 (pg_loss, kl, kl_loss, 3 clip
# fractions, ppo_kl, entropy, 3 ratio and 5 advantage statistics, and the
# reference loss's 10: sampling_is_ratio x 3, tis_geo_mean x 2,
# logprob_error x 2, masked x 2, trained_token_frac) and completion_tokens,
# and the engine's 3 (grad_norm, learning_rate, step_skipped); on the host,
# the rollout's 11 statistics (5 reward statistics, frac_reward_zero_std, 4
# completion lengths, masked/overlong_frac) and the 7 timings.
_MICRO_BATCH_METRICS = 1 + 26 + 1
_STEP_METRICS = 3
_HOST_METRICS = 11 + 7


def _run(*args):
  return runfiles.run_binary(
      "tools/benchmarks/grpo_bench", list(_SMALL + args), timeout_s=900
  )


class GrpoBenchTest(absltest.TestCase):

  def check_run(self, functions: int, *args):
    """Runs the bench; returns (metrics, recorder and append dispatches)."""
    proc = _run(*args)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    phases = {}
    for line in lines:
      fields = line.split()
      if len(fields) == 3 and fields[2].endswith("%"):
        phases[fields[0]] = float(fields[1])
    self.assertEqual(
        set(phases),
        {"rollout", "generate", "reward", "reference", "old_logprobs",
         "update", "step"},
    )  # fmt: skip
    self.assertEqual(phases["old_logprobs"], 0.0)
    self.assertEqual(phases["reference"], 0.0)  # grpo_tiny: beta = 0.
    self.assertGreater(phases["update"], 0.0)
    self.assertRegex(proc.stdout, r"generated tokens/s \d+\.\d")
    self.assertRegex(proc.stdout, r"trained tokens/s \d+\.\d")
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    share = float(match.group(1))
    self.assertGreater(share, 0.0)
    self.assertLessEqual(share, 1.0)
    metrics, recorder, appends = map(int, match.group(2, 3, 4))
    m = _MICRO_BATCH_METRICS
    self.assertEqual(metrics, m + _STEP_METRICS + _HOST_METRICS + functions)
    # One append per micro-batch metric and micro-batch.
    self.assertEqual(appends, m * _K)
    self.assertIn(f"m={m} micro-batch metrics", proc.stdout)
    return metrics, recorder, appends

  def test_one_reward_function_more_adds_a_host_value_not_dispatches(self):
    two = self.check_run(2)
    one = self.check_run(
        1, f"--config.grpo_reward_functions={_TASK}:exact_match"
    )
    self.assertEqual(two[0], one[0] + 1)
    # None over the bare loop, whatever M is: the update rides the last
    # micro-step, and the flush's one concatenation takes the place of the
    # bare loop's optimizer apply.
    self.assertEqual(two[1], 0)
    self.assertEqual(one[1], two[1])
    # A reward function's mean is a host value: it never reaches the
    # devices, so even one append per metric would not grow.
    self.assertEqual(two[2], one[2])

  def test_bad_steps_is_one_line(self):
    proc = _run("--steps=0")
    self.assertEqual(proc.returncode, 2)
    self.assertEqual(
        proc.stderr.strip().splitlines()[-1],
        "grpo_bench: error: --steps=0: must be >= 1",
    )


if __name__ == "__main__":
  absltest.main()
