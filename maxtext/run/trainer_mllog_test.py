"""End-to-end tests of the MLPerf log through `trainer.run` (in-process).

Each test trains a tiny model of the default config's shape (grouped-query
attention, gradient accumulation, synthetic progressions) for a few dozen
steps, then judges the log the run wrote with the official `mlperf_logging`
compliance checker and compares its values with the run's real schedule and
step count.
"""

import json
import os
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax

from maxtext import workloads
from maxtext.config import optimizer
from maxtext.run import trainer
from testing import compliance_checker
from testing import tiny_configs

# Overrides of `tiny_configs.tiny_config`: the MLPerf tiny shape that every run
# here shares (so runs reuse compilations), with the default config's target.
_TINY = dict(
    tiny_configs.MLPERF_SHAPE,
    steps=30,
    checkpoint_period=0,
    target_eval_loss=0.5,
)
# The tiny model's eval loss passes these by step 30 (and only later for a
# lower one); see test_aborted_run_passes_with_run_stop_aborted's assertion.
_REACHABLE_TARGET = 0.95
_UNREACHABLE_TARGET = 0.05


def read_events(path):
  """The log's events (dicts) in file order."""
  events = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.startswith(":::MLLOG "):
        events.append(json.loads(line[len(":::MLLOG ") :]))
  return events


def values_of(events, key):
  return [e["value"] for e in events if e["key"] == key]


def metadata_of(events, key):
  return [e["metadata"] for e in events if e["key"] == key]


def single(events, key):
  found = values_of(events, key)
  if len(found) != 1:
    raise AssertionError(f"expected exactly one {key!r}, found {found}")
  return found[0]


class TrainerMllogTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Even the tiny compilations are worth caching between the runs here.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path

  def run_tiny(self, run_name, **overrides):
    config = tiny_configs.tiny_config(
        self.out, run_name=run_name, **{**_TINY, **overrides}
    )
    result = workloads.run(config, config_filename="default.py")
    return config, result

  def assert_checker_passes(self, path, ruleset):
    result = compliance_checker.run_checker(path, ruleset=ruleset)
    self.assertTrue(
        result.passed, f"ruleset {ruleset}: {result.messages}\n{result.output}"
    )

  def assert_values_match_run(self, config, result, events):
    """Schedule keys, sample counts and eval values match the run's."""
    facts = optimizer.schedule_facts(
        optimizer.OptimizerConfig.from_config(config)
    )
    gbs = config.global_batch_size
    self.assertEqual(
        single(events, "opt_learning_rate_warmup_steps"), facts.warmup_steps
    )
    self.assertEqual(
        single(events, "opt_learning_rate_decay_steps"), facts.decay_steps
    )
    self.assertEqual(
        single(events, "opt_learning_rate_decay_schedule"),
        facts.decay_schedule,
    )
    self.assertEqual(single(events, "global_batch_size"), gbs)
    self.assertEqual(
        single(events, "gradient_accumulation_steps"),
        config.gradient_accumulation_steps,
    )
    self.assertEqual(single(events, "max_steps"), config.steps)
    self.assertEqual(single(events, "init_checkpoint_step"), result.start_step)
    keys = {e["key"] for e in events}
    self.assertIn("opt_adamw_beta_1", keys)
    self.assertNotIn("opt_adam_beta_1", keys)
    # samples_count: samples trained at each point, from the restored step on.
    evals = [m["samples_count"] for m in metadata_of(events, "eval_accuracy")]
    interval = config.eval_interval
    first_eval = (result.start_step // interval + 1) * interval
    expected_eval_steps = list(
        range(first_eval, result.final_step + 1, interval)
    )
    if result.final_step not in expected_eval_steps:
      expected_eval_steps.append(result.final_step)  # The final eval.
    self.assertEqual(evals, [s * gbs for s in expected_eval_steps])
    self.assertEqual(
        metadata_of(events, "block_start")[0]["samples_count"],
        result.start_step * gbs,
    )
    self.assertEqual(
        metadata_of(events, "run_stop")[0]["samples_count"],
        result.final_step * gbs,
    )
    # One tracked_stats per step, and the last eval is the run's last eval.
    steps = [
        e["metadata"]["step"]
        for e in events
        if e["key"] == "tracked_stats" and "train_loss" in e["value"]
    ]
    self.assertEqual(
        steps, list(range(result.start_step + 1, result.final_step + 1))
    )
    # Each step's stats carry the samples trained and the throughput.
    for e in events:
      if e["key"] == "tracked_stats" and "train_loss" in e["value"]:
        self.assertEqual(
            e["metadata"]["samples_count"], e["metadata"]["step"] * gbs
        )
        self.assertGreater(e["value"]["samples_per_s"], 0)
        self.assertAlmostEqual(
            e["value"]["tokens_per_s"],
            e["value"]["samples_per_s"] * config.max_sequence_length,
            delta=1e-6 * e["value"]["tokens_per_s"],
        )
    self.assertAlmostEqual(
        values_of(events, "eval_accuracy")[-1], result.last_eval_loss, places=5
    )
    # block_start/block_stop pair up.
    self.assertEqual(
        len(values_of(events, "block_start")),
        len(values_of(events, "block_stop")),
    )

  def test_run_reaching_target_passes_with_run_stop_success(self):
    # A budget past the step that reaches the target: the target stops it.
    config, result = self.run_tiny(
        "success", steps=40, target_eval_loss=_REACHABLE_TARGET
    )
    self.assertEqual(result.status, trainer.RunOutcome.SUCCESS)
    self.assertLess(result.final_step, config.steps)
    path = os.path.join(result.run_dir, "mllog.log")
    for ruleset in ("6.1.0", "6.0.0"):
      self.assert_checker_passes(path, ruleset)
    events = read_events(path)
    self.assertEqual(
        [m["status"] for m in metadata_of(events, "run_stop")], ["success"]
    )
    self.assertEqual(events[0]["key"], "cache_clear")
    self.assertEqual(events[-1]["key"], "run_stop")
    self.assertLessEqual(
        values_of(events, "eval_accuracy")[-1], _REACHABLE_TARGET
    )
    self.assert_values_match_run(config, result, events)

  def test_aborted_run_and_its_resume_each_pass(self):
    config, first = self.run_tiny(
        "budget", target_eval_loss=_UNREACHABLE_TARGET
    )
    self.assertEqual(first.status, trainer.RunOutcome.COMPLETED)
    self.assertEqual(first.final_step, config.steps)
    path = os.path.join(first.run_dir, "mllog.log")
    events = read_events(path)
    # The open rule wants one eval below 1.0: the budget is sized for that.
    self.assertLess(min(values_of(events, "eval_accuracy")), 1.0)
    for ruleset in ("6.1.0", "6.0.0"):
      self.assert_checker_passes(path, ruleset)
    self.assertEqual(
        [m["status"] for m in metadata_of(events, "run_stop")], ["aborted"]
    )
    self.assert_values_match_run(config, first, events)
    with open(path, encoding="utf-8") as f:
      first_log = f.read()

    # The same run name resumes from the final checkpoint with a larger budget.
    config2, second = self.run_tiny(
        "budget",
        target_eval_loss=_UNREACHABLE_TARGET,
        steps=config.steps + 2 * config.eval_interval,
    )
    self.assertEqual(second.start_step, first.final_step)
    self.assertEqual(second.final_step, config2.steps)
    path2 = os.path.join(second.run_dir, "mllog.2.log")
    self.assertTrue(os.path.isfile(path2), os.listdir(second.run_dir))
    for ruleset in ("6.1.0", "6.0.0"):
      self.assert_checker_passes(path2, ruleset)
    events2 = read_events(path2)
    self.assertEqual(single(events2, "init_checkpoint_step"), first.final_step)
    self.assertEqual(events2[0]["key"], "cache_clear")
    self.assertEqual(
        [m["status"] for m in metadata_of(events2, "run_stop")], ["aborted"]
    )
    self.assert_values_match_run(config2, second, events2)
    # The first attempt's log is left as it was.
    with open(path, encoding="utf-8") as f:
      self.assertEqual(f.read(), first_log)

  def test_unwritable_mllog_path_is_refused_before_training(self):
    # A regular file where the log's directory should be: creating the log
    # fails for every user (root included, unlike a read-only directory).
    blocker = os.path.join(self.out, "a_file")
    with open(blocker, "w", encoding="utf-8") as f:
      f.write("not a directory\n")
    mllog_file = os.path.join(blocker, "mllog.log")
    with self.assertRaisesRegex(
        ValueError,
        rf"^config\.mllog_file='{re.escape(mllog_file)}': "
        rf"{re.escape(blocker)} is a regular file, not a directory$",
    ):
      self.run_tiny("unwritable", steps=2, mllog_file=mllog_file)
    with open(blocker, encoding="utf-8") as f:
      self.assertEqual(f.read(), "not a directory\n")
    # Refused before the run directory, or anything else, was made.
    self.assertEqual(os.listdir(self.out), ["a_file"])

  def test_failure_after_the_log_opened_still_ends_it_as_a_sequence(self):
    # Parameters of another shape: found only once the model is built, after
    # the log's init_start.
    _, other = self.run_tiny(
        "other_shape",
        steps=1,
        emb_dim=16,
        num_heads=2,
        num_kv_heads=1,
        enable_mllog=False,
    )
    with self.assertRaises(Exception):
      self.run_tiny(
          "wrong_params",
          load_parameters_path=os.path.join(other.run_dir, "checkpoints"),
      )
    path = os.path.join(self.out, "wrong_params", "mllog.log")
    events = read_events(path)
    self.assertEqual(
        [m["status"] for m in metadata_of(events, "run_stop")], ["aborted"]
    )
    self.assertEqual(metadata_of(events, "run_stop")[0]["samples_count"], 0)
    # The events that bracket the run: each once, in this order.
    sequence = [
        "init_start",
        "init_stop",
        "run_start",
        "block_start",
        "block_stop",
        "run_stop",
    ]
    self.assertEqual(
        [e["key"] for e in events if e["key"] in sequence], sequence
    )
    # A complete sequence; the checker's only complaint is the missing eval
    # result, which a run that never trained cannot have.
    for ruleset in ("6.1.0", "6.0.0"):
      result = compliance_checker.run_checker(path, ruleset=ruleset)
      self.assertFalse(result.passed)
      self.assertEqual(
          result.messages,
          ("Required AT_LEAST_ONE occurrence of 'eval_accuracy' but found 0",),
          result.output,
      )

  def test_mistake_found_before_the_log_leaves_none(self):
    with self.assertRaisesRegex(ValueError, r"resume=True.*no checkpoint"):
      self.run_tiny("nothing_to_resume", resume=True)
    self.assertFalse(
        os.path.exists(os.path.join(self.out, "nothing_to_resume", "mllog.log"))
    )


if __name__ == "__main__":
  absltest.main()
