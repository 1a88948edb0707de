"""dataset_type="chat": rows, the assistant weights, order, refusals, gradients.

Runs on the chat examples and tokenizer that `maxtext/configs/sft_tiny.py`
ships, and on bad files written here.
"""

import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.config import config_lib
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.data import dataset_kinds
from maxtext.run import preflight
from maxtext.configs import sft_tiny
from maxtext.model import transformer
from maxtext.text import chat
from maxtext.data import chat_dataset

_GOOD = {
    "messages": [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "1 + 1 = 2."},
    ]
}


def _config(**overrides):
  config = sft_tiny.get_config()
  config.base_output_directory = absltest.get_default_test_tmpdir()
  config.update(overrides)
  return config


class ChatDatasetTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.config = _config()
    self.dataset = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(self.config)
    )
    self.tokenizer = chat.ChatTokenizer.load(sft_tiny.DATA_DIR)

  def _lines(self, field):
    with open(self.config[field], encoding="utf-8") as f:
      return [json.loads(line)["messages"] for line in f if line.strip()]

  def test_rows_are_the_rendered_examples_weighted_on_replies(self):
    train = self._lines("train_data_path")
    batch = self.dataset.get_batch(3)
    seq = self.config.max_sequence_length
    self.assertEqual(set(batch), {"inputs", "targets", "weights"})
    for key, dtype in (("inputs", np.int32), ("targets", np.int32)):
      self.assertEqual(batch[key].shape, (8, seq))
      self.assertEqual(batch[key].dtype, dtype)
    self.assertEqual(batch["weights"].dtype, np.float32)
    for row, index in enumerate(self.dataset.train_indices(3)):
      encoded = self.tokenizer.encode(train[index])
      n = len(encoded.ids) - 1
      np.testing.assert_array_equal(batch["inputs"][row, :n], encoded.ids[:-1])
      np.testing.assert_array_equal(batch["targets"][row, :n], encoded.ids[1:])
      np.testing.assert_array_equal(
          batch["weights"][row, :n], encoded.assistant_mask[1:]
      )
      self.assertFalse(batch["weights"][row, n:].any())  # Padding.
      # The weighted targets read back as the assistant's replies, each
      # followed by the end of its turn.
      replies = "".join(
          m["content"] + "<|im_end|>\n"
          for m in train[index]
          if m["role"] == "assistant"
      )
      weighted = batch["targets"][row][batch["weights"][row] > 0]
      self.assertEqual(
          self.tokenizer.tokenizer.decode(
              weighted.tolist(), skip_special_tokens=False
          ),
          replies,
      )

  def test_order_is_a_function_of_the_step(self):
    again = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(self.config)
    )
    for step in (0, 7, 20):
      for key in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(
            self.dataset.get_batch(step)[key], again.get_batch(step)[key]
        )
    # An epoch (480 examples, 8 a step) visits every example once.
    seen = [i for step in range(61) for i in self.dataset.train_indices(step)]
    self.assertCountEqual(seen[:480], range(480))
    self.assertNotEqual(seen[:480], list(range(480)))  # Shuffled.
    self.assertNotEqual(seen[480:], seen[:8])  # Each epoch its own order.

  def test_processes_share_the_global_batch(self):
    whole = self.dataset.get_batch(5)
    parts = [
        dataset_kinds.make_dataset(
            data_config.DataConfig.from_config(self.config), index, 2
        ).get_batch(5)
        for index in range(2)
    ]
    for key in whole:
      np.testing.assert_array_equal(
          np.concatenate([p[key] for p in parts]), whole[key]
      )

  def test_eval_reads_the_held_out_examples_in_order(self):
    held_out = self._lines("eval_data_path")
    self.assertLen(held_out, 48)
    for index in (0, 5, 6):  # Batch 6 wraps around to the first examples.
      batch = self.dataset.get_eval_batch(index)
      for row in range(8):
        encoded = self.tokenizer.encode(held_out[(index * 8 + row) % 48])
        n = len(encoded.ids) - 1
        np.testing.assert_array_equal(
            batch["targets"][row, :n], encoded.ids[1:]
        )

  def test_placeholder_batches_have_the_weights(self):
    train, evaluation = builtin_datasets.placeholder_batches(
        data_config.DataConfig.from_config(self.config)
    )
    real = self.dataset.get_batch(0)
    for key in real:
      self.assertEqual(train[key].shape, real[key].shape)
      self.assertEqual(train[key].dtype, real[key].dtype)
    self.assertIn("weights", evaluation)
    self.assertNotIn(
        "weights",
        builtin_datasets.placeholder_batches(
            data_config.DataConfig.from_config(
                _config(dataset_type="synthetic")
            )
        )[0],
    )

  def test_provenance_names_files_and_tokenizer(self):
    provenance = self.dataset.provenance()
    files = provenance["chat_files"]
    self.assertEqual(
        set(files), {"train_data_path", "eval_data_path", "tokenizer_path"}
    )
    self.assertEqual(
        files["tokenizer_path"]["sampled_sha256"], self.tokenizer.fingerprint
    )
    self.assertEqual(provenance["chat_examples"]["train"], 480)
    self.assertEqual(provenance["chat_examples"]["eval"], 48)
    self.assertEqual(builtin_datasets.changed_files(provenance, provenance), [])
    # A resume on other examples (or another template) is named.
    directory = self.create_tempdir().full_path
    for name in os.listdir(sft_tiny.DATA_DIR):
      shutil.copy(os.path.join(sft_tiny.DATA_DIR, name), directory)
    with open(
        os.path.join(directory, "train.jsonl"), "a", encoding="utf-8"
    ) as f:
      f.write(json.dumps(_GOOD) + "\n")
    with open(
        os.path.join(directory, "chat_template.jinja"), "a", encoding="utf-8"
    ) as f:
      f.write("{# another template #}")
    other = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(
            _config(
                train_data_path=os.path.join(directory, "train.jsonl"),
                tokenizer_path=directory,
            )
        )
    )
    changes = builtin_datasets.changed_files(provenance, other.provenance())
    self.assertLen(changes, 2)
    self.assertRegex(changes[0], "^config.train_data_path=.*bytes recorded")
    self.assertRegex(changes[1], "^config.tokenizer_path=.*other content")

  def _write(self, content, name="bad.jsonl"):
    """A file of `content` (str: UTF-8 text; bytes: as they are)."""
    path = os.path.join(self.create_tempdir().full_path, name)
    if isinstance(content, str):
      content = content.encode("utf-8")
    with open(path, "wb") as f:
      f.write(content)
    return path

  @parameterized.named_parameters(
      ("not_json", "{oops\n", "line 2: not JSON"),
      ("not_an_object", "[1, 2]\n", 'line 2: not an object with "messages"'),
      (
          "no_messages",
          '{"text": "hi"}\n',
          'line 2: not an object with "messages"',
      ),
      (
          "unknown_role",
          '{"messages": [{"role": "bot", "content": "x"}]}\n',
          "line 2: message 0: role 'bot' is not one of",
      ),
      (
          "no_assistant",
          '{"messages": [{"role": "user", "content": "x"}]}\n',
          "line 2: no assistant message",
      ),
      (
          "tools_not_a_list",
          json.dumps(dict(_GOOD, tools={"name": "f"})) + "\n",
          r'line 2: "tools" must be a list of tool schemas',
      ),
      (
          "tool_not_an_object",
          json.dumps(dict(_GOOD, tools=["f"])) + "\n",
          "line 2: tool 0 is not an object: 'f'",
      ),
      (
          "too_long",
          json.dumps(
              {
                  "messages": [
                      {"role": "user", "content": "x " * 200},
                      {"role": "assistant", "content": "y"},
                  ]
              }
          )
          + "\n",
          r"line 2: \d+ tokens rendered; a row holds max_sequence_length \+ 1"
          r" = 97 \(examples are refused, not truncated\)",
      ),
  )
  def test_bad_line_is_named_before_device_work(self, bad_line, pattern):
    path = self._write(json.dumps(_GOOD) + "\n" + bad_line)
    config = _config(train_data_path=path)
    config_lib.validate(config)
    expected = f"^config.train_data_path='{path}': {pattern}"
    with self.assertRaisesRegex(ValueError, expected) as caught:
      preflight.check(preflight.PreflightConfig.from_config(config))
    self.assertNotIn("\n", str(caught.exception))
    with self.assertRaisesRegex(ValueError, expected):
      dataset_kinds.make_dataset(data_config.DataConfig.from_config(config))

  def test_bad_files(self):
    cases = (
        ("/nonexistent/x.jsonl", "does not exist"),
        (self._write(""), "holds no example"),
        (self._write(b"\xff\xfe\n"), "not UTF-8 text"),
    )
    for path, problem in cases:
      with self.assertRaisesRegex(
          ValueError, f"^config.eval_data_path='{path}': {problem}"
      ):
        chat_dataset.check_config(
            data_config.DataConfig.from_config(_config(eval_data_path=path))
        )

  def test_tokenizer_fields(self):
    with self.assertRaisesRegex(
        ValueError, "config.tokenizer_path='': dataset_type='chat' needs"
    ):
      config_lib.validate(_config(tokenizer_path=""))
    with self.assertRaisesRegex(
        ValueError,
        "config.vocab_size=256: smaller than the vocabulary of "
        "tokenizer_path=.* \\(384 ids\\)",
    ):
      chat_dataset.check_config(
          data_config.DataConfig.from_config(_config(vocab_size=256))
      )
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        ValueError, f"config.tokenizer_path='{empty}': {empty}: no tokenizer"
    ):
      chat_dataset.check_config(
          data_config.DataConfig.from_config(_config(tokenizer_path=empty))
      )

  def test_tokenizer_must_be_the_imported_one(self):
    # An imported checkpoint's directory (step 0 beside its tokenizer files).
    imported = self.create_tempdir().full_path
    os.makedirs(os.path.join(imported, "0"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
      shutil.copy(os.path.join(sft_tiny.DATA_DIR, name), imported)
    with open(
        os.path.join(imported, "chat_template.jinja"), "w", encoding="utf-8"
    ) as f:
      f.write(
          "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
          "{% endfor %}"
      )
    with self.assertRaisesRegex(
        ValueError,
        "config.tokenizer_path=.*: its tokenizer or chat template differs "
        "from the one imported beside load_parameters_path=",
    ):
      chat_dataset.check_config(
          data_config.DataConfig.from_config(
              _config(load_parameters_path=os.path.join(imported, "0"))
          )
      )
    # tokenizer_path "" takes the checkpoint's files (the step's parent).
    config = _config(
        load_parameters_path=os.path.join(imported, "0"), tokenizer_path=""
    )
    chat_dataset.check_config(data_config.DataConfig.from_config(config))
    self.assertEqual(
        dataset_kinds.make_dataset(
            data_config.DataConfig.from_config(config)
        ).tokenizer.template_source,
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}",
    )


class PackedChatTest(absltest.TestCase):
  """With packing, rows hold several examples and the loss is theirs."""

  def test_packed_rows_hold_fewer_rows_and_the_same_loss(self):
    config = _config(packing=True)
    data = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config)
    )
    plain = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(_config())
    )
    seq = config.max_sequence_length
    batch = data.get_batch(2)
    rows = data.packed_rows(2)
    self.assertEqual(batch["inputs"].shape, (8, seq))
    self.assertGreater(sum(len(r) for r in rows), 8)  # More than one a row.
    # An epoch's rows hold every example once.
    epoch = [i for row in data.epoch_rows(0) for i in row]
    self.assertCountEqual(epoch, range(480))
    # The packed batch's loss is that of its examples, one padded row each.
    examples = [i for row in rows for i in row]
    # The unpacked rows of those examples: the module's own row builder.
    # pylint: disable-next=protected-access
    unpacked = chat_dataset._rows(plain.train, examples, seq)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    loss = jax.jit(lambda p, b: transformer.loss_fn(p, b, config))
    packed_loss, packed_aux = loss(params, batch)
    plain_loss, plain_aux = loss(params, unpacked)
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    np.testing.assert_allclose(
        packed_aux["loss_sum"], plain_aux["loss_sum"], rtol=1e-5
    )
    self.assertEqual(
        float(packed_aux["num_tokens"]), float(plain_aux["num_tokens"])
    )
    # Without the segment ids the loss differs: the test can fail.
    crossed, _ = loss(
        params, {k: batch[k] for k in ("inputs", "targets", "weights")}
    )
    self.assertGreater(abs(float(crossed) - float(plain_loss)), 1e-4)


class PromptGradientTest(absltest.TestCase):
  """The prompt's tokens carry no gradient: with the chat weights, changing
  what a prompt position must predict leaves every gradient as it was, and
  changing an assistant position's target does not."""

  def test_prompt_targets_do_not_move_the_gradient(self):
    config = _config()
    batch = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config)
    ).get_batch(0)
    params = transformer.init_params(config, jax.random.PRNGKey(0))

    @jax.jit
    def grads(targets):
      return jax.grad(
          lambda p: transformer.loss_fn(
              p, dict(batch, targets=targets), config
          )[0]
      )(params)

    weights = batch["weights"]
    prompt = np.argwhere((weights == 0) & (np.arange(weights.shape[1]) < 20))
    reply = np.argwhere(weights > 0)
    self.assertGreater(len(prompt), 8)
    base = grads(jnp.asarray(batch["targets"]))

    def changed(positions):
      targets = batch["targets"].copy()
      for row, col in positions:
        targets[row, col] = (targets[row, col] + 7) % config.vocab_size
      return grads(jnp.asarray(targets))

    same = changed(prompt)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b)
        ),
        base,
        same,
    )
    moved = changed(reply[:1])
    difference = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(
            jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(moved)
        )
    )
    self.assertGreater(difference, 1e-6)


if __name__ == "__main__":
  absltest.main()
