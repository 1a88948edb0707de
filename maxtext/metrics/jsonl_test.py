"""Tests for maxtext.metrics.jsonl, on real files in temp dirs."""

import json
import math
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.metrics import jsonl


def _reject_constant(constant):
  raise AssertionError(f"bare JSON constant {constant}")


class JsonlTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.path = os.path.join(self.dir, jsonl.METRICS_FILENAME)

  def write(self, text):
    with open(self.path, "w", encoding="utf-8") as f:
      f.write(text)

  def write_records(self, records):
    self.write(
        "".join(
            jsonl.encode_record(step, kind, scalars) + "\n"
            for step, kind, scalars in records
        )
    )

  def test_no_training_stack_is_loaded(self):
    # Tools read metrics without paying for JAX or TensorBoard.
    for module in ("jax", "tensorboardX"):
      self.assertNotIn(module, sys.modules)

  def test_encode_puts_step_and_kind_first(self):
    line = jsonl.encode_record(3, jsonl.TRAIN, {"loss": 2.5, "step_skipped": 0})
    self.assertEqual(
        line, '{"step": 3, "kind": "train", "loss": 2.5, "step_skipped": 0}'
    )

  def test_non_finite_values_round_trip_as_strings(self):
    self.write_records(
        [
            (
                0,
                "train",
                {"loss": float("nan"), "a": math.inf, "b": -math.inf, "c": 1.5},
            )
        ]
    )
    with open(self.path, encoding="utf-8") as f:
      raw = json.loads(f.readline(), parse_constant=_reject_constant)
    self.assertEqual(
        (raw["loss"], raw["a"], raw["b"], raw["c"]),
        ("NaN", "Infinity", "-Infinity", 1.5),
    )
    record = jsonl.read_jsonl(self.path)[0]
    self.assertTrue(math.isnan(record["loss"]))
    self.assertEqual(
        (record["a"], record["b"], record["c"]), (math.inf, -math.inf, 1.5)
    )

  def test_read_keeps_file_order_and_types(self):
    records = [
        (0, "train", {"loss": 3.0, "step_skipped": 0}),
        (0, "eval", {"eval_loss": 2.5}),
        (1, "train", {"loss": 2.0, "step_skipped": 1}),
    ]
    self.write_records(records)
    got = jsonl.read_jsonl(self.path)
    self.assertEqual(got, [{"step": s, "kind": k, **v} for s, k, v in records])
    self.assertIsInstance(got[2]["step_skipped"], int)

  @parameterized.named_parameters(
      ("bool_step", True, "train", {}, TypeError, "step must be an int"),
      ("float_step", 1.0, "train", {}, TypeError, "step"),
      ("negative_step", -1, "train", {}, ValueError, "step must be >= 0"),
      ("bad_kind", 0, "test", {}, ValueError, "kind must be one of"),
      ("reserved_name", 0, "train", {"kind": 1}, ValueError, "'kind'"),
  )
  def test_encode_rejects_bad_records(self, step, kind, scalars, error, regex):
    with self.assertRaisesRegex(error, regex):
      jsonl.encode_record(step, kind, scalars)

  def test_encode_accepts_numpy_int_step(self):
    self.assertStartsWith(
        jsonl.encode_record(np.int64(2), "eval", {}), '{"step": 2,'
    )

  def test_torn_last_line_is_dropped_with_a_warning(self):
    self.write('{"step": 0, "kind": "train", "loss": 1.0}\n{"step": 1, "ki')
    with self.assertLogs(level="WARNING") as logs:
      records = jsonl.read_jsonl(self.path)
    self.assertEqual(records, [{"step": 0, "kind": "train", "loss": 1.0}])
    self.assertIn("torn last line", logs.output[0])

  def test_complete_last_line_without_newline_is_kept(self):
    self.write('{"step": 0, "kind": "train", "loss": 1.0}')
    self.assertEqual(
        jsonl.read_jsonl(self.path), [{"step": 0, "kind": "train", "loss": 1.0}]
    )

  @parameterized.named_parameters(
      ("not_json", "not json", "metrics.jsonl:2: not valid JSON"),
      ("not_object", "[1, 2]", "metrics.jsonl:2: expected an object"),
      ("bool_step", '{"step": true, "kind": "train"}', "metrics.jsonl:2"),
      ("no_kind", '{"step": 1}', "metrics.jsonl:2"),
      ("unknown_kind", '{"step": 1, "kind": "test"}', "metrics.jsonl:2"),
  )
  def test_bad_middle_line_names_path_and_line(self, line, regex):
    self.write(
        '{"step": 0, "kind": "train"}\n'
        + line
        + '\n{"step": 1, "kind": "eval"}\n'
    )
    with self.assertRaisesRegex(ValueError, regex):
      jsonl.read_jsonl(self.path)

  def test_read_missing_file_names_path(self):
    with self.assertRaisesRegex(FileNotFoundError, "absent.jsonl"):
      jsonl.read_jsonl(os.path.join(self.dir, "absent.jsonl"))

  def test_truncate_keeps_earlier_steps_and_spellings(self):
    self.write_records(
        [
            (0, "train", {"loss": float("nan")}),
            (1, "train", {"loss": 2.0}),
            (1, "eval", {"eval_loss": 2.5}),
            (2, "train", {"loss": 1.0}),
        ]
    )
    self.assertEqual(jsonl.truncate_jsonl(self.path, 2), 3)
    with open(self.path, encoding="utf-8") as f:
      text = f.read()
    self.assertEqual(
        text.splitlines()[0], '{"step": 0, "kind": "train", "loss": "NaN"}'
    )
    self.assertEqual(
        [(r["step"], r["kind"]) for r in jsonl.read_jsonl(self.path)],
        [(0, "train"), (1, "train"), (1, "eval")],
    )
    # No temporary file is left beside it.
    self.assertEqual(os.listdir(self.dir), [jsonl.METRICS_FILENAME])

  def test_truncate_missing_file_stays_missing(self):
    path = os.path.join(self.dir, "absent.jsonl")
    self.assertEqual(jsonl.truncate_jsonl(path, 3), 0)
    self.assertFalse(os.path.exists(path))

  def test_truncate_malformed_file_leaves_it_untouched(self):
    text = (
        '{"step": 0, "kind": "train"}\nnot json\n'
        '{"step": 1, "kind": "eval"}\n'
    )
    self.write(text)
    with self.assertRaisesRegex(ValueError, "metrics.jsonl:2"):
      jsonl.truncate_jsonl(self.path, 1)
    with open(self.path, encoding="utf-8") as f:
      self.assertEqual(f.read(), text)

  @parameterized.named_parameters(
      ("bool", True, TypeError),
      ("negative", -1, ValueError),
      ("float", 1.5, TypeError),
  )
  def test_truncate_rejects_bad_first_step(self, first_step, error):
    with self.assertRaisesRegex(error, "first_step"):
      jsonl.truncate_jsonl(self.path, first_step)

  @parameterized.named_parameters(
      ("train_loss", "train", "loss", "loss"),
      ("eval_loss", "eval", "loss", "eval_loss"),
      ("eval_time", "eval", "time", "eval_time"),
  )
  def test_metric_key(self, kind, metric, expected):
    self.assertEqual(jsonl.metric_key(kind, metric), expected)

  def test_metric_key_constants_agree(self):
    self.assertEqual(
        jsonl.metric_key(jsonl.EVAL, jsonl.LOSS_KEY), jsonl.EVAL_LOSS_KEY
    )
    self.assertEqual(
        jsonl.metric_key(jsonl.TRAIN, jsonl.LOSS_KEY), jsonl.LOSS_KEY
    )

  @parameterized.named_parameters(
      ("bad_kind", "test", "loss", "kind"),
      ("empty_metric", "eval", "", "metric"),
  )
  def test_metric_key_rejects(self, kind, metric, regex):
    with self.assertRaisesRegex(ValueError, regex):
      jsonl.metric_key(kind, metric)


if __name__ == "__main__":
  absltest.main()
