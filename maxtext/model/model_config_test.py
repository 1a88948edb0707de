"""model_config: the model's fields only, so a run field compiles nothing.

The decoder, the scorer and the windowed sampler are given whole run configs
here, as their callers do; changing `run_name` or `learning_rate` must leave
their compiled programs in JAX's cache (no backend compile), while changing
a model field compiles anew (the count can fail).
"""

import glob
import os
import re
import time

from absl.testing import absltest
import jax
import ml_collections

from maxtext.generation import decoder
from maxtext.generation import sampling
from maxtext.generation import scoring
from maxtext.model import model_config
from maxtext.model import transformer
from testing import compile_counter
from testing import tiny_configs

_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _run_config(**overrides) -> ml_collections.FrozenConfigDict:
  """A whole run config (base.py's fields) with the tiny model."""
  return ml_collections.FrozenConfigDict(tiny_configs.model_config(**overrides))


class ModelConfigTest(absltest.TestCase):

  def test_holds_the_model_fields_only(self):
    config = _run_config()
    model = model_config.of(config)
    self.assertIsInstance(model, model_config.ModelConfig)
    self.assertEqual(
        {name: getattr(model, name) for name in model_config.FIELDS},
        {name: config[name] for name in model_config.FIELDS},
    )
    self.assertFalse(hasattr(model, "run_name"))
    self.assertIs(model_config.of(model), model)

  def test_a_combination_the_model_lacks_is_one_line(self):
    with self.assertRaisesRegex(
        ValueError, r"^config\.attention_output_gate=True: needs attention_type"
    ):
      model_config.of(
          _run_config(attention_type="mla", attention_output_gate=True)
      )

  def test_equal_and_hashed_alike_whatever_the_run_fields(self):
    a = model_config.of(_run_config(run_name="a", learning_rate=1e-3))
    b = model_config.of(_run_config(run_name="b", learning_rate=5e-2))
    self.assertEqual(a, b)
    self.assertEqual(hash(a), hash(b))
    self.assertNotEqual(a, model_config.of(_run_config(norm_epsilon=1e-3)))

  def test_fields_are_what_the_model_and_generation_read(self):
    read = set()
    for package in ("model", "generation"):
      for path in glob.glob(os.path.join(_ROOT, "maxtext", package, "*.py")):
        name = os.path.basename(path)
        if name.endswith("_test.py") or name in (
            "generate.py",
            "model_config.py",
        ):
          continue  # generate.py reads a run's record, not a model.
        with open(path, encoding="utf-8") as f:
          read.update(re.findall(r"\bconfig\.([a-z_0-9]+)\b", f.read()))
    self.assertIn("num_layers", read)  # The sources were found.
    self.assertEqual(read, set(model_config.FIELDS))

  def test_a_run_field_recompiles_nothing_a_model_field_does(self):
    compile_counter.install()
    config = _run_config(run_name="first", learning_rate=1e-3)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    prompts = [[1, 2, 3], [4, 5, 6]]
    options = sampling.SamplingOptions(max_new_tokens=3, seed=1)

    def use(run_config):
      decoder.generate(params, run_config, prompts, options)
      scoring.score(params, run_config, prompts, [[7], [8, 9]])
      sampling.sample(params, run_config, [1, 2, 3], options)

    use(config)  # Compiles each program once.
    since = time.monotonic()
    use(_run_config(run_name="second", learning_rate=5e-2, seed=7))
    self.assertEqual(compile_counter.backend_compiles_after(since), [])
    # A model field changes the programs: each compiles again.
    since = time.monotonic()
    use(_run_config(run_name="first", learning_rate=1e-3, norm_epsilon=1e-3))
    self.assertCountEqual(
        compile_counter.backend_compiles_after(since),
        ["jit(_generate)", "jit(_score)", "jit(_sample_loop)"],
    )


if __name__ == "__main__":
  absltest.main()
