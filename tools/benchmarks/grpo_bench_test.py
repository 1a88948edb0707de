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
_TASK = "maxtext.grpo.tasks.progression_task"
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
# With packing, the step's two padding fractions (packed and padded).
_PACKING_METRICS = 2
_PADDING = re.compile(
    r"^padding fraction: padded (\d\.\d{4}) packed (\d\.\d{4}) "
    r"\(packing=(True|False)\)$",
    re.MULTILINE,
)


_AHEAD = re.compile(
    r"^step by grpo_max_age: 0 (\d+\.\d{4}) s, 1 (\d+\.\d{4}) s, "
    r"speedup (\d+\.\d{3}) \(age_max (\d+)\)$",
    re.MULTILINE,
)


# _SMALL's parameters a decode step reads, float32 (its compute dtype): one
# layer of two norm scales (16 each), wq, wk, wv and wo 16 x 16, the MLP's
# three 16 x 32; the final norm and the 16 x 32 output projection (the
# input embedding is read one row per row).
_WEIGHT_BYTES = (2 * 16 + 4 * 16 * 16 + 3 * 16 * 32 + 16 + 16 * 32) * 4
# One layer's keys and values of 2 heads of 8, float32.
_BYTES_PER_TOKEN = 2 * 2 * 8 * 4
_STEP_BYTES = re.compile(
    r"^decode step reads: (\d+) weight bytes \+ (\d+) cache bytes \+ "
    r"(\d+) state bytes = (\d+) bytes \(mean of (\d+) steps\)$",
    re.MULTILINE,
)
_NO_LIMIT = re.compile(
    r"^bandwidth limit: unknown for 'cpu'; measured (\d+\.\d{3}) ms a step$",
    re.MULTILINE,
)


def _run(*args):
  return runfiles.run_binary(
      "tools/benchmarks/grpo_bench", list(_SMALL + args), timeout_s=900
  )


class GrpoBenchTest(absltest.TestCase):

  def check_decode_step(self, stdout: str, generate_s: float):
    """The rollouts' decode step: its weights, a cache of 3-id prompts and
    1 to 4 ids, no known limit on the CPU, the measured step."""
    step = _STEP_BYTES.search(stdout)
    self.assertIsNotNone(step, stdout)
    weights, cache, states, total, steps = map(int, step.groups())
    self.assertEqual(weights, _WEIGHT_BYTES)
    self.assertEqual(states, 0)
    self.assertAlmostEqual(total, weights + cache, delta=1)
    # A slot per completion: 1 to 4 steps a rollout, 2 rollouts.
    self.assertBetween(steps, 2, 8)
    # A step runs 1 to 8 rows, each attending over 4 to 7 positions.
    self.assertBetween(cache, _BYTES_PER_TOKEN * 4, _BYTES_PER_TOKEN * 7 * 8)
    limit = _NO_LIMIT.search(stdout)
    self.assertIsNotNone(limit, stdout)
    # The measured step: the steps' generation seconds (the table's mean,
    # to 0.1 ms, times 2 steps) over the decode steps.
    self.assertAlmostEqual(
        float(limit.group(1)),
        1e3 * 2 * generate_s / steps,
        delta=1e3 * 2 * 0.00005 / steps + 0.0006,
    )

  def check_run(self, functions: int, *args, packing: bool = False):
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
        {"rollout", "generate", "tools", "reward", "reference",
         "old_logprobs", "update", "step"},
    )  # fmt: skip
    # The progression task has no environment: no tool time.
    self.assertEqual(phases["tools"], 0.0)
    self.assertEqual(phases["old_logprobs"], 0.0)
    self.assertEqual(phases["reference"], 0.0)  # grpo_tiny: beta = 0.
    self.assertGreater(phases["update"], 0.0)
    self.assertRegex(proc.stdout, r"generated tokens/s \d+\.\d")
    self.assertRegex(proc.stdout, r"trained tokens/s \d+\.\d")
    self.check_decode_step(proc.stdout, phases["generate"])
    padding = _PADDING.search(proc.stdout)
    self.assertIsNotNone(padding, proc.stdout)
    padded, packed = float(padding.group(1)), float(padding.group(2))
    self.assertGreaterEqual(padded, 0.0)
    self.assertLessEqual(packed, padded)
    self.assertEqual(padding.group(3), str(packing))
    # The same steps with each rollout drawn during the update before: its
    # samples one update old.
    ahead = _AHEAD.search(proc.stdout)
    self.assertIsNotNone(ahead, proc.stdout)
    sync_s, ahead_s, speedup = map(float, ahead.group(1, 2, 3))
    self.assertGreater(sync_s, 0.0)
    self.assertGreater(ahead_s, 0.0)
    self.assertAlmostEqual(speedup, sync_s / ahead_s, delta=0.02 * speedup)
    self.assertEqual(ahead.group(4), "1")
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    share = float(match.group(1))
    self.assertGreater(share, 0.0)
    self.assertLessEqual(share, 1.0)
    metrics, recorder, appends = map(int, match.group(2, 3, 4))
    m = _MICRO_BATCH_METRICS
    host = _HOST_METRICS + (_PACKING_METRICS if packing else 0)
    self.assertEqual(metrics, m + _STEP_METRICS + host + functions)
    # One append per micro-batch metric and micro-batch.
    self.assertEqual(appends, m * _K)
    self.assertIn(f"m={m} micro-batch metrics", proc.stdout)
    return metrics, recorder, appends

  def test_multi_turn_mode_times_tools_apart(self):
    config = runfiles.find("maxtext/configs/grpo_repair_tiny.py")
    self.assertIsNotNone(config)
    proc = runfiles.run_binary(
        "tools/benchmarks/grpo_bench",
        [
            f"--config={config}",
            "--config.emb_dim=16",
            "--config.num_layers=1",
            "--config.global_batch_size=4",
            "--config.grpo_num_generations=2",
            "--config.grpo_max_turns=2",
            "--config.grpo_max_turn_tokens=16",
            "--config.grpo_max_completion_length=64",
            "--config.max_sequence_length=600",
            # The held-out evaluations (the bench times none of them): one
            # prompt's 4 episodes, not 8 prompts' 32.
            "--config.grpo_eval_prompts=1",
            "--steps=1",
        ],
        timeout_s=900,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    phases = {}
    for line in proc.stdout.splitlines():
      fields = line.split()
      if len(fields) == 3 and fields[2].endswith("%"):
        phases[fields[0]] = float(fields[1])
    # Tools ran in the sandbox (the verifier at least) and generation ran.
    self.assertGreater(phases["tools"], 0.0)
    self.assertGreater(phases["generate"], 0.0)
    self.assertLessEqual(
        phases["generate"] + phases["tools"], phases["rollout"]
    )
    self.assertIn(
        "decode step reads: not counted (episodes count no decode steps)",
        proc.stdout,
    )

  def test_one_reward_function_more_adds_a_host_value_not_dispatches(self):
    two = self.check_run(2)
    # The second run trains packed rows too: two host values more.
    one = self.check_run(
        1,
        f"--config.grpo_reward_functions={_TASK}:exact_match",
        "--config.packing=true",
        packing=True,
    )
    self.assertEqual(two[0], one[0] + 1 - _PACKING_METRICS)
    # None over the bare loop, whatever M is: with K = 2 the update rides
    # the last micro-step, and the flush's one concatenation takes the
    # place of the bare loop's optimizer apply.
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
