"""A saved step on 4 fake CPU devices: compiled, saved, loaded by a run.

`//tools:train_compile --topology=cpu:4 --compiled_step_file=PATH` compiles
and saves the programs in its own process, as a user runs it; a run with
`compiled_step_file` then trains with them. JAX's own compile events
(`testing.compile_counter`) name the programs the backend compiled: none of
the engine's may be among them, while the control run, compiling in
process, compiles each; both runs' losses are the same.
"""

from maxtext import workloads
from maxtext.runtime import cpu_devices

cpu_devices.request(4)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import os
import pickle
import subprocess
import time

from absl.testing import absltest
from maxtext.config import config_lib
from maxtext.engine import saved_step
from maxtext.run import trainer
from maxtext.configs import default
from maxtext.listeners import interface
from testing import compile_counter
from testing import runfiles
from testing import tiny_configs

# The function names of the engine's programs, as JAX reports their compiles.
_ENGINE_PROGRAMS = frozenset(
    f"jit({name})"
    for name in (
        "allocate",
        "micro_step",
        "single_micro_step",
        "update",
        "eval_metrics_of",
    )
)


class _Losses(interface.RunListener):
  """Keeps each step's loss."""

  name = "losses"

  def __init__(self):
    self.losses = []

  def on_step(self, record: interface.StepRecord) -> None:
    self.losses.append(record.metrics["loss"])


def _config(base_dir: str, run_name: str, steps: int = 4, **overrides):
  """A validated tiny config: 2 micro-batches, data 2 x FSDP 2."""
  config = tiny_configs.tiny_config(
      base_dir,
      run_name=run_name,
      steps=steps,
      eval_interval=2,
      gradient_accumulation_steps=2,
      data_parallelism=2,
      fsdp_parallelism=-1,
      # No persistent cache: a hit would not be a compile in this process.
      jax_compilation_cache_dir="",
      **overrides,
  )
  config_lib.validate(config)
  return config


def _save(config, path: str) -> None:
  """Runs train_compile for `config` (the default config's file with each
  field that differs as an override) on 4 CPU devices, saving to `path`."""
  shipped = default.get_config()
  overrides = [
      f"--config.{name}={value}"
      for name, value in config.items()
      if value != shipped[name]
  ]
  command = runfiles.binary_command("tools/train_compile")
  done = subprocess.run(
      command
      + [
          "--config=maxtext/configs/default.py",
          *overrides,
          "--topology=cpu:4",
          "--hbm_gib=1",
          f"--compiled_step_file={path}",
      ],
      capture_output=True,
      text=True,
      env=runfiles.binary_environ(command),
      check=False,
      timeout=600,
  )
  assert done.returncode == 0, done.stdout + done.stderr
  assert f"train_compile: saved the compiled step to {path}" in done.stdout


class SavedStepTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    compile_counter.install()

  def test_a_run_with_the_file_compiles_none_of_the_engines_programs(self):
    base = self.create_tempdir().full_path
    path = os.path.join(base, "step.pickle")
    # Another run name and step count: neither shapes the programs.
    _save(_config(base, "compiler", steps=100, lr_schedule_steps=4), path)

    loaded_losses = _Losses()
    began = time.monotonic()
    result = workloads.run(
        _config(base, "loaded", compiled_step_file=path),
        extra_listeners=[loaded_losses],
    )
    loaded_compiles = compile_counter.backend_compiles_after(began)
    self.assertEqual(result.status, trainer.RunOutcome.COMPLETED)

    compiled_losses = _Losses()
    began = time.monotonic()
    workloads.run(_config(base, "compiled"), extra_listeners=[compiled_losses])
    own_compiles = compile_counter.backend_compiles_after(began)

    # The control compiles every program of the engine at its K > 1 (so
    # the count can fail; K = 1's two programs are not among them); the run
    # with the file compiles none of them.
    self.assertContainsSubset(
        _ENGINE_PROGRAMS - {"jit(single_micro_step)", "jit(update)"},
        set(own_compiles),
    )
    self.assertEmpty(_ENGINE_PROGRAMS & set(loaded_compiles), loaded_compiles)
    self.assertLen(loaded_losses.losses, 4)
    self.assertEqual(loaded_losses.losses, compiled_losses.losses)

  def test_a_changed_shaping_field_is_refused_naming_it(self):
    base = self.create_tempdir().full_path
    path = os.path.join(base, "step.pickle")
    _save(_config(base, "compiler"), path)
    config = _config(base, "other", compiled_step_file=path, mlp_dim=48)
    began = time.monotonic()
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.run(config)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertIn(f"compiled_step_file={path}", message)
    self.assertIn("field mlp_dim=", message)
    self.assertIn("(this run: 48)", message)
    # Refused before the model's programs were compiled.
    self.assertEmpty(
        _ENGINE_PROGRAMS & set(compile_counter.backend_compiles_after(began))
    )

  def test_another_mesh_is_refused_naming_the_devices(self):
    base = self.create_tempdir().full_path
    path = os.path.join(base, "step.pickle")
    _save(_config(base, "compiler"), path)
    config = _config(base, "other", compiled_step_file=path)
    config.data_parallelism = 4
    config.fsdp_parallelism = 1
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.run(config)
    self.assertIn("devices mesh=", str(caught.exception))

  def test_a_damaged_file_is_one_line_naming_it(self):
    base = self.create_tempdir().full_path
    path = os.path.join(base, "step.pickle")
    _save(_config(base, "compiler"), path)
    with open(path, "rb") as f:
      description = pickle.load(f)
      programs_at = f.tell()
      whole = f.seek(0, os.SEEK_END)
      f.seek(0)
      data = f.read()
    # The programs section cut in half, as a copy that stopped early.
    truncated = os.path.join(base, "truncated.pickle")
    with open(truncated, "wb") as f:
      f.write(data[: programs_at + (whole - programs_at) // 2])
    # A file of the format before the parameters' layout became
    # axis_rules' (format 1): its programs expect other input shardings.
    old_format = os.path.join(base, "old_format.pickle")
    with open(old_format, "wb") as f:
      pickle.dump(dict(description, format=1), f)
      f.write(data[programs_at:])
    # A description without its versions, then the real programs.
    unversioned = os.path.join(base, "unversioned.pickle")
    del description["versions"]
    with open(unversioned, "wb") as f:
      pickle.dump(description, f)
      f.write(data[programs_at:])
    for damaged, expected in (
        (truncated, "its programs section is damaged or truncated"),
        (unversioned, "its description has no 'versions'"),
        (old_format, f"not a saved step of format {saved_step.FORMAT}"),
    ):
      with self.subTest(damaged):
        with self.assertRaises(trainer.ConfigError) as caught:
          workloads.run(_config(base, "other", compiled_step_file=damaged))
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn(f"compiled_step_file={damaged}: {expected}", message)

  def test_a_missing_file_is_one_line(self):
    base = self.create_tempdir().full_path
    path = os.path.join(base, "absent.pickle")
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.run(_config(base, "other", compiled_step_file=path))
    self.assertEqual(
        str(caught.exception),
        f"compiled_step_file={path}: cannot open: No such file or directory",
    )


if __name__ == "__main__":
  absltest.main()
