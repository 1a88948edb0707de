"""Tests for math_heldout_lib: the plan's runs, the SFT length, the verdict."""

import dataclasses

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.configs import grpo_math_small
from maxtext.configs import grpo_math_tiny
from maxtext.configs import sft_math_small
from tools import math_heldout_lib as lib

_PLACES = lib.Places(runs="/w/runs", demos="/w/demos", cache="/w/cache")


def _result(seed, sft, grpo, control):
  return lib.SeedResult(
      seed=seed,
      sft={"pass@1": sft[0], "pass@4": sft[1]},
      grpo={"pass@1": grpo[0], "pass@4": grpo[1]},
      control={"pass@1": control[0], "pass@4": control[1]},
  )


class PlanTest(absltest.TestCase):

  def test_the_small_configs_evaluate_as_the_benchmark(self):
    config = grpo_math_small.get_config()
    config_lib.validate(config)
    self.assertEqual(config.grpo_eval_temperature, 0.1)
    self.assertEqual(config.grpo_eval_top_p, 0.95)
    self.assertEqual(config.grpo_eval_samples_per_prompt, 4)
    self.assertEqual(config.grpo_eval_target_metric, "pass@4")
    self.assertGreaterEqual(config.grpo_eval_prompts, 256)

  def test_the_control_trains_as_many_samples_as_grpo(self):
    grpo, sft = grpo_math_small.get_config(), sft_math_small.get_config()
    steps = lib.control_steps(grpo, sft)
    self.assertEqual(
        steps * sft.global_batch_size,
        lib.grpo_samples(grpo.steps, grpo.global_batch_size, 1),
    )
    self.assertEqual(steps, 150)
    halved = config_lib.with_values(sft, {"global_batch_size": 32})
    self.assertEqual(lib.control_steps(grpo, halved), 300)

  def test_samples_count_once_a_rollout(self):
    self.assertEqual(lib.grpo_samples(200, 64, 1), 12800)
    self.assertEqual(lib.grpo_samples(200, 64, 2), 6400)
    self.assertEqual(lib.grpo_samples(5, 64, 2), 192)

  def test_a_control_that_cannot_match_is_refused(self):
    grpo = config_lib.with_values(
        grpo_math_small.get_config(), {"steps": 3, "global_batch_size": 48}
    )
    with self.assertRaisesRegex(
        ValueError, r"144 samples.*global_batch_size=64"
    ):
      lib.control_steps(grpo, sft_math_small.get_config())

  def test_the_runs_differ_where_the_plan_says(self):
    sft, grpo = sft_math_small.get_config(), grpo_math_small.get_config()
    first = lib.sft_run(sft, _PLACES, 2, 300, 800)
    control = lib.control_run(sft, _PLACES, 2, "/w/runs/sft_s2/c/300", 200)
    arm = lib.grpo_run(grpo, _PLACES, 2, "/w/runs/sft_s2/c/300")
    probe = lib.eval_run(grpo, _PLACES, "probe", 2, "/w/runs/sft_s2/c/100")
    for config in (first, control, arm, probe):
      config_lib.validate(config)
      self.assertEqual(config.seed, 2)
      self.assertEqual(config.base_output_directory, "/w/runs")
      self.assertEqual(config.jax_compilation_cache_dir, "/w/cache")
    self.assertEqual((first.steps, first.load_parameters_path), (300, ""))
    self.assertEqual(first.lr_schedule_steps, 800)
    # Only the probed SFT run keeps its checkpoints part-way.
    self.assertEqual(first.checkpoint_period, 300)
    probed = lib.sft_run(sft, _PLACES, 2, 800, 800, probed=True)
    self.assertEqual(probed.checkpoint_period, sft.checkpoint_period)
    self.assertEqual(control.checkpoint_period, 200)
    self.assertEqual(first.train_data_path, "/w/demos/train.jsonl")
    self.assertEqual(control.train_data_path, first.train_data_path)
    self.assertNotEqual(control.data_shuffle_seed, first.data_shuffle_seed)
    self.assertEqual(control.load_parameters_path, "/w/runs/sft_s2/c/300")
    self.assertEqual(control.learning_rate, first.learning_rate)
    self.assertEqual(arm.steps, grpo.steps)
    self.assertEqual(arm.load_parameters_path, control.load_parameters_path)
    self.assertEqual((probe.steps, probe.run_name), (1, "probe"))
    names = {c.run_name for c in (first, control, arm, probe)}
    self.assertLen(names, 4)
    # The configs given are left as they were.
    self.assertEqual(
        sft.base_output_directory,
        sft_math_small.get_config().base_output_directory,
    )

  def test_every_sft_run_follows_the_longest_ones_schedule(self):
    sft = sft_math_small.get_config()
    cosine = config_lib.with_values(sft, {"lr_schedule": "cosine"})
    longest = lib.sft_run(cosine, _PLACES, 0, 800, 800)
    shorter = lib.sft_run(cosine, _PLACES, 1, 300, 800)
    self.assertEqual(longest.lr_schedule_steps, shorter.lr_schedule_steps)
    config_lib.validate(shorter)
    fixed = config_lib.with_values(cosine, {"lr_schedule_steps": 1000})
    self.assertEqual(
        lib.sft_run(fixed, _PLACES, 1, 300, 800).lr_schedule_steps, 1000
    )

  def test_the_configs_must_describe_one_model(self):
    sft = sft_math_small.get_config()
    lib.check_same_model(sft, grpo_math_small.get_config())
    with self.assertRaisesRegex(ValueError, r"different models: parameter"):
      lib.check_same_model(sft, grpo_math_tiny.get_config())
    wider = config_lib.with_values(sft, {"mlp_dim": 1024})
    with self.assertRaisesRegex(
        ValueError,
        r"w_down'\] is float32\[4, 1024, 512\] in the SFT config, "
        r"float32\[4, 2048, 512\] in the GRPO config",
    ):
      lib.check_same_model(wider, grpo_math_small.get_config())

  def test_a_target_that_would_end_a_run_early_is_refused(self):
    sft, grpo = sft_math_small.get_config(), grpo_math_small.get_config()
    lib.check_full_length(sft, grpo)
    with self.assertRaisesRegex(ValueError, "target_eval_loss=0.5"):
      lib.check_full_length(
          config_lib.with_values(sft, {"target_eval_loss": 0.5}), grpo
      )
    with self.assertRaisesRegex(ValueError, "grpo_target_pass_rate=0.9"):
      lib.check_full_length(
          sft, config_lib.with_values(grpo, {"grpo_target_pass_rate": 0.9})
      )

  def test_finding_the_sft_length_needs_every_checkpoint(self):
    sft = sft_math_small.get_config()
    lib.check_keeps_candidates(sft)  # Keeps all.
    keeps_3 = config_lib.with_values(sft, {"max_checkpoints_to_keep": 3})
    with self.assertRaisesRegex(
        ValueError, "max_checkpoints_to_keep=3: .* 12 checkpoints"
    ):
      lib.check_keeps_candidates(keeps_3)
    lib.check_keeps_candidates(
        config_lib.with_values(keeps_3, {"checkpoint_period": 200})
    )

  def test_checkpoint_steps(self):
    self.assertEqual(lib.checkpoint_steps(400, 100), [100, 200, 300, 400])
    self.assertEqual(lib.checkpoint_steps(250, 100), [100, 200, 250])
    self.assertEqual(lib.checkpoint_steps(50, 100), [50])
    with self.assertRaisesRegex(ValueError, "checkpoint_period=0"):
      lib.checkpoint_steps(50, 0)


class FirstReachingTest(absltest.TestCase):

  def _search(self, values, target):
    """first_reaching over `values` (step -> value); (chosen, steps asked)."""
    asked = []

    def value_of(step):
      asked.append(step)
      return values[step]

    chosen, seen = lib.first_reaching(sorted(values), value_of, target)
    self.assertLen(asked, len(set(asked)), "a step was evaluated twice")
    self.assertEqual(set(asked), set(seen))
    return chosen, asked

  def test_finds_the_first_step_at_or_above_the_target(self):
    values = {100 * i: 0.07 * i for i in range(1, 9)}  # 0.07 .. 0.56
    for target, expected in ((0.3, 500), (0.28, 400), (0.07, 100), (0.56, 800)):
      chosen, asked = self._search(values, target)
      self.assertEqual(chosen, expected, f"target {target}")
      self.assertLessEqual(len(asked), 4)

  def test_none_reaching_gives_the_last(self):
    chosen, _ = self._search({100: 0.0, 200: 0.1, 300: 0.2}, 0.9)
    self.assertEqual(chosen, 300)

  def test_one_candidate_is_still_evaluated(self):
    chosen, asked = self._search({400: 0.5}, 0.3)
    self.assertEqual((chosen, asked), (400, [400]))

  def test_no_candidates(self):
    with self.assertRaises(ValueError):
      lib.first_reaching([], lambda s: 0.0, 0.3)


class VerdictTest(absltest.TestCase):

  def test_a_gain_beyond_the_spread_counts(self):
    results = [
        _result(0, (0.3, 0.5), (0.5, 0.70), (0.4, 0.60)),
        _result(1, (0.3, 0.5), (0.5, 0.72), (0.4, 0.58)),
        _result(2, (0.3, 0.5), (0.5, 0.74), (0.4, 0.62)),
    ]
    v = lib.verdict(results, "pass@4")
    self.assertAlmostEqual(v.grpo_mean, 0.72)
    self.assertAlmostEqual(v.control_mean, 0.60)
    self.assertAlmostEqual(v.spread, 0.04)
    self.assertAlmostEqual(v.gain, 0.12)
    self.assertAlmostEqual(v.sft_mean, 0.5)
    self.assertTrue(v.counts)
    self.assertIn("GRPO gains", v.line())

  def test_a_gain_within_either_arms_spread_does_not(self):
    results = [
        _result(0, (0.3, 0.5), (0.5, 0.70), (0.4, 0.50)),
        _result(1, (0.3, 0.5), (0.5, 0.72), (0.4, 0.68)),
    ]
    v = lib.verdict(results, "pass@4")
    self.assertAlmostEqual(v.spread, 0.18)  # The control's range.
    self.assertAlmostEqual(v.gain, 0.12)
    self.assertFalse(v.counts)
    self.assertIn("no gain", v.line())
    # One seed has no spread: any gain counts, and the line says why.
    one = lib.verdict(results[1:], "pass@4")
    self.assertTrue(one.counts)
    self.assertIn("one seed", one.line())

  def test_a_loss_is_no_gain(self):
    v = lib.verdict([_result(0, (0.3, 0.5), (0.2, 0.4), (0.4, 0.6))], "pass@4")
    self.assertAlmostEqual(v.gain, -0.2)
    self.assertFalse(v.counts)
    self.assertIn("one seed", v.line())

  def test_a_missing_metric_is_named(self):
    with self.assertRaisesRegex(ValueError, "no 'pass@16'"):
      lib.verdict([_result(0, (0, 0), (0, 0), (0, 0))], "pass@16")

  def test_table_rows_and_means(self):
    results = [
        _result(0, (0.25, 0.5), (0.5, 0.75), (0.375, 0.625)),
        dataclasses.replace(
            _result(1, (0.25, 0.5), (0.25, 0.25), (0.125, 0.125)),
            grpo_training={"rewards/mean": 0.5},
        ),
    ]
    text = lib.table(results, ["pass@1", "pass@4"], ["rewards/mean"])
    lines = text.splitlines()
    self.assertLen(lines, 5)
    self.assertEqual(
        lines[2], "| 0 | 0.250 / 0.500 | 0.500 / 0.750 | 0.375 / 0.625 | - |"
    )
    self.assertEqual(
        lines[4],
        "| mean | 0.250 / 0.500 | 0.375 / 0.500 | 0.250 / 0.375 | 0.500 |",
    )

  def test_training_summary(self):
    records = [{"rewards/mean": float(i), "loss": 1.0} for i in range(30)]
    out = lib.training_summary(records, ["rewards/mean", "absent"], 10)
    self.assertEqual(
        out,
        {
            "rewards/mean": 14.5,
            "rewards/mean first": 4.5,
            "rewards/mean last": 24.5,
        },
    )


if __name__ == "__main__":
  absltest.main()
