"""Tests of testing/compile_counter.py."""

import time

from absl.testing import absltest
import jax
import jax.numpy as jnp

from maxtext.listeners import interface
from testing import compile_counter


class CompileCounterTest(absltest.TestCase):

  def test_a_new_function_counts_a_second_call_does_not(self):
    compile_counter.install()
    compile_counter.install()  # A second install changes nothing.

    @jax.jit
    def f(x):
      return jnp.sin(x) * 3.0

    start = time.monotonic()
    f(jnp.ones(4)).block_until_ready()
    compiled = compile_counter.count_after(start)
    self.assertGreaterEqual(compiled, 1)
    again = time.monotonic()
    f(jnp.ones(4)).block_until_ready()
    self.assertEqual(compile_counter.count_after(again), 0)
    # A new shape is a new program.
    f(jnp.ones(5)).block_until_ready()
    self.assertGreaterEqual(compile_counter.count_after(again), 1)

  def test_backend_compiles_are_named(self):
    compile_counter.install()

    def named_program(x):
      return jnp.tanh(x) - 2.0

    f = jax.jit(named_program)
    start = time.monotonic()
    f(jnp.ones(7)).block_until_ready()
    f(jnp.ones(7)).block_until_ready()
    f(jnp.ones(8)).block_until_ready()
    compiled = compile_counter.backend_compiles_after(start)
    self.assertLen([n for n in compiled if "named_program" in n], 2)

  def test_run_start_counter_counts_from_run_start_on(self):
    counter = compile_counter.RunStartCounter()
    with self.assertRaisesRegex(RuntimeError, "no run_start yet"):
      counter.count()

    @jax.jit
    def f(x):
      return jnp.cos(x) + 1.0

    # Compiled before run_start: not counted.
    f(jnp.ones(3)).block_until_ready()
    counter.on_run_start(interface.RunStart(start_step=0, samples=0))
    f(jnp.ones(3)).block_until_ready()
    self.assertEqual(counter.count(), 0)
    f(jnp.ones(6)).block_until_ready()
    self.assertGreaterEqual(counter.count(), 1)


if __name__ == "__main__":
  absltest.main()
