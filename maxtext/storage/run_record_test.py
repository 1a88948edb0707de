"""Tests for the run record: resume guard, attempts, seeds, finished runs."""

import datetime
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
import numpy as np

from maxtext.config import config_lib
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.configs import base
from maxtext.storage import run_record

_T0 = datetime.datetime(2026, 11, 30, 5, 0, 0, tzinfo=datetime.timezone.utc)


def _config(**overrides) -> ml_collections.ConfigDict:
  config = base.get_config()
  config.update(dict(dict(steps=60, warmup_steps=10, seed=1234), **overrides))
  config_lib.validate(config)
  return config


def _recorded(**overrides) -> dict:
  """A config as the run's record holds it: through JSON."""
  return json.loads(json.dumps(config_lib.to_json_dict(_config(**overrides))))


def _changed(value):
  """Another valid-typed value of a field's type."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    # x * 2 + 1 is x itself at -1 (eod_id's "none").
    return value * 2 + 1 if value != -1 else 0
  return value + "_x"


_REFUSED_FIELDS = sorted(
    set(base.get_config().keys()) - run_record.RESUMABLE_FIELDS
)


class CheckResumeTest(parameterized.TestCase):

  def test_same_config_has_no_changes(self):
    self.assertEqual(run_record.check_resume(_recorded(), _recorded()), [])

  def test_refused_fields_are_each_named_with_old_and_new_values(self):
    new = _recorded(emb_dim=256, weight_dtype="bfloat16", eval_interval=7)
    with self.assertRaises(run_record.ResumeRefusedError) as raised:
      run_record.check_resume(_recorded(), new, run_name="r1")
    lines = str(raised.exception).splitlines()
    self.assertRegex(
        lines[0],
        r"^Refusing to resume run 'r1': 2 field\(s\) "
        r"differ .* may not change on resume",
    )
    self.assertEqual(
        [l.strip() for l in lines[1:]],
        ["emb_dim: 128 -> 256", "weight_dtype: 'float32' -> 'bfloat16'"],
    )
    self.assertIsInstance(raised.exception, ValueError)

  @parameterized.parameters(*_REFUSED_FIELDS)
  def test_every_field_outside_the_allow_list_is_refused(self, key):
    recorded = _recorded()
    new = dict(recorded, **{key: _changed(recorded[key])})
    # lr_schedule_steps is judged by the schedule length it resolves to.
    pattern = rf"(?m)^  (learning-rate schedule length \()?{key}\b"
    with self.assertRaisesRegex(ValueError, pattern):
      run_record.check_resume(recorded, new)

  def test_allow_list_names_base_fields(self):
    self.assertLessEqual(
        run_record.RESUMABLE_FIELDS, set(base.get_config().keys())
    )
    for key in (
        "emb_dim",
        "weight_dtype",
        "seed",
        "lr_schedule_steps",
        "enable_mllog",
        "target_eval_loss",
        "global_batch_size",
        "data_shuffle_seed",
        "train_data_path",
    ):
      self.assertNotIn(key, run_record.RESUMABLE_FIELDS)

  def test_allowed_changes_are_listed_for_the_console(self):
    recorded = _recorded(lr_schedule_steps=60)
    new = _recorded(
        lr_schedule_steps=60,
        steps=80,
        eval_interval=5,
        log_period=1,
        resume=True,
        base_output_directory="/elsewhere",
        num_processes=0,
        gcs_sync_interval_seconds=5.0,
    )
    changes = run_record.check_resume(recorded, new)
    self.assertEqual(
        changes,
        [
            ("base_output_directory", "maxtext_runs", "/elsewhere"),
            ("eval_interval", 100, 5),
            ("gcs_sync_interval_seconds", 30.0, 5.0),
            ("log_period", 10, 1),
            ("num_processes", 1, 0),
            ("resume", False, True),
            ("steps", 60, 80),
        ],
    )
    text = run_record.describe_changes(changes)
    self.assertIn("Resuming with changed fields", text.splitlines()[0])
    self.assertIn("  steps: 60 -> 80", text.splitlines())
    self.assertEqual(run_record.describe_changes([]), "")

  def test_numbers_compare_by_value_and_bools_by_type(self):
    recorded = _recorded()
    self.assertEqual(
        run_record.check_resume(
            recorded, dict(recorded, gcs_request_timeout_seconds=60)
        ),
        [],
    )
    with self.assertRaisesRegex(ValueError, "enable_mllog: False -> 0"):
      run_record.check_resume(recorded, dict(recorded, enable_mllog=0))

  def test_seed_minus_one_reuses_the_recorded_seed(self):
    self.assertEqual(
        run_record.check_resume(_recorded(), _recorded(seed=-1)), []
    )
    with self.assertRaisesRegex(ValueError, r"seed: 1234 -> 5"):
      run_record.check_resume(_recorded(), _recorded(seed=5))

  def test_steps_change_with_schedule_following_steps_is_refused(self):
    # lr_schedule_steps = 0: the schedule is `steps` long, so a new `steps`
    # would bend the learning rate of the steps still to run.
    with self.assertRaises(ValueError) as raised:
      run_record.check_resume(_recorded(), _recorded(steps=40))
    message = str(raised.exception)
    self.assertIn("1 field(s)", message.splitlines()[0])
    self.assertIn(
        "learning-rate schedule length (lr_schedule_steps, 0 = "
        "steps): 60 -> 40",
        message,
    )
    self.assertIn("set lr_schedule_steps=60", message)

  def test_steps_may_change_once_the_schedule_length_is_pinned(self):
    changes = run_record.check_resume(
        _recorded(), _recorded(steps=100, lr_schedule_steps=60)
    )
    self.assertEqual(
        changes, [("lr_schedule_steps", 0, 60), ("steps", 60, 100)]
    )
    changes = run_record.check_resume(
        _recorded(lr_schedule_steps=60),
        _recorded(steps=30, lr_schedule_steps=60),
    )
    self.assertEqual(changes, [("steps", 60, 30)])

  def test_changed_schedule_length_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"60 -> 70 .*lr_schedule_steps=60"):
      run_record.check_resume(
          _recorded(lr_schedule_steps=60),
          _recorded(lr_schedule_steps=70, steps=70),
      )

  def test_field_added_since_the_run_started(self):
    recorded = _recorded()
    del recorded["eval_steps"], recorded["emb_dim"]
    self.assertEqual(
        run_record.check_resume(recorded, _recorded()),
        [("emb_dim", "<absent>", 128), ("eval_steps", "<absent>", 4)],
    )
    with self.assertRaisesRegex(
        ValueError, r"emb_dim: <absent> \(base default 128\) -> 64"
    ):
      run_record.check_resume(recorded, _recorded(emb_dim=64))

  def test_field_removed_since_the_run_started_is_listed(self):
    recorded = dict(_recorded(), old_knob=3)
    self.assertEqual(
        run_record.check_resume(recorded, _recorded()),
        [("old_knob", 3, "<absent>")],
    )

  def test_bad_arguments(self):
    with self.assertRaisesRegex(TypeError, "recorded"):
      run_record.check_resume(None, _recorded())
    with self.assertRaisesRegex(TypeError, "new"):
      run_record.check_resume(_recorded(), 5)


class RecordAttemptTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = self.create_tempdir().full_path
    self.config_json = os.path.join(self.run_dir, "config.json")
    self.history = os.path.join(self.run_dir, "config_history.jsonl")

  def _history(self) -> list[dict]:
    with open(self.history, encoding="utf-8") as f:
      return [json.loads(line) for line in f]

  def test_new_run_has_no_record(self):
    self.assertIsNone(run_record.load_recorded_config(self.run_dir))

  def test_first_attempt_writes_config_json_and_history(self):
    number = run_record.record_attempt(
        self.run_dir,
        _recorded(),
        {"run_name": "r", "git_revision": "abc"},
        0,
        now=_T0,
    )
    self.assertEqual(number, 1)
    with open(self.config_json, encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(document["config"]["seed"], 1234)
    self.assertEqual(
        document["provenance"],
        {"run_name": "r", "git_revision": "abc", "start_step": 0},
    )
    [attempt] = self._history()
    self.assertEqual(attempt["attempt"], 1)
    self.assertEqual(attempt["time_utc"], "2026-11-30T05:00:00+00:00")
    self.assertEqual(attempt["start_step"], 0)
    self.assertEqual(attempt["config"], document["config"])
    self.assertEqual(attempt["provenance"]["git_revision"], "abc")
    self.assertEqual(
        run_record.load_recorded_config(self.run_dir), document["config"]
    )

  def test_config_json_stays_the_first_while_history_grows(self):
    run_record.record_attempt(self.run_dir, _recorded(), {"n": 1}, 0, now=_T0)
    with open(self.config_json, "rb") as f:
      first = f.read()
    for number, steps in ((2, 80), (3, 90)):
      later = _T0 + datetime.timedelta(hours=number)
      self.assertEqual(
          run_record.record_attempt(
              self.run_dir,
              _recorded(steps=steps),
              {"n": number},
              10 * number,
              now=later,
          ),
          number,
      )
      with open(self.config_json, "rb") as f:
        self.assertEqual(f.read(), first)
    history = self._history()
    self.assertEqual([a["attempt"] for a in history], [1, 2, 3])
    self.assertEqual([a["start_step"] for a in history], [0, 20, 30])
    self.assertEqual([a["config"]["steps"] for a in history], [60, 80, 90])
    self.assertEqual(
        [a["provenance"] for a in history], [{"n": 1}, {"n": 2}, {"n": 3}]
    )
    # The comparison of the next attempt is with the newest one.
    self.assertEqual(run_record.load_recorded_config(self.run_dir)["steps"], 90)

  def test_attempt_cut_short_mid_append_is_skipped(self):
    run_record.record_attempt(self.run_dir, _recorded(), {}, 0, now=_T0)
    with open(self.history, "a", encoding="utf-8") as f:
      f.write('{"attempt": 2, "conf')  # The writer died here.
    self.assertEqual(run_record.load_recorded_config(self.run_dir)["steps"], 60)
    self.assertEqual(
        run_record.record_attempt(
            self.run_dir, _recorded(steps=70), {}, 5, now=_T0
        ),
        2,
    )
    with open(self.history, encoding="utf-8") as f:
      lines = f.read().splitlines()
    self.assertLen(lines, 3)
    self.assertEqual(json.loads(lines[2])["config"]["steps"], 70)
    self.assertEqual(run_record.load_recorded_config(self.run_dir)["steps"], 70)

  def test_lost_config_json_is_written_again_from_the_first_attempt(self):
    run_record.record_attempt(self.run_dir, _recorded(), {"n": 1}, 0, now=_T0)
    os.remove(self.config_json)
    run_record.record_attempt(
        self.run_dir, _recorded(steps=70), {"n": 2}, 9, now=_T0
    )
    with open(self.config_json, encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(document["config"]["steps"], 60)
    self.assertEqual(document["provenance"], {"n": 1, "start_step": 0})

  def test_run_recorded_before_the_history_existed(self):
    with open(self.config_json, "w", encoding="utf-8") as f:
      json.dump({"config": _recorded(steps=50), "provenance": {}}, f)
    self.assertEqual(run_record.load_recorded_config(self.run_dir)["steps"], 50)

  def test_unreadable_config_json_is_an_error_naming_it(self):
    with open(self.config_json, "w", encoding="utf-8") as f:
      f.write("{not json")
    with self.assertRaisesRegex(ValueError, "config.json is not valid JSON"):
      run_record.load_recorded_config(self.run_dir)
    with open(self.config_json, "w", encoding="utf-8") as f:
      json.dump({"provenance": {}}, f)
    with self.assertRaisesRegex(ValueError, "holds no 'config'"):
      run_record.load_recorded_config(self.run_dir)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "start_step"):
      run_record.record_attempt(self.run_dir, _recorded(), {}, -1)
    with self.assertRaisesRegex(TypeError, "provenance"):
      run_record.record_attempt(self.run_dir, _recorded(), None, 0)
    self.assertFalse(os.path.exists(self.history))


class SeedTest(absltest.TestCase):

  def test_minus_one_draws_a_different_seed_each_time(self):
    config = _config(seed=-1)
    seeds = [run_record.resolve_seed(config.seed, None) for _ in range(2)]
    self.assertNotEqual(seeds[0], seeds[1])
    for seed in seeds:
      self.assertBetween(seed, 0, 2**run_record.SEED_BITS - 1)
      config_lib.validate(config_lib.with_seed(config, seed))

  def test_drawn_seeds_use_all_bits(self):
    seeds = [run_record.new_seed() for _ in range(64)]
    self.assertLess(max(seeds), 2**run_record.SEED_BITS)
    self.assertGreaterEqual(max(seeds), 2 ** (run_record.SEED_BITS - 1))

  def test_given_seed_is_kept(self):
    self.assertEqual(run_record.resolve_seed(7, None), 7)

  def test_resume_reuses_the_recorded_seed(self):
    recorded = _recorded(seed=987654321)
    for seed in (-1, 987654321):
      self.assertEqual(
          run_record.resolve_seed(seed, recorded, draw=lambda: 5),
          987654321,
      )
    with self.assertRaisesRegex(
        ValueError, "config.seed=3 differs .*987654321"
    ):
      run_record.resolve_seed(3, recorded)

  def test_unresolved_recorded_seed_is_an_error(self):
    with self.assertRaisesRegex(ValueError, "recorded config has seed=-1"):
      run_record.resolve_seed(-1, _recorded(seed=-1))

  def test_bad_draw_is_an_error(self):
    with self.assertRaisesRegex(ValueError, "drawn seed"):
      run_record.resolve_seed(-1, None, draw=lambda: 2**31)

  def test_resumed_run_records_and_reads_the_same_seed(self):
    # First attempt: seed -1 is drawn and recorded; a resume with seed -1
    # passes the guard, gets the recorded seed and so the same data.
    run_dir = self.create_tempdir().full_path
    first = _config(seed=-1)
    first = config_lib.with_seed(
        first, run_record.resolve_seed(first.seed, None)
    )
    run_record.record_attempt(run_dir, config_lib.to_json_dict(first), {}, 0)
    recorded = run_record.load_recorded_config(run_dir)
    self.assertEqual(recorded["seed"], first.seed)

    again = _config(seed=-1, resume=True)
    self.assertEqual(
        run_record.check_resume(recorded, config_lib.to_json_dict(again)),
        [("resume", False, True)],
    )
    again = config_lib.with_seed(
        again, run_record.resolve_seed(again.seed, recorded)
    )
    self.assertEqual(again.seed, first.seed)
    batches = [
        builtin_datasets.SyntheticDataset(
            data_config.DataConfig.from_config(c)
        ).get_batch(3)
        for c in (first, again)
    ]
    np.testing.assert_array_equal(batches[0]["inputs"], batches[1]["inputs"])
    other = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(
            config_lib.with_seed(first, first.seed + 1)
        )
    )
    self.assertFalse(
        np.array_equal(other.get_batch(3)["inputs"], batches[0]["inputs"])
    )


class FinishedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("no_checkpoint", None, 40),
      ("steps_left", 39, 40),
      ("fresh", 0, 1),
  )
  def test_steps_left_to_train(self, latest, steps):
    self.assertIsNone(run_record.finished_message("r", latest, steps))

  @parameterized.named_parameters(
      ("past_the_budget", 60, 40),
      ("at_the_budget", 60, 60),
  )
  def test_finished_run_says_so(self, latest, steps):
    message = run_record.finished_message("r1", latest, steps)
    self.assertStartsWith(
        message,
        f"Run 'r1' already completed step {latest} (steps={steps}); "
        "nothing to do.",
    )

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "steps"):
      run_record.finished_message("r", 3, 0)
    with self.assertRaisesRegex(ValueError, "latest_checkpoint_step"):
      run_record.finished_message("r", -1, 5)


if __name__ == "__main__":
  absltest.main()
