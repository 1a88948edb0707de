"""Samples from a tiny model trained on the stdlib's sources."""

import dataclasses
import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized

from maxtext import workloads
from maxtext.generation import generate
from maxtext.generation import sampling
from testing import stdlib_run
from testing import tiny_configs

_STEPS = 6
# The tiny run's model sees 16 positions: short prompts and 10 new ids fit.
_OPTIONS = sampling.SamplingOptions(max_new_tokens=10, num_samples=2)


def _options(**changes) -> sampling.SamplingOptions:
  """_OPTIONS with `changes`."""
  return dataclasses.replace(_OPTIONS, **changes)


class GenerateTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("generate_test_")
    cls.data = stdlib_run.prepare_data(cls.root)
    # Checkpoints at steps 3 and 6.
    cls.result = stdlib_run.train(cls.root, cls.data, "text", _STEPS)
    cls.loaded = generate.load_run(cls.result.run_dir)

  def test_loads_the_newest_checkpoint_and_the_recorded_tokenizer(self):
    self.assertEqual(self.loaded.step, _STEPS)
    self.assertEqual(self.loaded.tokenizer.vocab_size, stdlib_run.VOCAB_SIZE)
    self.assertEqual(self.loaded.eod_id, self.loaded.tokenizer.eod_id)
    older = generate.load_run(self.result.run_dir, step=3)
    self.assertEqual(older.step, 3)
    # Three more steps changed the parameters: the steps are not mixed up.
    self.assertFalse(
        (older.params["embedding"] == self.loaded.params["embedding"]).all()
    )

  def test_same_seed_same_text_and_the_text_round_trips(self):
    options = _options(temperature=1.0, seed=5)
    first = generate.generate(self.loaded, "import ", options)
    again = generate.generate(self.loaded, "import ", options)
    self.assertEqual(first, again)
    self.assertLen(first, 2)
    for text in first:
      self.assertIsInstance(text, str)
      # Valid text: it encodes back to ids that decode to it again.
      tok = self.loaded.tokenizer
      self.assertEqual(tok.decode(tok.encode(text)), text)

  def test_other_seeds_draw_other_ids(self):
    draws = {
        tuple(
            map(
                tuple,
                generate.generate_ids(
                    self.loaded,
                    [self.loaded.eod_id],
                    _options(temperature=1.0, seed=seed),
                ),
            )
        )
        for seed in range(3)
    }
    # 2 x 10 draws from 400 ids at temperature 1 after 6 steps: equal
    # draws for two seeds would mean the seed is ignored.
    self.assertLen(draws, 3)

  def test_greedy_ignores_the_seed_and_top_k_one_is_greedy(self):
    greedy = [
        generate.generate_ids(self.loaded, [5, 6, 7], _options(seed=seed))
        for seed in (0, 1)
    ]
    self.assertEqual(greedy[0], greedy[1])
    self.assertEqual(greedy[0][0], greedy[0][1])
    top_one = generate.generate_ids(
        self.loaded, [5, 6, 7], _options(temperature=2.0, top_k=1, seed=3)
    )
    self.assertEqual(top_one, greedy[0])

  def test_a_continuation_past_the_context_is_refused(self):
    # 16 prompt ids fill the model's 16 positions: no room for new ones.
    with self.assertRaisesRegex(
        ValueError,
        r"prompt 0 of 16 tokens \+ max_new_tokens=10 = 26 exceeds the "
        r"model's max_sequence_length 16; the cached decoder does not slide",
    ):
      generate.generate_ids(
          self.loaded, [1] * 16, _options(temperature=1.0, seed=1)
      )

  def test_a_stop_id_ends_a_sample(self):
    free = generate.generate_ids(self.loaded, [5, 6, 7], _options())[0]
    stop = free[3]
    stopped = generate.generate_ids(
        self.loaded, [5, 6, 7], _options(stop_ids=(stop,))
    )[0]
    self.assertEqual(stopped, free[: free.index(stop) + 1])

  # Options bad in themselves are refused when built: sampling_test.
  @parameterized.named_parameters(
      ("long_prompt", [1] * 13, 0, "exceeds the model's max_sequence_length"),
      ("id_outside_vocab", [400], 0, "outside the model's"),
      ("top_k_above_vocab", [1, 2], 401, "top_k=401: above the vocabulary"),
  )
  def test_bad_prompts_and_top_k_are_named(self, prompt_ids, top_k, message):
    options = sampling.SamplingOptions(
        max_new_tokens=4, temperature=1.0, top_k=top_k
    )
    with self.assertRaisesRegex(ValueError, message):
      generate.generate_ids(self.loaded, prompt_ids, options)

  def test_no_checkpoint_and_no_step_are_named(self):
    empty = os.path.join(self.root, "empty")
    shutil.copytree(
        self.result.run_dir,
        empty,
        ignore=shutil.ignore_patterns("checkpoints"),
    )
    with self.assertRaisesRegex(ValueError, "holds no checkpoint"):
      generate.load_run(empty)
    with self.assertRaisesRegex(ValueError, r"step=4: .*steps \[3, 6\]"):
      generate.load_run(self.result.run_dir, step=4)
    with self.assertRaisesRegex(ValueError, "holds no config.json"):
      generate.load_run(self.root)

  def test_changed_or_missing_tokenizer_is_refused(self):
    data = os.path.join(self.root, "copied_data")
    shutil.copytree(self.data, data)
    run_dir = os.path.join(self.root, "copied_run")
    shutil.copytree(self.result.run_dir, run_dir)
    path = os.path.join(run_dir, "config.json")
    with open(path, encoding="utf-8") as f:
      document = json.load(f)
    document["provenance"]["data"]["data_dir"] = data
    with open(path, "w", encoding="utf-8") as f:
      json.dump(document, f)
    tokenizer = os.path.join(data, "tokenizer.model")
    with open(tokenizer, "ab") as f:
      f.write(b"\0")
    with self.assertRaisesRegex(ValueError, "changed since the run trained"):
      generate.load_run(run_dir)
    os.remove(tokenizer)
    with self.assertRaisesRegex(ValueError, "tokenizer .*: missing"):
      generate.load_run(run_dir)

  def test_a_run_without_tokenizer_samples_ids(self):
    result = workloads.run(
        tiny_configs.tiny_config(
            self.root, run_name="synthetic", steps=3, enable_mllog=False
        )
    )
    run = generate.load_run(result.run_dir)
    self.assertIsNone(run.tokenizer)
    options = sampling.SamplingOptions(max_new_tokens=5)
    ids = generate.generate_ids(run, [1, 2, 3], options)
    self.assertLen(ids[0], 5)
    with self.assertRaisesRegex(ValueError, r"--prompt_ids=1,2,3"):
      generate.generate(run, "text", options)


if __name__ == "__main__":
  absltest.main()
