"""End-to-end test of //tools:generate on a run trained on stdlib text."""

import dataclasses

from absl.testing import absltest

from maxtext.generation import generate
from maxtext.generation import sampling
from testing import stdlib_run
from testing import tiny_configs
from testing import runfiles


def _run(*args):
  return runfiles.run_binary("tools/generate", list(args), timeout_s=300)


class GenerateMainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("generate_main_test_")
    data = stdlib_run.prepare_data(cls.root)
    cls.run_dir = stdlib_run.train(cls.root, data, "text", 3).run_dir

  def test_prints_the_continuations_the_library_draws(self):
    options = sampling.SamplingOptions(
        max_new_tokens=12,
        temperature=1.0,
        top_k=20,
        top_p=0.95,
        seed=4,
        num_samples=2,
        stop_ids=(7, 9),
    )
    expected = generate.generate(
        generate.load_run(self.run_dir), "def ", options
    )
    # The flags are named as the options' fields (stop_ids: --stop).
    done = _run(
        f"--run_dir={self.run_dir}",
        "--prompt=def ",
        *(
            f"--{field.name}={getattr(options, field.name)}"
            for field in dataclasses.fields(options)
            if field.name != "stop_ids"
        ),
        "--stop=7,9",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertEqual(
        done.stdout,
        f"generate: {self.run_dir} step 3, temperature 1, top_k 20, "
        "top_p 0.95, seed 4\n"
        f"=== sample 1/2 ===\ndef {expected[0]}\n"
        f"=== sample 2/2 ===\ndef {expected[1]}\n",
    )

  def test_bad_input_is_a_one_line_error(self):
    for args, message in (
        (
            [f"--run_dir={self.run_dir}", "--prompt=x", "--temperature=-1"],
            "generate: error: temperature must be >= 0 (0 = greedy), got -1.0",
        ),
        (
            [f"--run_dir={self.run_dir}", "--prompt=x", "--top_p=0"],
            "generate: error: top_p must be in (0, 1] (1 = all ids), got 0.0",
        ),
        (
            [f"--run_dir={self.run_dir}", "--prompt=x", "--stop=a"],
            "generate: error: stop='a': expected comma-separated integers",
        ),
        (
            [
                f"--run_dir={self.run_dir}",
                "--prompt=x",
                "--num_samples=100000000",
            ],
            "generate: error: num_samples must be at most 4096 (the samples "
            "are the rows of one batch on the devices; draw more with other "
            "seeds), got 100000000",
        ),
        (
            [f"--run_dir={self.run_dir}", "--prompt=x", f"--seed={10**23}"],
            "generate: error: seed must be at most 9223372036854775807 (JAX's "
            f"seeds are 64-bit signed integers), got {10**23}",
        ),
        (
            [f"--run_dir={self.root}", "--prompt_ids=1,2"],
            f"generate: error: run_dir={self.root!r}: holds no config.json; "
            "is it a run directory written by train_main?",
        ),
    ):
      done = _run(*args)
      self.assertEqual(done.returncode, 2, done.stderr)
      self.assertEqual(done.stderr.strip().splitlines(), [message])


if __name__ == "__main__":
  absltest.main()
