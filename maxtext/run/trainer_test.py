"""End-to-end tests of `trainer.run`, in-process, on tiny real runs.

Every run trains the shrunk default config of `testing.tiny_configs` (a 1-layer
model, 16-token sequences, a few steps) into a temp dir and is checked through
the files it leaves: config.json, metrics.jsonl, TensorBoard events, orbax
checkpoints (read back with `maxtext.storage.checkpointing`) and the MLPerf
log. Runs share a persistent compilation cache, so each one after the first
mostly pays for its steps.
"""

import functools
import glob
import json
import math
import os

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from maxtext import workloads
from maxtext.storage import checkpointing
from maxtext.storage import run_lock
from maxtext.config import config_lib
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.metrics import jsonl
from maxtext.model import transformer
from maxtext.config import optimizer as optimizer_lib
from maxtext.runtime import preemption
from maxtext.run import trainer
from maxtext.listeners import interface as listener_interface
from testing import nan_params
from testing import run_layout
from testing import tiny_configs

# The reference run: 6 steps, eval after steps 3 and 6, checkpoints at 3 and 6.
_STEPS = 6
_HALF = 3


def setUpModule():
  # Small functions (optimizer init, zeros) compile in well under the default
  # 1 s threshold; caching them too makes every run after the first cheap.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def _config(output_dir, run_name, **overrides):
  # lr_schedule_steps is fixed so that a run cut at _HALF steps and resumed to
  # _STEPS follows the same schedule as the reference run.
  overrides.setdefault("lr_schedule_steps", _STEPS)
  return tiny_configs.tiny_config(output_dir, run_name=run_name, **overrides)


def _steps(records, kind):
  return [r["step"] for r in records if r["kind"] == kind]


def _mllog_events(path):
  events = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.startswith(":::MLLOG "):
        events.append(json.loads(line[len(":::MLLOG ") :]))
  return events


def _run_stop(path):
  """The metadata of the MLPerf log's only run_stop event."""
  stops = [e for e in _mllog_events(path) if e["key"] == "run_stop"]
  if len(stops) != 1:
    raise AssertionError(f"{path}: expected one run_stop, got {stops}")
  return stops[0]["metadata"]


def _run_stop_status(path):
  return _run_stop(path)["status"]


def _single_device(tree):
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
  )


def _abstract_params(config):
  return jax.eval_shape(
      functools.partial(transformer.init_params, config), jax.random.PRNGKey(0)
  )


def _restore_state(config, run_dir, step):
  """The train state of checkpoint `step` of a run, read from its files."""
  params = _abstract_params(config)
  settings = optimizer_lib.OptimizerConfig.from_config(config)
  opt = optimizer_lib.make_optimizer(
      settings, optimizer_lib.make_schedule(settings)
  )
  abstract = {
      "params": params,
      "opt_state": jax.eval_shape(opt.init, params),
      "step": jax.ShapeDtypeStruct((), np.int64),
  }
  with checkpointing.Checkpointer(
      os.path.join(run_dir, "checkpoints"), save_period=1, max_to_keep=0
  ) as ckpt:
    state, metadata = ckpt.restore(step, _single_device(abstract))
  return state, metadata


def _checkpoint_steps(run_dir):
  with checkpointing.Checkpointer(
      os.path.join(run_dir, "checkpoints"), save_period=1, max_to_keep=0
  ) as ckpt:
    return ckpt.all_steps()


def _optimizer_counts(opt_state):
  """The step counters inside an optax state (one per counting transform)."""
  return [
      int(np.asarray(leaf))
      for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
      if "count" in jax.tree_util.keystr(path)
  ]


class _StopAt(listener_interface.RunListener):
  """Requests a stop as step `step` (0-based) starts: the run stops after it."""

  name = "stop_at"

  def __init__(self, stop, step, reason="test"):
    self._stop, self._step, self._reason = stop, step, reason

  def on_step_start(self, step):
    if step == self._step:
      self._stop.request(self._reason)


class _Events(listener_interface.RunListener):
  """Notes the order of step starts and step records, and the step times."""

  name = "events"

  def __init__(self):
    self.seen = []
    self.step_times = []

  def on_step_start(self, step):
    self.seen.append(("start", step))

  def on_step(self, record):
    self.seen.append(("step", record.step))
    self.step_times.append(record.step_time)


class TrainerTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("trainer_test_")
    # The uninterrupted reference run; it also traces step 1 with the profiler.
    cls.ref_config = _config(
        cls.root,
        "reference",
        steps=_STEPS,
        profiler_steps=1,
        profiler_start_step=1,
    )
    cls.ref = workloads.run(cls.ref_config)
    cls.ref_records = run_layout.untimed_records(cls.ref.run_dir)
    cls.ref_state, _ = _restore_state(cls.ref_config, cls.ref.run_dir, _STEPS)

  def assert_matches_reference(self, result, config):
    """The run's metrics and final state equal the reference run's."""
    self.assertEqual(result.final_step, _STEPS)
    self.assertEqual(
        run_layout.untimed_records(result.run_dir), self.ref_records
    )
    state, metadata = _restore_state(config, result.run_dir, _STEPS)
    chex.assert_trees_all_close(state, self.ref_state, rtol=1e-6, atol=1e-7)
    self.assertEqual(
        metadata["samples_count"], _STEPS * config.global_batch_size
    )

  def test_run_directory_layout(self):
    self.assertEqual(self.ref.status, trainer.RunOutcome.COMPLETED)
    self.assertEqual((self.ref.start_step, self.ref.final_step), (0, _STEPS))
    run_dir = os.path.join(self.root, "reference")
    self.assertEqual(self.ref.run_dir, run_dir)

    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(
        document["config"], config_lib.to_json_dict(self.ref_config)
    )
    provenance = document["provenance"]
    for key in (
        "git_revision",
        "requirements_lock",
        "jax_version",
        "devices",
        "device_count",
        "jax_backend",
    ):
      self.assertIn(key, provenance)
    self.assertEqual(provenance["jax_version"], jax.__version__)
    self.assertEqual(provenance["run_name"], "reference")
    self.assertEqual(provenance["start_step"], 0)

    records = jsonl.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    self.assertEqual(_steps(records, "train"), list(range(_STEPS)))
    self.assertEqual(_steps(records, "eval"), [_HALF - 1, _STEPS - 1])
    train = [r for r in records if r["kind"] == "train"]
    for key in (
        "loss",
        "learning_rate",
        "grad_norm",
        "step_skipped",
        "accuracy",
        "step_time_s",
        "data_wait_s",
        "tokens_per_s",
    ):
      self.assertIn(key, train[0])
    # The data set's reads are part of the step's time.
    self.assertTrue(
        all(0 <= r["data_wait_s"] <= r["step_time_s"] for r in train)
    )
    self.assertTrue(all(r["step_skipped"] == 0 for r in train))
    for r in records:
      if r["kind"] == "eval":
        self.assertTrue(math.isfinite(r["eval_loss"]))

    self.assertNotEmpty(
        glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
    )
    self.assertEqual(_checkpoint_steps(run_dir), [_HALF, _STEPS])
    # No target: the MLPerf log (on in the default config) ends aborted.
    self.assertEqual(
        _run_stop_status(os.path.join(run_dir, "mllog.log")), "aborted"
    )

  def test_loss_falls(self):
    train = [r for r in self.ref_records if r["kind"] == "train"]
    evals = [r["eval_loss"] for r in self.ref_records if r["kind"] == "eval"]
    # The first step sees the initial model: no better than uniform guessing
    # over the 32-token vocabulary (ln 32 = 3.47 nats per token).
    self.assertGreater(train[0]["loss"], math.log(32) - 0.1)
    self.assertLess(train[-1]["loss"], train[0]["loss"] - 0.5)
    self.assertLess(evals[-1], evals[0])
    self.assertAlmostEqual(
        self.ref.last_train_loss, train[-1]["loss"], places=5
    )
    self.assertAlmostEqual(self.ref.last_eval_loss, evals[-1], places=5)

  def test_profiler_writes_trace(self):
    traces = glob.glob(
        os.path.join(
            self.ref.run_dir,
            "tensorboard",
            "plugins",
            "profile",
            "*",
            "*.xplane.pb",
        )
    )
    self.assertLen(traces, 1)
    self.assertGreater(os.path.getsize(traces[0]), 0)

  def test_reaches_target(self):
    config = tiny_configs.tiny_config(
        self.root,
        run_name="target",
        steps=60,
        target_eval_loss=1.0,
        checkpoint_period=0,
    )
    result = workloads.run(config)
    self.assertEqual(result.status, trainer.RunOutcome.SUCCESS)
    self.assertLess(result.final_step, 60)
    self.assertLessEqual(result.last_eval_loss, 1.0)
    self.assertEqual(result.final_step % config.eval_interval, 0)
    records = run_layout.untimed_records(result.run_dir)
    self.assertEqual(_steps(records, "train"), list(range(result.final_step)))
    self.assertEqual(records[-1]["kind"], "eval")
    self.assertEqual(_checkpoint_steps(result.run_dir), [result.final_step])
    self.assertEqual(
        _run_stop_status(os.path.join(result.run_dir, "mllog.log")), "success"
    )

  def test_first_eval_samples_places_the_first_eval(self):
    # First eval after 2 steps (16 samples of 8), then every 3 steps, and at
    # the end of the 7-step budget: after steps 2, 5 and 7.
    config = tiny_configs.tiny_config(
        self.root,
        run_name="first_eval",
        steps=7,
        first_eval_samples=16,
        checkpoint_period=0,
    )
    result = workloads.run(config)
    self.assertEqual(result.status, trainer.RunOutcome.COMPLETED)
    records = run_layout.untimed_records(result.run_dir)
    self.assertEqual(_steps(records, "eval"), [1, 4, 6])
    self.assertEqual(_steps(records, "train"), list(range(7)))
    # The MLPerf log's eval_accuracy counts the samples trained at each eval.
    evals = [
        e["metadata"]["samples_count"]
        for e in _mllog_events(os.path.join(result.run_dir, "mllog.log"))
        if e["key"] == "eval_accuracy"
    ]
    self.assertEqual(evals, [16, 40, 56])

  def test_resume_equals_uninterrupted(self):
    first = workloads.run(_config(self.root, "resumed", steps=_HALF))
    self.assertEqual(
        (first.status, first.final_step), (trainer.RunOutcome.COMPLETED, _HALF)
    )
    config = _config(self.root, "resumed", steps=_STEPS)
    second = workloads.run(config)
    self.assertEqual(second.status, trainer.RunOutcome.COMPLETED)
    self.assertEqual(second.start_step, _HALF)
    self.assert_matches_reference(second, config)
    # Each attempt has its own complete MLPerf log.
    self.assertTrue(os.path.exists(os.path.join(second.run_dir, "mllog.2.log")))

  def test_resume_falls_back_past_a_damaged_newest_checkpoint(self):
    # Stopped after step 5: checkpoints after steps 3 (periodic) and 5 (the
    # stop's); the newest then loses its metadata, as a bad copy would.
    stopped = _STEPS - 1
    stop = preemption.StopRequest(signals=())
    config = _config(self.root, "damaged", steps=_STEPS)
    first = workloads.run(
        config,
        stop_request=stop,
        extra_listeners=[_StopAt(stop, stopped - 1)],
    )
    self.assertEqual(_checkpoint_steps(first.run_dir), [_HALF, stopped])
    checkpoints = os.path.join(first.run_dir, "checkpoints")
    os.remove(os.path.join(checkpoints, str(stopped), "state", "_METADATA"))

    with self.assertLogs(level="WARNING") as logs:
      second = workloads.run(config)
    self.assertEqual(second.start_step, _HALF)
    self.assertRegex(
        "\n".join(logs.output),
        rf"step {stopped} could not be restored .*moved to "
        rf".*{stopped}\.corrupt-",
    )
    (aside,) = glob.glob(os.path.join(checkpoints, f"{stopped}.corrupt-*"))
    self.assertTrue(os.path.isdir(os.path.join(aside, "state")))
    # Retrained from step 3: the same records (no duplicates) and state as
    # the uninterrupted reference.
    self.assert_matches_reference(second, config)

  def test_second_run_on_a_locked_run_directory_is_refused(self):
    config = _config(self.root, "locked", steps=_STEPS)
    run_dir = os.path.join(self.root, "locked")
    with run_lock.acquire_run_locks([run_dir]):
      with self.assertRaisesRegex(
          run_lock.RunLockError,
          rf"^run directory {run_dir} is locked by another run \(host=",
      ):
        workloads.run(config)
    # Refused before any output: no MLPerf log, no metrics, no checkpoints.
    self.assertEqual(os.listdir(run_dir), [run_lock.LOCK_FILE_NAME])
    # Once released, the directory is free again.
    self.assertEqual(workloads.run(config).final_step, _STEPS)

  @parameterized.named_parameters(("none", 0), ("three_steps", 3))
  def test_warm_up_before_run_start_leaves_the_run_unchanged(self, steps):
    # The reference warms up one step (MLPerf logging is on in the default
    # config); none or three give the same records and the same state.
    config = _config(
        self.root,
        f"warmup_{steps}",
        steps=_STEPS,
        warmup_steps_before_run_start=steps,
    )
    result = workloads.run(config)
    self.assert_matches_reference(result, config)
    with open(os.path.join(result.run_dir, "mllog.log"), encoding="utf-8") as f:
      events = [
          json.loads(line[len(":::MLLOG ") :])
          for line in f
          if line.startswith(":::MLLOG ")
      ]
    keys = [e["key"] for e in events]
    if steps:
      self.assertLess(keys.index("warmup_time"), keys.index("init_stop"))
      self.assertGreater(events[keys.index("warmup_time")]["value"], 0)
    else:
      self.assertNotIn("warmup_time", keys)

  def test_rerun_of_a_finished_run_does_nothing(self):
    # The reference trained 6 steps; asking for 4 writes nothing new.
    before = sorted(os.listdir(self.ref.run_dir))
    config = _config(self.root, "reference", steps=_STEPS - 2)
    result = workloads.run(config)
    self.assertEqual(
        (result.status, result.start_step, result.final_step),
        (trainer.RunOutcome.COMPLETED, _STEPS, _STEPS),
    )
    self.assertEqual(sorted(os.listdir(self.ref.run_dir)), before)
    self.assertFalse(
        os.path.exists(os.path.join(self.ref.run_dir, "mllog.2.log"))
    )

  def test_resume_refuses_a_changed_model_and_keeps_the_first_config(self):
    first = workloads.run(_config(self.root, "guarded", steps=_HALF))
    with open(
        os.path.join(first.run_dir, "config.json"), encoding="utf-8"
    ) as f:
      recorded = f.read()
    changed = _config(
        self.root, "guarded", steps=_STEPS, emb_dim=64, weight_dtype="bfloat16"
    )
    with self.assertRaisesRegex(
        ValueError,
        r"(?s)^Refusing to resume run 'guarded'.*emb_dim: 32 -> 64.*"
        r"weight_dtype: 'float32' -> 'bfloat16'",
    ):
      workloads.run(changed)
    # Allowed changes resume; config.json keeps the first attempt.
    second = workloads.run(
        _config(self.root, "guarded", steps=_STEPS, log_period=2)
    )
    self.assertEqual(second.start_step, _HALF)
    with open(
        os.path.join(first.run_dir, "config.json"), encoding="utf-8"
    ) as f:
      self.assertEqual(f.read(), recorded)
    with open(
        os.path.join(first.run_dir, "config_history.jsonl"), encoding="utf-8"
    ) as f:
      attempts = [json.loads(line) for line in f]
    self.assertEqual(
        [(a["attempt"], a["start_step"]) for a in attempts],
        [(1, 0), (2, _HALF)],
    )
    self.assertEqual(attempts[1]["config"]["log_period"], 2)

  def test_seed_minus_one_draws_a_seed_that_the_record_keeps(self):
    seeds = []
    for name in ("drawn_a", "drawn_b"):
      result = workloads.run(_config(self.root, name, steps=_HALF, seed=-1))
      with open(
          os.path.join(result.run_dir, "config.json"), encoding="utf-8"
      ) as f:
        seeds.append(json.load(f)["config"]["seed"])
    self.assertNotEqual(seeds[0], seeds[1])
    self.assertGreaterEqual(min(seeds), 0)
    # A resume with seed=-1 reuses the recorded seed: it continues exactly
    # as a run that had that seed from the start.
    resumed = workloads.run(
        _config(self.root, "drawn_a", steps=_STEPS, seed=-1)
    )
    fixed = workloads.run(
        _config(self.root, "fixed_seed", steps=_STEPS, seed=seeds[0])
    )
    self.assertEqual(
        run_layout.untimed_records(resumed.run_dir),
        run_layout.untimed_records(fixed.run_dir),
    )

  def test_resume_without_checkpoint_is_an_error(self):
    config = _config(self.root, "nothing_to_resume", steps=_STEPS, resume=True)
    with self.assertRaisesRegex(ValueError, "resume=True.*no checkpoint"):
      workloads.run(config)

  def test_stop_request_checkpoints_and_resumes(self):
    stop_after = 2  # Not a multiple of checkpoint_period (3).
    stop = preemption.StopRequest(signals=())
    events = _Events()

    # The stop falls inside the profiler window (steps 1-3).
    result = workloads.run(
        _config(
            self.root,
            "stopped",
            steps=_STEPS,
            profiler_steps=3,
            profiler_start_step=1,
        ),
        stop_request=stop,
        extra_listeners=[events, _StopAt(stop, stop_after - 1, "test stop")],
    )
    self.assertEqual(result.status, trainer.RunOutcome.INTERRUPTED)
    self.assertEqual(result.stop_reason, "test stop")
    self.assertEqual(result.final_step, stop_after)
    # A plain step's record is written once the next step is dispatched; the
    # step that stops the run writes its own at once.
    self.assertEqual(
        events.seen, [("start", 0), ("start", 1), ("step", 0), ("step", 1)]
    )
    self.assertTrue(all(t >= 0.0 for t in events.step_times))
    self.assertEqual(_checkpoint_steps(result.run_dir), [stop_after])
    _, metadata = _restore_state(self.ref_config, result.run_dir, stop_after)
    self.assertEqual(metadata["step"], stop_after)
    # Complete files: every line whole, one train record per finished step.
    with open(
        os.path.join(result.run_dir, "metrics.jsonl"), encoding="utf-8"
    ) as f:
      self.assertTrue(f.read().endswith("\n"))
    self.assertEqual(
        _steps(run_layout.untimed_records(result.run_dir), "train"), [0, 1]
    )
    # Stopped before the first eval (every 3 steps): run_stop still counts
    # the samples trained, not the last count an eval reported.
    run_stop = _run_stop(os.path.join(result.run_dir, "mllog.log"))
    self.assertEqual(run_stop["status"], "aborted")
    self.assertEqual(run_stop["samples_count"], stop_after * 8)
    self.assertLen(
        glob.glob(
            os.path.join(
                result.run_dir,
                "tensorboard",
                "plugins",
                "profile",
                "*",
                "*.xplane.pb",
            )
        ),
        1,
    )

    config = _config(self.root, "stopped", steps=_STEPS)
    resumed = workloads.run(config)
    self.assertEqual(resumed.start_step, stop_after)
    self.assert_matches_reference(resumed, config)

  def test_load_parameters_path_uses_params_with_fresh_optimizer(self):
    source = os.path.join(self.ref.run_dir, "checkpoints", str(_STEPS))
    config = _config(
        self.root, "finetune", steps=_HALF, load_parameters_path=source
    )
    result = workloads.run(config)
    self.assertEqual((result.start_step, result.final_step), (0, _HALF))

    # Step 0 trained on the loaded parameters: its loss is theirs on batch 0.
    params = self.ref_state["params"]
    batch = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(config)
    ).get_batch(0)
    micro_losses = [
        transformer.loss_fn(
            params, jax.tree_util.tree_map(jnp.asarray, micro), config
        )[0]
        for micro in builtin_datasets.split_micro_batches(
            batch, config.gradient_accumulation_steps
        )
    ]
    train = [
        r
        for r in run_layout.untimed_records(result.run_dir)
        if r["kind"] == "train"
    ]
    self.assertAlmostEqual(
        train[0]["loss"], float(np.mean(micro_losses)), places=4
    )
    self.assertLess(train[0]["loss"], self.ref_records[0]["loss"] - 0.5)

    # The optimizer started fresh: its counters count this run's steps only.
    self.assertEqual(
        set(_optimizer_counts(self.ref_state["opt_state"])), {_STEPS}
    )
    state, _ = _restore_state(config, result.run_dir, _HALF)
    self.assertEqual(set(_optimizer_counts(state["opt_state"])), {_HALF})
    self.assertEqual(int(state["step"]), _HALF)

  def test_non_finite_gradients_skip_steps_then_stop(self):
    config = _config(
        self.root, "nan", steps=_STEPS, max_consecutive_skipped_steps=4
    )
    nan_dir = os.path.join(self.root, "nan_params")
    params = nan_params.write(config, nan_dir, seed=7)
    config.load_parameters_path = nan_dir

    with self.assertRaisesRegex(
        trainer.TrainingError,
        r"4 consecutive steps had non-finite gradients "
        r"\(max_consecutive_skipped_steps=4\); stopping at step 3\. "
        r"Checkpoint step 3 in \S+ holds the last good state; a resume "
        r"starts from it\.$",
    ):
      workloads.run(config)

    run_dir = os.path.join(self.root, "nan")
    train = [
        r for r in run_layout.untimed_records(run_dir) if r["kind"] == "train"
    ]
    self.assertEqual([r["step"] for r in train], [0, 1, 2, 3])
    for r in train:
      self.assertEqual(r["step_skipped"], 1)
      self.assertTrue(math.isnan(r["loss"]))
    # The checkpoint after step 3 holds the loaded parameters, untouched, and
    # an optimizer that never applied an update.
    state, _ = _restore_state(config, run_dir, _HALF)
    chex.assert_trees_all_equal(state["params"], jax.device_get(params))
    self.assertEqual(set(_optimizer_counts(state["opt_state"])), {0})
    run_stop = _run_stop(os.path.join(run_dir, "mllog.log"))
    self.assertEqual(run_stop["status"], "aborted")
    self.assertEqual(run_stop["samples_count"], 4 * config.global_batch_size)

  def test_failing_output_checkpoints_the_last_step_and_stops(self):

    class FullDisk(listener_interface.RunListener):
      """An extra output whose disk fills up when step 2's record comes."""

      name = "full_disk"

      def __init__(self):
        self.closed = False

      def on_step(self, record):
        if record.step == 2:
          raise OSError(28, "No space left on device", "/full/metrics")

      def close(self):
        self.closed = True

    output = FullDisk()
    config = _config(
        self.root,
        "full",
        steps=_STEPS,
        checkpoint_period=0,
        eval_interval=_STEPS,
    )
    with self.assertRaisesRegex(
        trainer.ListenerError,
        r"^output 'full_disk' failed \(on_step\): OSError: \[Errno 28\] No "
        r"space left on device: '/full/metrics'$",
    ):
      workloads.run(config, extra_listeners=[output])
    self.assertTrue(output.closed)
    run_dir = os.path.join(self.root, "full")
    # Step 2's record is written once step 3 is dispatched, before its
    # update: the checkpoint holds the 3 completed steps, as the reference.
    state, metadata = _restore_state(config, run_dir, _HALF)
    self.assertEqual(int(state["step"]), _HALF)
    self.assertEqual(
        metadata["samples_count"], _HALF * config.global_batch_size
    )
    ref_half, _ = _restore_state(self.ref_config, self.ref.run_dir, _HALF)
    chex.assert_trees_all_close(state, ref_half, rtol=1e-6, atol=1e-7)
    # The other outputs got step 2 and ended cleanly.
    self.assertEqual(
        [r["step"] for r in run_layout.untimed_records(run_dir)], [0, 1, 2]
    )
    run_stop = _run_stop(os.path.join(run_dir, "mllog.log"))
    self.assertEqual(run_stop["status"], "aborted")

  @parameterized.named_parameters(
      ("zero_steps", {"steps": 0}, ValueError, r"config\.steps=0"),
      (
          "batch_not_divisible",
          {"global_batch_size": 7},
          ValueError,
          r"config\.global_batch_size=7.*gradient_accumulation_steps=2",
      ),
      (
          "kv_heads_not_dividing",
          {"num_kv_heads": 3},
          ValueError,
          r"config\.num_kv_heads=3.*num_heads=2",
      ),
      (
          "escaping_run_name",
          {"run_name": "../escape"},
          ValueError,
          r"config\.run_name='\.\./escape'",
      ),
      (
          "warmup_past_schedule",
          {"warmup_steps": 9, "lr_schedule_steps": 0},
          ValueError,
          r"config\.warmup_steps=9",
      ),
      (
          "unknown_dataset",
          {"dataset_type": "c4"},
          ValueError,
          r"config\.dataset_type='c4'",
      ),
  )
  def test_bad_config_raises_before_any_work(self, overrides, error, message):
    output = os.path.join(self.root, "bad_" + self._testMethodName)
    config = _config(output, "bad", steps=_STEPS)
    config.update(overrides)
    with self.assertRaisesRegex(error, message):
      workloads.run(config)
    self.assertFalse(os.path.exists(output))


if __name__ == "__main__":
  absltest.main()
