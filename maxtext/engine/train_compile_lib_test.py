"""Tests for maxtext.engine.train_compile_lib on 4 fake CPU devices."""

from maxtext.runtime import cpu_devices

cpu_devices.request(4)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import threading

from absl.testing import absltest
import jax
import jax.numpy as jnp

from maxtext.config import config_lib
from maxtext.core import progress
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import compile_config
from maxtext.engine import train_compile_lib
from testing import tiny_configs


class ParseOutOfMemoryTest(absltest.TestCase):

  def test_temporaries_message(self):
    self.assertEqual(
        train_compile_lib.parse_out_of_memory(
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
            "required for HLO temporaries (98.33G) exceeds available HBM "
            "(95.74G)."
        ),
        (int(98.33 * 2**30), int(95.74 * 2**30)),
    )

  def test_used_of_message(self):
    self.assertEqual(
        train_compile_lib.parse_out_of_memory(
            "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. "
            "Used 1.50T of 95.74G hbm. Exceeded hbm capacity by 1.4T."
        ),
        (int(1.5 * 2**40), int(95.74 * 2**30)),
    )

  def test_message_without_figures(self):
    self.assertEqual(
        train_compile_lib.parse_out_of_memory("RESOURCE_EXHAUSTED: no"),
        (None, None),
    )


class _SlowToCompile:
  """A lowered program whose compile waits until `ready` is set (the test's
  stand-in for a compile of minutes)."""

  def __init__(self, lowered, ready: threading.Event):
    self._lowered = lowered
    self._ready = ready

  def compile(self):
    if not self._ready.wait(timeout=120):
      raise TimeoutError("no progress line in 120 s")
    return self._lowered.compile()


class CompileProgramProgressTest(absltest.TestCase):

  def test_a_long_compile_says_its_elapsed_time_then_done(self):
    lines = []
    two_lines = threading.Event()

    def show(line):
      lines.append(line)
      if len(lines) == 2:
        two_lines.set()

    seconds = iter(range(0, 100_000, 40))  # Each reading 40 s on.
    reporter = progress.Reporter(
        progress.Lines(show), interval_s=30.0, clock=lambda: next(seconds)
    )
    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(4))
    compiled, memory = train_compile_lib.compile_program(
        "double", _SlowToCompile(lowered, two_lines), 0, progress=reporter
    )
    self.assertIsNotNone(compiled)
    self.assertEqual(memory.program, "double")
    # The thread's first two readings of the clock (40 s apart), then
    # maybe more until the compile returns, then the last line.
    self.assertEqual(
        lines[:2],
        [
            "train_compile: compiling double: 40 s elapsed",
            "train_compile: compiling double: 1m 20s elapsed",
        ],
    )
    for line in lines[2:-1]:
      self.assertRegex(
          line, r"^train_compile: compiling double: \d+m \d+s elapsed$"
      )
    self.assertRegex(
        lines[-1], r"^train_compile: compiling double: done in \d+m \d+s$"
    )

  def test_a_short_compile_says_nothing(self):
    lines = []
    reporter = progress.Reporter(progress.Lines(lines.append), clock=lambda: 0)
    lowered = jax.jit(lambda x: x + 1).lower(jnp.ones(4))
    train_compile_lib.compile_program("plus", lowered, 0, progress=reporter)
    self.assertEqual(lines, [])


def _settings(config) -> compile_config.CompileConfig:
  return compile_config.CompileConfig.from_config(config)


class CompileStepTest(absltest.TestCase):

  def _config(self, k):
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        gradient_accumulation_steps=k,
        data_parallelism=1,
        fsdp_parallelism=-1,
    )
    config_lib.validate(config)
    return config, mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )

  def test_compiles_the_engines_programs_with_their_memory(self):
    for k, names in ((2, ["micro_step"]), (1, ["micro_step", "update"])):
      with self.subTest(k=k):
        config, mesh = self._config(k)
        lines = []
        step = train_compile_lib.compile_step(
            _settings(config), mesh, log=lines.append
        )
        self.assertIsNone(step.out_of_memory)
        self.assertEqual([p.program for p in step.programs], names)
        self.assertEqual(lines[0::2], [f"compiling {n}" for n in names])
        self.assertEqual(step.executables, {})
        micro = step.programs[0]
        if k > 1:
          # The micro-step takes the whole training state (parameters,
          # AdamW's two moments, the accumulator), donated: none of it is
          # resident beside it, and its outputs reuse the arguments'
          # buffers.
          self.assertEqual(micro.resident, 0)
          self.assertGreater(micro.alias, 0)
          self.assertGreaterEqual(micro.args, micro.alias)
        else:
          # The optimizer state is resident beside the micro-step; the
          # update takes the whole training state (parameters, AdamW's two
          # moments, twice the parameters, the gradients) and updates
          # parameters and moments in the donated buffers.
          update = step.programs[1]
          self.assertGreater(micro.resident, 0)
          self.assertEqual(update.resident, 0)
          self.assertGreaterEqual(update.args, micro.resident * 3 // 2)
          self.assertGreaterEqual(update.alias, micro.resident * 3 // 2)
        for p in step.programs:
          self.assertEqual(
              p.peak, p.args + p.out - p.alias + p.temp + p.resident
          )
        self.assertEqual(step.peak, max(p.peak for p in step.programs))
        self.assertLen(train_compile_lib.table(step), 1 + len(step.programs))

  def test_every_program_keeps_the_runs_executables(self):
    for k, names in (
        (2, ["allocate", "micro_step", "eval"]),
        (1, ["micro_step", "update", "eval"]),
    ):
      with self.subTest(k=k):
        config, mesh = self._config(k)
        step = train_compile_lib.compile_step(
            _settings(config), mesh, every_program=True
        )
        self.assertEqual([p.program for p in step.programs], names)
        self.assertEqual(list(step.executables), names)
        for compiled in step.executables.values():
          self.assertIsInstance(compiled, jax.stages.Compiled)

  def test_search_stops_at_the_least_recomputing_fewest_steps_fit(self):
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        global_batch_size=8,
        eval_batch_size=8,
        data_parallelism=1,
        fsdp_parallelism=-1,
    )
    config_lib.validate(config)
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )
    # 8 sequences over 4 devices: 1 or 2 micro-steps.
    self.assertEqual(
        train_compile_lib.accumulation_choices(_settings(config), mesh), [1, 2]
    )
    tried, choice = train_compile_lib.search(_settings(config), mesh, 2**40)
    self.assertLen(tried, 1)
    self.assertEqual(
        (choice.remat_policy, choice.gradient_accumulation_steps), ("none", 1)
    )
    # Just below that setting's peak it no longer fits: the search goes on
    # to settings that recompute more or accumulate, and stops at the first
    # that fits (or tries them all).
    hbm = choice.step.peak - 1
    tried, choice = train_compile_lib.search(_settings(config), mesh, hbm)
    order = [
        (r, k) for r in train_compile_lib.REMAT_BY_RECOMPUTATION for k in (1, 2)
    ]
    self.assertEqual(
        [(c.remat_policy, c.gradient_accumulation_steps) for c in tried],
        order[: len(tried)],
    )
    self.assertFalse(any(c.fits(hbm) for c in tried[:-1]))
    if choice is not None:
      self.assertIs(choice, tried[-1])
      self.assertLessEqual(choice.step.peak, hbm)
      self.assertEqual(
          [p.program for p in choice.step.programs],
          ["micro_step", "update"]
          if choice.gradient_accumulation_steps == 1
          else ["micro_step"],
      )
    else:
      self.assertLen(tried, len(order))

  def test_search_tries_doubled_tensor_parallelism_when_nothing_fits(self):
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        global_batch_size=8,
        eval_batch_size=8,
        data_parallelism=1,
        fsdp_parallelism=-1,
        num_heads=4,
        num_kv_heads=2,
        # 2 x 2 does not divide 18 tokens: no context parallelism.
        max_sequence_length=18,
    )
    config_lib.validate(config)
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )
    # 4 devices, 4 query and 2 key/value heads: tensor 1 or 2.
    self.assertEqual(
        train_compile_lib.tensor_choices(_settings(config), mesh), [1, 2]
    )
    self.assertEqual(
        train_compile_lib.layout_choices(_settings(config), mesh),
        [(1, 1), (1, 2)],
    )
    tried, choice = train_compile_lib.search(
        _settings(config), mesh, 1, tensor=True
    )
    self.assertIsNone(choice)
    # Every remat policy with K in 1, 2 (8 rows over 4 batch shards), then
    # with tensor 2 K in 1, 2, 4 (the rows split over 2 shards only).
    remats = len(train_compile_lib.REMAT_BY_RECOMPUTATION)
    self.assertEqual(
        [c.tensor_parallelism for c in tried],
        [1] * 2 * remats + [2] * 3 * remats,
    )
    # Each was compiled (on its own mesh) and measured, none refused.
    for candidate in tried:
      self.assertIsNone(candidate.step.out_of_memory)
      self.assertGreater(candidate.step.peak, 1)

  def test_layouts_split_rows_over_the_fewest_devices_context_first(self):
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        data_parallelism=1,
        fsdp_parallelism=-1,
        num_heads=4,
        num_kv_heads=2,
    )
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )
    # 16 tokens over 4 devices: context 1, 2, 4 (2C chunks divide 16),
    # tensor 1, 2 (the heads).
    self.assertEqual(
        train_compile_lib.layout_choices(_settings(config), mesh),
        [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2)],
    )

  def test_search_tries_doubled_context_parallelism_when_nothing_fits(self):
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        global_batch_size=4,
        eval_batch_size=4,
        data_parallelism=1,
        fsdp_parallelism=-1,
        # One key/value head: no tensor parallelism; 20 tokens: context 1
        # or 2 (8 chunks do not divide 20).
        num_heads=2,
        num_kv_heads=1,
        max_sequence_length=20,
    )
    config_lib.validate(config)
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )
    self.assertEqual(
        train_compile_lib.layout_choices(_settings(config), mesh),
        [(1, 1), (2, 1)],
    )
    tried, choice = train_compile_lib.search(
        _settings(config), mesh, 1, tensor=True
    )
    self.assertIsNone(choice)
    # Every remat policy with K = 1 (4 rows over 4 batch shards), then with
    # context 2 K in 1, 2 (the rows split over 2 shards only).
    remats = len(train_compile_lib.REMAT_BY_RECOMPUTATION)
    self.assertEqual(
        [c.context_parallelism for c in tried], [1] * remats + [2] * 2 * remats
    )
    for candidate in tried:
      self.assertIsNone(candidate.step.out_of_memory)
      self.assertGreater(candidate.step.peak, 1)

  def test_device_bytes_counts_one_shard(self):
    mesh = jax.sharding.Mesh(jax.devices(), ("x",))
    sharded = jax.ShapeDtypeStruct(
        (8, 6),
        jnp.float32,
        sharding=jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec("x")
        ),
    )
    whole = jax.ShapeDtypeStruct((3,), jnp.bfloat16)
    self.assertEqual(
        train_compile_lib.device_bytes({"a": sharded, "b": whole}),
        2 * 6 * 4 + 3 * 2,
    )


if __name__ == "__main__":
  absltest.main()
