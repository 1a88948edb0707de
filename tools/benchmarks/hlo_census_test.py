"""Tests for hlo_census on programs this process compiles (the CPU's HLO)."""

import contextlib
import io
import os
import tempfile

from absl.testing import absltest
from absl.testing import flagsaver
import jax
from jax import lax
import jax.numpy as jnp

from tools.benchmarks import hlo_census


def _compiled_text(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def _stack_loss(stack, x):
  """A scanned stack of float32 matrices applied in bfloat16, as the
  model's layers are."""

  def layer(h, w):
    return jnp.tanh(h @ w.astype(jnp.bfloat16)), None

  h, _ = lax.scan(layer, x, stack)
  return jnp.sum(h.astype(jnp.float32))


class CensusTest(absltest.TestCase):

  def test_scanned_products_count_once_per_trip(self):
    layers, rows, width = 3, 4, 16
    stack = jnp.zeros((layers, width, width))
    x = jnp.zeros((rows, width), jnp.bfloat16)
    found = hlo_census.census(_compiled_text(jax.grad(_stack_loss), stack, x))
    # The forward scan and its transpose, each once per layer.
    self.assertEqual([trips for _, trips in found.loops], [layers, layers])
    self.assertEqual(found.unknown_loops, ())
    # Forward h @ w, backward dh @ w^T and h^T @ dh per layer.
    self.assertEqual(found.total_flops(), 3 * 2 * rows * width**2 * layers)

  def test_stacked_gradient_is_written_one_layer_a_trip(self):
    layers, width = 3, 16
    stack = jnp.zeros((layers, width, width))
    x = jnp.zeros((4, width), jnp.bfloat16)
    found = hlo_census.census(_compiled_text(jax.grad(_stack_loss), stack, x))
    writes = [
        f
        for f in found.rooted("dynamic-update-slice")
        if f.shape == f"f32[{layers},{width},{width}]"
    ]
    self.assertLen(writes, 1)
    # One float32 layer of the gradient per trip, not the stack.
    self.assertEqual(writes[0].updated_bytes, width * width * 4)
    self.assertEqual(writes[0].runs, layers)

  def test_padded_convolution_counts_taps_inside_the_input(self):
    batch, channels, features, width, kernel = 2, 3, 4, 5, 3
    x = jnp.zeros((batch, channels, width))
    k = jnp.zeros((features, channels, kernel))

    def padded(x, k):
      return lax.conv_general_dilated(x, k, (1,), [(2, 2)])

    def strided(x, k):
      return lax.conv_general_dilated(x, k, (2,), [(0, 0)])

    # Padded by kernel - 1 each side: every (input, kernel) pair once.
    self.assertEqual(
        hlo_census.census(_compiled_text(padded, x, k)).total_flops(),
        2 * batch * features * channels * width * kernel,
    )
    # Stride 2 over 5 positions: windows at 0 and 2, 3 taps each.
    self.assertEqual(
        hlo_census.census(_compiled_text(strided, x, k)).total_flops(),
        2 * batch * features * channels * 2 * kernel,
    )

  def test_custom_calls_count_once_per_trip(self):
    trips = 3

    def repeated(a):
      def step(c, _):
        # A LAPACK custom call on the CPU, as a kernel is one on a TPU.
        return jnp.linalg.cholesky(c @ c.T + jnp.eye(4)), None

      return lax.scan(step, a, None, length=trips)[0]

    found = hlo_census.census(_compiled_text(repeated, jnp.eye(4)))
    self.assertEqual(sum(found.custom_call_runs().values()), trips)
    self.assertLen(found.custom_call_runs(), 1)

  def test_report_ends_with_the_counts(self):
    stack = jnp.zeros((2, 8, 8))
    x = jnp.zeros((4, 8), jnp.bfloat16)
    found = hlo_census.census(_compiled_text(jax.grad(_stack_loss), stack, x))
    lines = hlo_census.report(found, top=3)
    self.assertEqual(
        lines[0], "loops: " + ", ".join(f"{name} x2" for name, _ in found.loops)
    )
    self.assertRegex(
        lines[-1],
        r"^hlo_census: fusions=\d+ product_tflop=0\.000 dus_fusions=[1-9]\d* "
        r"dus_with_product=\d+ dus_update_mib=\d+\.\d "
        r"custom_call_runs=\d+$",
    )

  def test_text_without_entry_is_refused(self):
    with self.assertRaisesRegex(ValueError, "no ENTRY computation"):
      hlo_census.census("HloModule m\n")

  def test_unreadable_file_is_one_line_naming_it(self):
    path = os.path.join(tempfile.mkdtemp(), "missing.hlo.txt")
    stderr = io.StringIO()
    with flagsaver.flagsaver(hlo=path), contextlib.redirect_stderr(stderr):
      with self.assertRaises(SystemExit) as exited:
        hlo_census.main(["hlo_census"])
    self.assertEqual(exited.exception.code, 2)
    self.assertEqual(
        stderr.getvalue(),
        f"hlo_census: error: --hlo={path}: No such file or directory\n",
    )

  def test_text_that_is_not_hlo_is_one_line_naming_the_file(self):
    path = os.path.join(tempfile.mkdtemp(), "notes.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write("not a program\n")
    stderr = io.StringIO()
    with flagsaver.flagsaver(hlo=path), contextlib.redirect_stderr(stderr):
      with self.assertRaises(SystemExit):
        hlo_census.main(["hlo_census"])
    self.assertEqual(
        stderr.getvalue(),
        f"hlo_census: error: --hlo={path}: the HLO text has no ENTRY "
        "computation\n",
    )


if __name__ == "__main__":
  absltest.main()
