"""What the checkpoint conversions' logit tests share (test-only).

An imported checkpoint restored onto one device (what `load_parameters_path`
reads), the comparison of two sets of logits relative to the expected
ones' scale, so near-zero logits cannot pass by being near zero, the
bit-for-bit comparison of an export's tensors with the original's, and the
check that an import refuses a config.json it does not implement.
"""

import json
import os

from absl import logging
import jax
import numpy as np

from maxtext.hf import importer
from maxtext.hf import safetensors_io
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.storage import checkpointing

# |ours - transformers'| <= RELATIVE * max |transformers' logits|.
RELATIVE = 1e-5


def restore_on_one_device(path: str, config: model_config.ModelConfig):
  """The parameters of the checkpoint at `path`, on the first device."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpointing.restore_params_only(
      path, transformer.abstract_params(config, device)
  )


def assert_close_to_scale(
    test, actual, expected, relative: float = RELATIVE
) -> None:
  """Fails `test` unless max |actual - expected| <= `relative` x the
  expected logits' largest magnitude, which must exceed 1 (peaked
  logits)."""
  scale = float(np.abs(expected).max())
  test.assertGreater(scale, 1.0)  # Peaked logits, not a flat near-zero.
  diff = float(np.abs(actual - expected).max())
  logging.info("logits: max |diff| %.3g, scale %.3g", diff, scale)
  test.assertLessEqual(
      diff, relative * scale, f"max |diff| {diff}, scale {scale}"
  )


def assert_same_tensors(test, original_dir: str, exported_dir: str) -> None:
  """Fails `test` unless `exported_dir`'s model.safetensors holds the
  tensors of `original_dir`'s, same names, float32, equal bit for bit."""

  def open_file(directory):
    return safetensors_io.SafetensorsFile(
        os.path.join(directory, "model.safetensors")
    )

  original, exported = open_file(original_dir), open_file(exported_dir)
  test.assertEqual(sorted(exported.names()), sorted(original.names()))
  for name in original.names():
    ours = np.asarray(exported.array(name))
    test.assertEqual(ours.dtype, np.float32, name)
    np.testing.assert_array_equal(
        ours, np.asarray(original.array(name)), err_msg=name
    )


def assert_import_refuses(test, hf_dir: str, change: dict, message: str):
  """Rewrites hf_dir's config.json with the keys of `change` and checks
  that the import refuses it in one line matching `message`, writing
  nothing."""
  path = os.path.join(hf_dir, "config.json")
  with open(path, encoding="utf-8") as f:
    document = {**json.load(f), **change}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(document, f)
  out = os.path.join(os.path.dirname(hf_dir), "refused")
  with test.assertRaisesRegex(importer.ConversionError, message) as raised:
    importer.import_checkpoint(hf_dir, out, log=lambda s: None)
  test.assertNotIn("\n", str(raised.exception))
  test.assertFalse(os.path.exists(out))
