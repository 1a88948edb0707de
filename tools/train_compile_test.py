"""End-to-end tests of //tools:train_compile, run as a user runs it.

With the TPU package set (`--config=tpu`: the target's `--tpu` argument)
the binary compiles for a 4-chip v5p slice with the real TPU compiler;
without it, for 4 fake CPU devices judged against --hbm_gib.
"""

import os
import re
import subprocess
import sys
import tempfile

from absl.testing import absltest

from testing import run_compile_level
from testing import runfiles
from testing import tiny_configs
from tools.benchmarks import hlo_census

# `args` of the Bazel target: present when the build has the TPU packages.
_TPU_ARG = "--tpu"
_TPU = _TPU_ARG in sys.argv

# The default config made to compile fast: one micro-batch per step, FSDP
# over the 4 devices.
_SMALL = [
    "--config=maxtext/configs/default.py",
    "--config.gradient_accumulation_steps=1",
    "--config.data_parallelism=1",
    "--config.fsdp_parallelism=-1",
    "--config.enable_mllog=False",
]
_LAST = re.compile(
    r"^train_compile: topology=(\S+) devices=(\d+) chips=(\d+) "
    r"peak=(\d+\.\d\d) GiB hbm=(\d+\.\d\d) GiB fits=(yes|no) "
    r"compile_s=(\d+\.\d)$"
)


_GENERATE_LAST = re.compile(
    r"^train_compile: program=generate topology=(\S+) devices=(\d+) "
    r"chips=(\d+) slots=(\d+) pages=(\d+) page_size=(\d+) length=(\d+) "
    r"params=(\d+\.\d\d) GiB pool=(\d+\.\d\d) GiB "
    r"states=(\d+\.\d\d) GiB state_bytes_per_slot=(\d+) "
    r"peak=(\d+\.\d\d) GiB hbm=(\d+\.\d\d) GiB fits=(yes|no) "
    r"compile_s=(\d+\.\d)$"
)

# MLPerf's qwen35_397b_grpo.py (its 16-row batch in K = 2 micro-batches) on
# the tiny Qwen3.5 hybrid, with episodes of 128 tokens in all.
_BENCHMARK_GRPO = [
    "--config=maxtext/configs/qwen35_397b_grpo.py:16",
    *(
        f"--config.{key}={value}"
        for key, value in {
            **tiny_configs.TINY_MODEL,
            **tiny_configs.TINY_QWEN35,
        }.items()
        if key not in ("max_sequence_length", "global_batch_size",
                       "eval_batch_size")
    ),  # fmt: skip
    "--config.grpo_stop_ids=31",
    "--config.loss_chunk_size=32",
    "--config.max_sequence_length=128",
    "--config.grpo_prompt_length=16",
    "--config.grpo_max_completion_length=112",
    "--config.data_parallelism=1",
    "--config.fsdp_parallelism=-1",
    f"--config.hardware={'tpu' if _TPU else 'cpu'}",
]


def _run(*args, as_a_run: bool = False):
  """Runs the binary with `args`; its CompletedProcess. `as_a_run`: its
  XLA CPU compiles as a run's, not at the suite's cheap level
  (`testing/run_compile_level`)."""
  command = runfiles.binary_command("tools/train_compile")
  environ = runfiles.binary_environ(command)
  if as_a_run:
    run_compile_level.request(environ)
  done = subprocess.run(
      command + list(args),
      capture_output=True,
      text=True,
      env=environ,
      check=False,
      timeout=600,
  )
  return done


def _slice(*extra) -> list[str]:
  """The slice flags: a v5p-8 (4 chips), or 4 CPU devices of 1 GiB."""
  if _TPU:
    return ["--topology=v5p-8", *extra]
  return ["--topology=cpu:4", "--hbm_gib=1", *extra]


class TrainCompileTest(absltest.TestCase):

  def _last_line(self, done):
    self.assertNotIn("Traceback", done.stderr)
    match = _LAST.match(done.stdout.strip().splitlines()[-1])
    self.assertIsNotNone(match, done.stdout)
    return match.groups()

  def test_small_config_fits_and_search_stops_there(self):
    # The search's first setting is the config's own (no remat, K = 1): it
    # fits, so the search compiles that one and prints it as the choice.
    done = _run(*_SMALL, *_slice("--search"))
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        "train_compile: context_parallelism=1 tensor_parallelism=1 "
        "remat_policy=none "
        "gradient_accumulation_steps=1 ",
        done.stdout,
    )
    self.assertIn(
        "train_compile: choice: --config.context_parallelism=1 "
        "--config.tensor_parallelism=1 "
        "--config.remat_policy=none --config.gradient_accumulation_steps=1",
        done.stdout,
    )
    topology, devices, chips, peak, hbm, fits, _ = self._last_line(done)
    self.assertEqual(
        (topology, devices, chips, hbm, fits),
        ("v5p:2x2x1", "4", "4", "95.74", "yes")
        if _TPU
        else ("cpu:4", "4", "4", "1.00", "yes"),
    )
    self.assertLess(float(peak), 0.1)
    # Per program its memory and compile seconds: at K = 1 the micro-step,
    # then the step's update, a program of its own.
    rows = re.findall(
        r"^(micro_step|update) +((?:\d+\.\d\d +){6})\d+\.\d$",
        done.stdout,
        re.MULTILINE,
    )
    self.assertEqual([name for name, _ in rows], ["micro_step", "update"])

  def test_long_rows_fit_with_context_parallelism(self):
    # One row per micro-batch split over the 4 devices' context axis (two
    # zig-zag chunks each); on the TPU 32,768-token rows with the splash
    # kernel per device on its 8,192 queries against the gathered keys.
    length = 32768 if _TPU else 1024
    done = _run(
        *_SMALL,
        *_slice(),
        "--config.context_parallelism=4",
        f"--config.max_sequence_length={length}",
        "--config.global_batch_size=2",
        "--config.eval_batch_size=2",
        "--config.loss_chunk_size=1024",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("mesh data=1 fsdp=1 context=4;", done.stdout)
    if _TPU:
      self.assertIn("attention auto", done.stdout)
    *_, peak, hbm, fits, _ = self._last_line(done)
    self.assertEqual(fits, "yes")
    self.assertLess(float(peak), float(hbm))

  def test_grpo_step_with_context_parallelism(self):
    # GRPO's own step (its loss on rollout rows of prompt + completion
    # tokens), each row split over the 4 devices' context axis; on the TPU
    # 32,768-token rows.
    length = 32768 if _TPU else 1024
    done = _run(
        "--config=maxtext/configs/grpo_tiny.py",
        *_slice(),
        "--config.gradient_accumulation_steps=1",
        "--config.data_parallelism=1",
        "--config.fsdp_parallelism=-1",
        "--config.enable_mllog=False",
        "--config.context_parallelism=4",
        "--config.global_batch_size=4",
        "--config.grpo_prompt_length=256",
        f"--config.grpo_max_completion_length={length - 256}",
        f"--config.max_sequence_length={length}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        f"mesh data=1 fsdp=1 context=4; grpo, global batch 4 in K=1, seq "
        f"{length},",
        done.stdout,
    )
    *_, peak, hbm, fits, _ = self._last_line(done)
    self.assertEqual(fits, "yes")
    self.assertLess(float(peak), float(hbm))
    refused = _run(
        "--config=maxtext/configs/grpo_tiny.py",
        *_slice(f"--compiled_step_file={self.create_tempdir().full_path}/s"),
    )
    self.assertEqual(refused.returncode, 2)
    self.assertEqual(
        refused.stderr.strip().splitlines()[-1],
        "train_compile: error: --compiled_step_file: not for "
        "config.workload='grpo' "
        "(its eval generates, it is not the engine's eval program)",
    )

  def test_the_benchmark_grpo_config_compiles_shrunk(self):
    # The benchmark's GRPO step on rows of an episode's whole length, and
    # its rollout's programs, whose prefill takes a turn's whole
    # conversation: all of the episode's 128 tokens but the one the turn
    # writes.
    done = _run(*_BENCHMARK_GRPO, *_slice())
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("; grpo, global batch 16 in K=2, seq 128,", done.stdout)
    *_, peak, hbm, fits, _ = self._last_line(done)
    self.assertEqual(fits, "yes")
    self.assertLess(float(peak), float(hbm))
    done = _run(
        *_BENCHMARK_GRPO,
        *_slice("--program=generate", "--slots=4"),
        "--config.tensor_parallelism=2",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        "generate: 4 slots of up to 128 positions, contexts of up to 127 ids",
        done.stdout,
    )
    match = _GENERATE_LAST.match(done.stdout.strip().splitlines()[-1])
    self.assertIsNotNone(match, done.stdout)
    self.assertEqual(match.groups()[-2], "yes")

  def test_saving_a_search_is_one_line(self):
    done = _run(
        *_SMALL,
        *_slice("--search", "--compiled_step_file=/tmp/unused.step"),
    )
    self.assertEqual(done.returncode, 2, done.stderr)
    self.assertIn("--compiled_step_file: give it without --search", done.stderr)
    self.assertNotIn("Traceback", done.stderr)

  def test_step_that_does_not_fit_is_fits_no(self):
    if _TPU:
      # XLA attention's scores of 16 sequences of 32768 tokens per device:
      # the TPU compiler refuses the micro-step for its temporaries.
      done = _run(
          *_SMALL,
          *_slice(),
          "--config.attention=dot_product",
          "--config.max_sequence_length=32768",
          "--config.global_batch_size=64",
          "--config.eval_batch_size=64",
      )
      self.assertRegex(
          done.stdout,
          r"micro_step +RESOURCE_EXHAUSTED: needs \d+\.\d\d GiB "
          r"of 95\.74 GiB",
      )
    else:
      done = _run(*_SMALL, "--topology=cpu:4", "--hbm_gib=0.001")
    self.assertEqual(done.returncode, 1, done.stderr)
    *_, peak, hbm, fits, _ = self._last_line(done)
    self.assertEqual(fits, "no")
    self.assertGreater(float(peak), float(hbm))

  def test_two_slices_hold_data_parallel_replicas(self):
    done = _run(*_SMALL, *_slice("--num_slices=2"))
    self.assertEqual(done.returncode, 0, done.stderr)
    topology, devices, chips, *_ = self._last_line(done)
    self.assertEqual((devices, chips), ("8", "8"))
    if _TPU:
      # Data parallelism across the slices, FSDP within each.
      self.assertEqual(topology, "v5p:2x2x1")
      self.assertIn("mesh data=2 fsdp=4;", done.stdout)

  def test_one_chip(self):
    # Cloud TPU's one-chip v5e slice (a fake CPU device without libtpu):
    # the whole step on one device, judged against one chip's HBM.
    topology = ["--topology=v5litepod-1"] if _TPU else ["--topology=cpu:1"]
    done = _run(*_SMALL, *topology, *([] if _TPU else ["--hbm_gib=1"]))
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("mesh data=1 fsdp=1;", done.stdout)
    last = self._last_line(done)
    self.assertEqual(
        (last[0], last[1], last[2], last[4], last[5]),
        ("v5e:1x1", "1", "1", "15.75", "yes")
        if _TPU
        else ("cpu:1", "1", "1", "1.00", "yes"),
    )

  def test_hlo_dir_holds_each_program(self):
    hlo_dir = tempfile.mkdtemp()
    topology = ["--topology=v5litepod-1"] if _TPU else ["--topology=cpu:1"]
    # The census reads the program a run compiles: with the suite's older
    # XLA CPU fusion emitters, XLA writes other ops as loops of their own.
    done = _run(
        *_SMALL,
        *topology,
        *([] if _TPU else ["--hbm_gib=1"]),
        f"--hlo_dir={hlo_dir}",
        as_a_run=True,
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertEqual(
        sorted(os.listdir(hlo_dir)), ["micro_step.hlo.txt", "update.hlo.txt"]
    )
    with open(
        os.path.join(hlo_dir, "micro_step.hlo.txt"), encoding="utf-8"
    ) as f:
      found = hlo_census.census(f.read())
    # The 2 layers' scan, forward and backward.
    self.assertEqual([trips for _, trips in found.loops], [2, 2])
    self.assertGreater(found.total_flops(), 0)
    if _TPU:
      # The TPU compiler fuses each MLP weight's gradient product into the
      # write of its layer into the stacked float32 gradient [2, 128, 512]
      # (w_gate, w_up) and [2, 512, 128] (w_down): one layer a trip.
      writes = sorted(
          f.shape
          for f in found.rooted("dynamic-update-slice")
          if f.flops
          and f.updated_bytes == 128 * 512 * 4
          and f.runs == 2
          and f.shape in ("f32[2,128,512]", "f32[2,512,128]")
      )
      self.assertEqual(
          writes, ["f32[2,128,512]", "f32[2,128,512]", "f32[2,512,128]"]
      )

  def test_hlo_dir_with_search_is_one_line(self):
    done = _run(*_SMALL, *_slice("--search", "--hlo_dir=/tmp/unused"))
    self.assertEqual(done.returncode, 2, done.stderr)
    self.assertIn("--hlo_dir=/tmp/unused: for the training step", done.stderr)
    self.assertNotIn("Traceback", done.stderr)

  def test_generation_programs_fit(self):
    # The hybrid of decode_bench.py (two groups of two Gated DeltaNet layers
    # and one attention layer with 2 key/value heads of 64; 8 experts), in
    # bfloat16: 8 slots of 512 positions, the pool split over tensor = 2.
    done = _run(
        "--config=maxtext/configs/decode_bench.py:hybrid",
        *_slice(),
        "--program=generate",
        "--slots=8",
        "--length=512",
        "--prompt_length=64",
        "--config.data_parallelism=1",
        "--config.fsdp_parallelism=-1",
        "--config.tensor_parallelism=2",
        "--config.compute_dtype=bfloat16",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertNotIn("Traceback", done.stderr)
    self.assertIn("mesh data=1 fsdp=2 tensor=2;", done.stdout)
    rows = re.findall(
        r"^(prefill|decode) +((?:\d+\.\d\d +){6})\d+\.\d$",
        done.stdout,
        re.MULTILINE,
    )
    self.assertEqual([name for name, _ in rows], ["prefill", "decode"])
    copy = re.search(
        r"^train_compile: weight copy: bfloat16 parameters "
        r"total_bytes=(\d+) .* per device (\d+) .* 4 devices receive (\d+) ",
        done.stdout,
        re.MULTILINE,
    )
    self.assertIsNotNone(copy, done.stdout)
    total, per_device, received = map(int, copy.groups())
    self.assertEqual(received, 4 * per_device)
    self.assertLess(per_device, total)
    match = _GENERATE_LAST.match(done.stdout.strip().splitlines()[-1])
    self.assertIsNotNone(match, done.stdout)
    (
        topology,
        devices,
        chips,
        slots,
        pages,
        page_size,
        length,
        _,
        _,
        _,
        state_bytes,
        peak,
        hbm,
        fits,
        _,
    ) = match.groups()
    self.assertEqual(
        (topology, devices, chips),
        ("v5p:2x2x1", "4", "4") if _TPU else ("cpu:4", "4", "4"),
    )
    # The engine's default pool: (8 + 1) slots x 512 / 16 pages.
    self.assertEqual(
        (slots, pages, page_size, length), ("8", "288", "16", "512")
    )
    self.assertGreater(int(state_bytes), 0)
    self.assertEqual(fits, "yes")
    self.assertLess(float(peak), float(hbm))

  def test_generation_flags_are_one_line(self):
    done = _run(*_SMALL, *_slice("--program=generate", "--slots=0"))
    self.assertEqual(done.returncode, 2)
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "train_compile: error: --slots=0: give the slots (>= 1); the "
        "config's grpo_decode_slots is 0",
    )
    done = _run(
        *_SMALL,
        *_slice("--program=generate", "--slots=2", "--length=128"),
    )
    self.assertEqual(done.returncode, 2)
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "train_compile: error: length=128 exceeds max_sequence_length=64",
    )

  def test_bad_topology_is_one_line(self):
    done = _run(*_SMALL, "--topology=v9-8")
    self.assertEqual(done.returncode, 2)
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "train_compile: error: --topology='v9-8': unknown TPU generation "
        "'v9'; known: tpu7x, v4, v5e, v5litepod, v5p, v6e, v7x",
    )

  def test_mesh_that_does_not_divide_the_slice_is_one_line(self):
    done = _run(*_SMALL, *_slice("--config.fsdp_parallelism=3"))
    self.assertEqual(done.returncode, 2)
    self.assertRegex(
        done.stderr.strip().splitlines()[-1],
        r"^train_compile: error: data_parallelism=1 x fsdp_parallelism=3 = "
        r"3 does not match the 4 devices$",
    )


if __name__ == "__main__":
  if _TPU:
    sys.argv.remove(_TPU_ARG)
  absltest.main()
