"""reference_pin: the fingerprint, the pin, and the refused change."""

import json
import os

from absl.testing import absltest
import jax.numpy as jnp

from maxtext.run import reference_pin


def _params(value=0.5):
  return {
      "a": jnp.full((3, 4), value, jnp.float32),
      "b": {"c": jnp.arange(6, dtype=jnp.bfloat16)},
  }


class ReferencePinTest(absltest.TestCase):

  def test_fingerprint_follows_every_value(self):
    base = reference_pin.fingerprint(_params())
    self.assertEqual(base, reference_pin.fingerprint(_params()))
    one = _params()
    one["a"] = one["a"].at[2, 3].set(0.5000001)
    self.assertNotEqual(base, reference_pin.fingerprint(one))
    # The same values in other places: a different fingerprint.
    swapped = _params()
    swapped["b"]["c"] = swapped["b"]["c"][::-1]
    self.assertNotEqual(base, reference_pin.fingerprint(swapped))
    renamed = {"x": _params()["a"], "b": _params()["b"]}
    self.assertNotEqual(base, reference_pin.fingerprint(renamed))

  def test_first_attempt_pins_and_a_change_is_refused_unless_allowed(self):
    run_dir = self.create_tempdir().full_path
    first = {"load_parameters_path": "/c", "step": 40, "fingerprint": "aa"}
    self.assertIsNone(
        reference_pin.check_and_record(run_dir, first, allow_change=False)
    )
    path = os.path.join(run_dir, reference_pin.PIN_FILE)
    with open(path, encoding="utf-8") as f:
      self.assertEqual(json.load(f), {"pinned": first, "changes": []})
    # The same reference again: nothing to say.
    self.assertIsNone(
        reference_pin.check_and_record(run_dir, first, allow_change=False)
    )
    newer = dict(first, step=50, fingerprint="bb")
    with self.assertRaisesRegex(
        ValueError,
        r"^the KL reference changed: load_parameters_path='/c' now reads "
        r"step 50 \(fingerprint bb\), the run pinned step 40 \(fingerprint "
        r"aa\) at its start; .* grpo_allow_reference_change=True",
    ):
      reference_pin.check_and_record(run_dir, newer, allow_change=False)
    with open(path, encoding="utf-8") as f:
      self.assertEqual(json.load(f)["pinned"], first)
    # Allowed: recorded, and the new reference is the pin from then on.
    said = reference_pin.check_and_record(run_dir, newer, allow_change=True)
    self.assertIn("allowed by grpo_allow_reference_change", said)
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    self.assertEqual(record["pinned"], newer)
    self.assertLen(record["changes"], 1)
    self.assertEqual(record["changes"][0]["from"], first)
    self.assertIsNone(
        reference_pin.check_and_record(run_dir, newer, allow_change=False)
    )
    # Same step, other values (a rewritten checkpoint): refused too.
    with self.assertRaisesRegex(ValueError, "fingerprint cc"):
      reference_pin.check_and_record(
          run_dir, dict(newer, fingerprint="cc"), allow_change=False
      )


if __name__ == "__main__":
  absltest.main()
