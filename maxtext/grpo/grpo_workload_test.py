"""The GRPO workload end to end through the one loop: pretrain briefly,
post-train, resume, refuse, stop, skip, finish."""

import json
import os
import shutil
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.runtime import preemption
from maxtext.run import trainer
from maxtext.run import reference_pin
from maxtext import workloads
from maxtext.grpo.rewards import rewards
from maxtext.listeners import interface as listener_interface
from maxtext.metrics import jsonl
from maxtext.storage import checkpointing
from maxtext.storage import checksums
from testing import compile_counter
from testing import grpo_start
from testing import nan_params
from testing import tiny_configs


def always_fails(prompt, completion):
  """A reward function that raises."""
  del completion
  raise ZeroDivisionError(f"no reward for {len(prompt)} terms")


# Calls of `fails_in_step_1`; 2 prompts x 4 completions are one step's 8.
_CALLS = [0]


def fails_in_step_1(prompt, completion):
  """A reward function that scores step 0's completions, then raises."""
  del prompt, completion
  _CALLS[0] += 1
  if _CALLS[0] > 8:
    raise ValueError("step 1 is out of scope")
  return 1.0


def _train_records(run_dir):
  """A run's train records by step."""
  return {
      r["step"]: r
      for r in jsonl.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
      if r["kind"] == "train"
  }


def _checkpoint_steps(run_dir):
  """The steps of a run's checkpoints, oldest first."""
  with checkpointing.Checkpointer(
      os.path.join(run_dir, "checkpoints"), save_period=1, max_to_keep=0
  ) as ckpt:
    return ckpt.all_steps()


class _StopAt(listener_interface.RunListener):
  """Asks the run to stop (as SIGTERM does) when step `step` starts."""

  name = "stop_at"

  def __init__(self, stop: preemption.StopRequest, step: int):
    self._stop = stop
    self._step = step

  def on_step_start(self, step):
    if step == self._step:
      self._stop.request("SIGTERM")


class _FailsAt(listener_interface.RunListener):
  """An output whose disk fills up when step `step`'s record comes."""

  name = "full_disk"

  def __init__(self, step: int):
    self._step = step

  def on_step(self, record):
    if record.step == self._step:
      raise OSError(28, "No space left on device", "/full/metrics")


def _grpo_config(output_dir, load_from, **overrides):
  """The tiny test model as a GRPO run starting from `load_from`."""
  config = tiny_configs.tiny_config(output_dir, run_name="grpo", steps=3)
  values = dict(
      grpo_start.RUN_FIELDS,
      load_parameters_path=load_from,
      eval_interval=2,
      checkpoint_period=2,
  )
  values.update(overrides)
  for key, value in values.items():
    config[key] = value
  return config


class GrpoRunTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checkpoints = grpo_start.pretrained_checkpoints(
        absltest.get_default_test_tmpdir()
    )

  def test_runs_records_and_resumes(self):
    out = self.create_tempdir().full_path
    result = workloads.run(_grpo_config(out, self.checkpoints))
    self.assertEqual(result.final_step, 3)
    self.assertIn("pass@1", result.last_eval)
    self.assertIn("pass@1", result.start_eval)
    records = jsonl.read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    self.assertEqual([r["step"] for r in train], [0, 1, 2])
    for name in (
        "rewards/mean",
        "rewards/exact_match",
        "rewards/prefix_match",
        "is_ratio/mean",
        "kl",
        "pg_clipfrac",
        "advantage/abs_mean",
        "completions/mean_length",
        "grad_norm",
    ):
      self.assertIn(name, train[0])
    self.assertAlmostEqual(train[0]["is_ratio/mean"], 1.0, places=3)
    # Throughput counts the trained rows (prompt plus completion tokens),
    # not max_sequence_length.
    width = (
        tiny_configs.TINY_GRPO["grpo_prompt_length"]
        + tiny_configs.TINY_GRPO["grpo_max_completion_length"]
    )
    self.assertAlmostEqual(
        train[0]["tokens_per_s"] * train[0]["step_time_s"], 8 * width, places=2
    )
    self.assertEqual([r["step"] for r in evals], [1, 2])
    self.assertTrue(any("pass@1" in key for key in evals[0]))

    # Resume: the run goes on from its checkpoint of step 3, and its steps
    # 3 and 4 are those of a run that was never interrupted (the prompts and
    # the draws are functions of the seed and the step).
    again = workloads.run(_grpo_config(out, self.checkpoints, steps=5))
    self.assertEqual((again.start_step, again.final_step), (3, 5))
    straight_dir = self.create_tempdir().full_path
    straight = workloads.run(
        _grpo_config(straight_dir, self.checkpoints, steps=5)
    )

    resumed, uninterrupted = (
        _train_records(again.run_dir),
        _train_records(straight.run_dir),
    )
    for step in (3, 4):
      for name in ("rewards/mean", "completions/mean_length", "loss", "kl"):
        self.assertAlmostEqual(
            resumed[step][name], uninterrupted[step][name], places=5
        )

  def test_stop_request_checkpoints_after_the_rollouts_last_update(self):
    # The request comes while update 2 (rollout 1's first) runs; the run
    # stops after update 3, rollout 1's last, with a checkpoint there, and
    # its resume gives the records of a run never stopped.
    out = self.create_tempdir().full_path
    stop = preemption.StopRequest(signals=())
    config = _grpo_config(
        out,
        self.checkpoints,
        grpo_num_iterations=2,
        steps=6,
        eval_interval=6,
        checkpoint_period=6,
    )
    result = workloads.run(
        config, stop_request=stop, extra_listeners=[_StopAt(stop, 2)]
    )
    self.assertEqual(result.status, trainer.RunOutcome.INTERRUPTED)
    self.assertEqual(result.stop_reason, "SIGTERM")
    self.assertEqual(result.final_step, 4)
    self.assertEqual(_checkpoint_steps(result.run_dir), [4])
    resumed = workloads.run(config)
    self.assertEqual((resumed.start_step, resumed.final_step), (4, 6))
    straight_dir = self.create_tempdir().full_path
    straight = workloads.run(
        _grpo_config(
            straight_dir,
            self.checkpoints,
            grpo_num_iterations=2,
            steps=6,
            eval_interval=6,
            checkpoint_period=6,
        )
    )
    stopped, uninterrupted = (
        _train_records(resumed.run_dir),
        _train_records(straight.run_dir),
    )
    self.assertEqual(sorted(stopped), list(range(6)))
    for step in range(6):
      for name in grpo_start.COMPARED_METRICS:
        self.assertAlmostEqual(
            stopped[step][name], uninterrupted[step][name], places=5
        )

  def test_rollouts_drawn_one_update_ahead(self):
    # grpo_max_age=1: rollout s + 1 is drawn with the parameters before
    # update s. Rollout 0 has nothing to overlap, so step 0 is the
    # synchronous run's; every later sample trains one update old, and the
    # records say so. Nothing compiles after run_start on this path either,
    # the log-prob-error gate included (it gates each rollout when its
    # update reads it).
    fields = dict(
        steps=4,
        eval_interval=4,
        checkpoint_period=4,
        grpo_logprob_error_threshold=2.0,
    )
    out = self.create_tempdir().full_path
    sync = workloads.run(_grpo_config(out, self.checkpoints, **fields))
    counter = compile_counter.RunStartCounter()
    ahead = workloads.run(
        _grpo_config(
            self.create_tempdir().full_path,
            self.checkpoints,
            grpo_max_age=1,
            **fields,
        ),
        extra_listeners=[counter],
    )
    self.assertEqual(counter.count(), 0)
    sync_records = _train_records(sync.run_dir)
    ahead_records = _train_records(ahead.run_dir)
    self.assertEqual(sorted(ahead_records), [0, 1, 2, 3])
    # The synchronous records are today's: no ages.
    ages = {"rollout/age_max", "rollout/age_mean"}
    for step in range(4):
      self.assertEqual(set(ahead_records[step]) - set(sync_records[step]), ages)
      self.assertEqual(set(sync_records[step]) & ages, set())
    self.assertEqual(ahead_records[0]["rollout/age_max"], 0)
    self.assertEqual(ahead_records[0]["rollout/age_mean"], 0)
    for step in (1, 2, 3):
      self.assertEqual(ahead_records[step]["rollout/age_max"], 1)
      self.assertEqual(ahead_records[step]["rollout/age_mean"], 1)
    for name in (*grpo_start.COMPARED_METRICS, "is_ratio/mean"):
      self.assertAlmostEqual(
          ahead_records[0][name], sync_records[0][name], places=6
      )
    # Update 1 trains on samples of the starting parameters: its ratio to
    # the behaviour log-probabilities recorded at generation moves off 1,
    # where the synchronous update's (same parameters) stays at 1.
    self.assertAlmostEqual(sync_records[1]["is_ratio/mean"], 1.0, places=4)
    self.assertGreater(abs(ahead_records[1]["is_ratio/mean"] - 1.0), 1e-4)

  def test_resume_with_a_rollout_ahead_continues_the_run(self):
    # A stop after update 1 checkpoints step 2 with rollout 2, drawn with
    # the parameters of step 1; the resume trains on it, so its records are
    # those of a run never stopped. Without the saved rollout a resume
    # draws rollout 2 again with the parameters of step 2 (age 0).
    def config(out, steps):
      return _grpo_config(
          out,
          self.checkpoints,
          grpo_max_age=1,
          steps=steps,
          eval_interval=4,
          checkpoint_period=4,
      )

    out = self.create_tempdir().full_path
    stop = preemption.StopRequest(signals=())
    stopped = workloads.run(
        config(out, 4), stop_request=stop, extra_listeners=[_StopAt(stop, 1)]
    )
    self.assertEqual(stopped.status, trainer.RunOutcome.INTERRUPTED)
    self.assertEqual(stopped.final_step, 2)
    state_file = os.path.join(
        stopped.run_dir, "checkpoints", "data_iterator", "2", "process_0.json"
    )
    with open(state_file, encoding="utf-8") as f:
      self.assertEqual(json.load(f)["pending_rollout"]["index"], 2)
    bare = self.create_tempdir().full_path
    shutil.copytree(out, bare, dirs_exist_ok=True)
    os.remove(state_file.replace(out, bare, 1))

    resumed = workloads.run(config(out, 4))
    self.assertEqual((resumed.start_step, resumed.final_step), (2, 4))
    straight = workloads.run(config(self.create_tempdir().full_path, 4))
    got, want = (
        _train_records(resumed.run_dir),
        _train_records(straight.run_dir),
    )
    self.assertEqual(sorted(got), [0, 1, 2, 3])
    for step in range(4):
      for name in (*grpo_start.COMPARED_METRICS, "rollout/age_max"):
        self.assertAlmostEqual(got[step][name], want[step][name], places=5)

    with self.assertLogs(level="WARNING") as logs:
      redrawn = workloads.run(config(bare, 4))
    self.assertTrue(
        any("holds no rollout drawn ahead" in line for line in logs.output),
        logs.output,
    )
    self.assertEqual(_train_records(redrawn.run_dir)[2]["rollout/age_max"], 0)

  def test_non_finite_steps_stop_the_run(self):
    # Parameters with a NaN: every step's gradients are non-finite, so
    # every step is skipped until max_consecutive_skipped_steps stops the
    # run, as pretraining's loop does.
    config = _grpo_config(
        self.create_tempdir().full_path,
        self.checkpoints,
        steps=8,
        max_consecutive_skipped_steps=2,
    )
    nan_dir = self.create_tempdir().full_path
    nan_params.write(config, nan_dir)
    config.load_parameters_path = nan_dir
    with self.assertRaisesRegex(
        trainer.TrainingError,
        r"^2 consecutive steps had non-finite gradients "
        r"\(max_consecutive_skipped_steps=2\); stopping at step 1\. No "
        r"checkpoint was written yet",
    ):
      workloads.run(config)
    records = _train_records(os.path.join(config.base_output_directory, "grpo"))
    self.assertEqual(sorted(records), [0, 1])
    for record in records.values():
      self.assertEqual(record["step_skipped"], 1)
      self.assertTrue(np.isnan(record["loss"]))

  def test_rerun_of_a_finished_run_says_so(self):
    out = self.create_tempdir().full_path
    config = _grpo_config(out, self.checkpoints, steps=2)
    first = workloads.run(config)
    self.assertEqual(first.final_step, 2)
    with self.assertLogs(level="WARNING") as logs:
      again = workloads.run(config)
    self.assertEqual(again.status, trainer.RunOutcome.COMPLETED)
    self.assertEqual((again.start_step, again.final_step), (2, 2))
    self.assertTrue(
        any("already completed step 2" in line for line in logs.output),
        logs.output,
    )
    self.assertEqual(sorted(_train_records(first.run_dir)), [0, 1])

  def test_failing_output_checkpoints_the_last_step(self):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        trainer.ListenerError,
        r"^output 'full_disk' failed \(on_step\): OSError: \[Errno 28\]",
    ):
      workloads.run(
          _grpo_config(out, self.checkpoints, steps=3, checkpoint_period=0),
          extra_listeners=[_FailsAt(1)],
      )
    # Step 1's record is written once step 2 has been dispatched, before
    # its update: the checkpoint holds the 2 completed steps.
    self.assertEqual(_checkpoint_steps(os.path.join(out, "grpo")), [2])

  def test_target_pass_rate_ends_the_run(self):
    out = self.create_tempdir().full_path
    # One term to continue: the pretrained model gets some held-out prompts
    # right from the start, so the first eval (after step 2) reaches the
    # target and the run stops there.
    result = workloads.run(
        _grpo_config(
            out,
            self.checkpoints,
            grpo_max_completion_length=1,
            grpo_target_pass_rate=0.05,
        )
    )
    self.assertGreater(result.start_eval["pass@1"], 0.05)
    self.assertEqual(result.status, trainer.RunOutcome.SUCCESS)
    self.assertEqual(result.final_step, 2)
    records = jsonl.read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    evals = [r for r in records if r["kind"] == "eval"]
    self.assertLen(evals, 1)
    self.assertGreaterEqual(evals[0]["eval_pass@1"], 0.05)

  def test_a_resume_whose_reference_changed_is_refused(self):
    # The reference's checkpoint directory gains a newer step (its
    # pretraining went on): load_parameters_path now resolves to it.
    source = self.create_tempdir().full_path
    checkpoints = os.path.join(source, "checkpoints")
    shutil.copytree(self.checkpoints, checkpoints)
    last = max(int(name) for name in os.listdir(checkpoints) if name.isdigit())
    out = self.create_tempdir().full_path
    first = workloads.run(_grpo_config(out, checkpoints, steps=2))
    self.assertEqual(first.final_step, 2)
    pin_path = os.path.join(first.run_dir, reference_pin.PIN_FILE)
    with open(pin_path, encoding="utf-8") as f:
      pinned = json.load(f)["pinned"]
    self.assertEqual(pinned["step"], last)
    newer = os.path.join(checkpoints, str(last + 1))
    shutil.copytree(os.path.join(checkpoints, str(last)), newer)
    # A newer save of the same weights: its manifest records its own step.
    manifest = os.path.join(newer, checksums.MANIFEST)
    with open(manifest, encoding="utf-8") as f:
      document = json.load(f)
    document["step"] = last + 1
    with open(manifest, "w", encoding="utf-8") as f:
      json.dump(document, f)
    with self.assertRaisesRegex(
        trainer.ConfigError,
        rf"^the KL reference changed: .* now reads step {last + 1} .*the run "
        rf"pinned step {last} .*grpo_allow_reference_change=True",
    ):
      workloads.run(_grpo_config(out, checkpoints, steps=3))
    # Allowed: the run goes on and the change is on record.
    again = workloads.run(
        _grpo_config(
            out, checkpoints, steps=3, grpo_allow_reference_change=True
        )
    )
    self.assertEqual((again.start_step, again.final_step), (2, 3))
    with open(pin_path, encoding="utf-8") as f:
      record = json.load(f)
    self.assertEqual(record["pinned"]["step"], last + 1)
    self.assertEqual([c["from"]["step"] for c in record["changes"]], [last])

  def test_two_passes_per_rollout_and_no_compile_after_run_start(self):
    # Rollouts, the reference's scoring (beta > 0), two passes per rollout,
    # evals and checkpoints after run_start: the warm-up and the start eval
    # compiled every program before it. The same run's records show the two
    # passes over each rollout.
    counter = compile_counter.RunStartCounter()
    began = time.monotonic()
    out = self.create_tempdir().full_path
    result = workloads.run(
        _grpo_config(
            out,
            self.checkpoints,
            grpo_beta=0.04,
            grpo_num_iterations=2,
            steps=4,
        ),
        extra_listeners=[counter],
    )
    self.assertEqual(result.final_step, 4)
    after = counter.count()
    self.assertGreater(compile_counter.count_after(began) - after, 0)
    self.assertEqual(compile_counter.backend_compiles_after(counter.at), [])
    self.assertEqual(after, 0)
    records = jsonl.read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
    train = [r for r in records if r["kind"] == "train"]
    self.assertEqual([r["step"] for r in train], [0, 1, 2, 3])
    # Updates 0 and 1 share rollout 0 (the same rewards); the second pass
    # is off-policy.
    self.assertEqual(train[0]["rewards/mean"], train[1]["rewards/mean"])
    self.assertEqual(
        train[0]["completions/mean_length"], train[1]["completions/mean_length"]
    )
    self.assertAlmostEqual(train[0]["is_ratio/mean"], 1.0, places=3)
    self.assertNotAlmostEqual(train[1]["is_ratio/max"], 1.0, places=4)
    evals = [r for r in records if r["kind"] == "eval"]
    self.assertEqual([r["step"] for r in evals], [1, 3])

  @parameterized.named_parameters(
      ("one_generation", {"grpo_num_generations": 1}, "grpo_num_generations=1"),
      ("top_p", {"grpo_top_p": 1.5}, r"grpo_top_p=1.5: must be in \(0, 1\]"),
      (
          "reward_import",
          {"grpo_reward_functions": "no_such_module_q:f"},
          "'no_such_module_q:f' does not import",
      ),
      (
          "iterations",
          {"grpo_num_iterations": 2},
          "steps=3: must be a multiple of grpo_num_iterations=2",
      ),
      (
          "groups",
          {"global_batch_size": 6, "gradient_accumulation_steps": 1},
          "global_batch_size=6: must be divisible by grpo_num_generations",
      ),
      (
          # 2^20 rows of 16 positions of 16 layers' 2^16-wide heads: the
          # pages alone are 128 TiB, more than any host holds.
          "decode_pool",
          {
              "head_dim": 1 << 16,
              "num_layers": 16,
              "global_batch_size": 1 << 20,
          },
          r"^config.grpo_decode_slots=0: the paged decoder's page pool for "
          r"1048576 slots \(0: one per row\) of 1 pages of 16 positions "
          r"takes at least 131072.12 GiB",
      ),
  )
  def test_bad_options_are_one_line(self, overrides, message):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(trainer.ConfigError, message) as caught:
      workloads.run(_grpo_config(out, self.checkpoints, **overrides))
    self.assertNotIn("\n", str(caught.exception))
    self.assertFalse(os.path.exists(os.path.join(out, "grpo")))

  def test_failing_reward_stops_with_one_line(self):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        rewards.RewardError,
        r"^reward function __main__:always_fails on prompt 0 \(sample 0\) "
        r"raised ZeroDivisionError: no reward for 3 terms$",
    ):
      workloads.run(
          _grpo_config(
              out,
              self.checkpoints,
              grpo_reward_functions="__main__:always_fails",
          )
      )

  def test_failing_reward_keeps_the_last_completed_step(self):
    out = self.create_tempdir().full_path
    _CALLS[0] = 0
    with self.assertRaisesRegex(
        rewards.RewardError,
        r"^reward function __main__:fails_in_step_1 on prompt 0 \(sample 0\) "
        r"raised ValueError: step 1 is out of scope$",
    ):
      workloads.run(
          _grpo_config(
              out,
              self.checkpoints,
              grpo_reward_functions="__main__:fails_in_step_1",
          )
      )
    # Step 0 completed; its checkpoint (step 1) was written before the stop.
    self.assertEqual(
        sorted(os.listdir(os.path.join(out, "grpo", "checkpoints"))), ["1"]
    )


if __name__ == "__main__":
  absltest.main()
