"""A tiny GRPO run's MLPerf qwen35_397b_grpo log through the official checker.

Pretrains the tiny model briefly, runs GRPO from its checkpoint with the log
on (open division), and runs the official compliance checker on the log (in
a subprocess, as the other log tests do). The log holds the run's own
values, so it fails exactly the checks the rules fix to other values than a
tiny run uses: `max_sequence_length` (65536; the run's prompt plus
completion is 7 tokens), `eval_samples` (251 held-out prompts; the run has
8) and `eval_accuracy` (no grouped pass@4 above 0.69). Nothing else fails.

The run makes the reference's choices (qwen35_397b_grpo.py's): the
leave-one-out normalised advantage, the forced on-policy ratio with
sequence-mask truncated importance sampling and log-prob-error masking,
and an eval of 4 samples per held-out prompt whose grouped pass@4 is
`eval_accuracy` (not overlong filtering: the progression task has no stop
id, so every completion reaches the length limit; rollout_test and
train_loss_test cover it).
"""

import math
import os

from absl.testing import absltest

from maxtext import workloads
from maxtext.metrics import jsonl
from maxtext.mllog import logger as mllog_logger
from testing import compliance_checker
from testing import grpo_start
from testing import tiny_configs


class GrpoMllogTest(absltest.TestCase):

  def test_tiny_run_log_fails_exactly_the_fixed_values(self):
    root = self.create_tempdir().full_path
    config = tiny_configs.tiny_config(root, run_name="grpo", steps=4)
    values = dict(
        grpo_start.RUN_FIELDS,
        load_parameters_path=grpo_start.pretrained_checkpoints(root),
        **grpo_start.MLPERF_FIELDS,
    )
    for key, value in values.items():
      config[key] = value
    result = workloads.run(config, config_filename="grpo_mllog_test.py")
    self.assertEqual(result.final_step, 4)
    path = os.path.join(result.run_dir, "mllog.log")
    events = mllog_logger.read_events(path)
    header = {e["key"]: e["value"] for e in events}

    # Every value is the run's, from the fields that drive it.
    gbs, generations = 8, config.grpo_num_generations
    self.assertEqual(header["submission_benchmark"], "qwen35_397b_grpo")
    self.assertEqual(header["global_batch_size"], gbs)
    self.assertEqual(header["num_generations_per_prompt"], generations)
    self.assertEqual(header["num_prompts_per_step"], gbs // generations)
    self.assertEqual(
        header["max_sequence_length"],
        config.grpo_prompt_length + config.grpo_max_completion_length,
    )
    self.assertEqual(header["eval_samples"], config.grpo_eval_prompts)
    self.assertEqual(header["train_samples"], 4 * gbs)
    self.assertEqual(header["generation_training_rollout_temperature"], 0.9)
    self.assertEqual(header["generation_training_rollout_top_p"], 0.95)
    self.assertEqual(header["generation_validation_rollout_temperature"], 0.5)
    self.assertEqual(header["generation_validation_rollout_top_p"], 0.9)
    self.assertEqual(header["opt_learning_rate_decay_schedule"], "constant")
    self.assertEqual(header["opt_learning_rate_warmup_steps"], 0)
    self.assertEqual(header["opt_base_learning_rate"], 1e-3)
    self.assertEqual(header["init_checkpoint_step"], 0)

    # eval_accuracy is held-out grouped pass@4 (a prompt passes if any of
    # its 4 samples does) at the samples the schedule puts it: after
    # rollouts 2, 3 and 4 (P x G samples each), as metrics.jsonl has.
    accuracy = [e for e in events if e["key"] == "eval_accuracy"]
    self.assertEqual(
        [e["metadata"]["samples_count"] for e in accuracy], [16, 24, 32]
    )
    records = jsonl.read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    evals = [r for r in records if r["kind"] == "eval"]
    self.assertEqual([r["step"] for r in evals], [1, 2, 3])
    for event, record in zip(accuracy, evals):
      self.assertTrue(math.isclose(event["value"], record["eval_pass@4"]))
      self.assertGreaterEqual(record["eval_pass@4"], record["eval_pass@1"])
    # The reference loss's metrics are in every train record.
    train = [r for r in records if r["kind"] == "train"]
    for record in train:
      for name in (
          "masked/tis_frac",
          "masked/logprob_error_frac",
          "masked/overlong_frac",
          "sampling_is_ratio/max",
          "logprob_error/max",
      ):
        self.assertIn(name, record)
      # Forced on-policy: the PPO ratio is 1 whatever the weights are.
      self.assertEqual(record["is_ratio/max"], 1.0)
    # Each step's tracked_stats: the loss and the step time; no token or
    # FLOP rates (the pretraining step's counts are not a GRPO step's).
    stats = [
        e["value"]
        for e in events
        if e["key"] == "tracked_stats" and "train_loss" in e["value"]
    ]
    self.assertLen(stats, 4)
    self.assertEqual(set(stats[0]), {"train_loss", "step_time"})
    # run_start after the header; the run ends aborted (no target reached).
    keys = [e["key"] for e in events]
    self.assertLess(keys.index("init_stop"), keys.index("run_start"))
    stop = [e for e in events if e["key"] == "run_stop"]
    self.assertLen(stop, 1)
    self.assertEqual(stop[0]["metadata"]["status"], "aborted")

    checked = compliance_checker.run_checker(path)
    self.assertIsNone(grpo_start.tiny_log_problems(checked), checked.output)


if __name__ == "__main__":
  absltest.main()
