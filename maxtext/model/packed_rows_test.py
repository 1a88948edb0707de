"""Packed rows through the model (`transformer.Rows`): each sequence of a
row gives the logits and loss it gives alone, for every attention type and
implementation that takes segment ids; the cuDNN refusal."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import layers
from maxtext.model import transformer
from testing import tiny_configs

# A 64-token row: three sequences, then 6 padding tokens (a run of its own).
_LENGTHS = (20, 27, 11)
_ROW = 64


def _packed(lengths=_LENGTHS, row=_ROW):
  """(segment_ids, positions) int32 [1, row]: sequences 1.., padding 0."""
  pad = row - sum(lengths)
  ids = np.concatenate(
      [np.repeat(np.arange(1, len(lengths) + 1), lengths), np.zeros(pad)]
  )
  positions = np.concatenate([np.arange(n) for n in (*lengths, pad)])
  return (
      jnp.asarray(ids[None], jnp.int32),
      jnp.asarray(positions[None], jnp.int32),
  )


def _alone(row):
  """[len(_LENGTHS), _ROW]: each sequence of `row` ([1, _ROW]) at the start
  of a row of its own, the rest of `row` after it (wrapped round).

  The model is causal, so a sequence's logits and losses there are those it
  has alone; one call of one shape gives every sequence's (a call per length
  compiled a program per length).
  """
  starts = np.cumsum((0,) + _LENGTHS[:-1])
  return jnp.concatenate([jnp.roll(row, -start, axis=1) for start in starts])


def _config(preset, attention):
  config = tiny_configs.model_config(
      *preset, max_sequence_length=_ROW, attention=attention
  )
  config.packing = True
  return config


_CASES = (
    dict(testcase_name="gqa_einsum", preset=(), attention="einsum"),
    dict(testcase_name="gqa_dot_product", preset=(), attention="dot_product"),
    dict(testcase_name="gqa_splash", preset=(), attention="splash"),
    dict(
        testcase_name="qk_norm_dot_product",
        preset=(tiny_configs.TINY_QWEN3,),
        attention="dot_product",
    ),
    dict(
        testcase_name="mla_einsum",
        preset=(tiny_configs.TINY_MLA,),
        attention="einsum",
    ),
    dict(
        testcase_name="mla_moe_dot_product",
        preset=(tiny_configs.TINY_MLA, tiny_configs.TINY_MOE),
        attention="dot_product",
    ),
    dict(
        testcase_name="moe_einsum",
        preset=(tiny_configs.TINY_MOE,),
        attention="einsum",
    ),
)


class PackedRowsTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_each_sequence_has_its_logits_alone(self, preset, attention):
    config = _config(preset, attention)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.asarray(
        np.random.default_rng(0).integers(0, config.vocab_size, (1, _ROW)),
        jnp.int32,
    )
    segment_ids, positions = _packed()
    apply = jax.jit(functools.partial(transformer.apply, config=config))
    packed = apply(
        params, tokens, rows=transformer.Rows(segment_ids, positions)
    )
    # Without rows, in one call: the row as it is, then each sequence alone.
    plain = apply(params, jnp.concatenate([tokens, _alone(tokens)]))
    unpacked, alone = plain[:1], plain[1:]
    start = 0
    for i, length in enumerate(_LENGTHS):
      np.testing.assert_allclose(
          packed[:, start : start + length],
          alone[i : i + 1, :length],
          rtol=2e-5,
          atol=2e-5,
      )
      start += length
    # Without the rows the later sequences see the earlier ones.
    self.assertGreater(
        float(
            jnp.max(
                jnp.abs(unpacked[:, _LENGTHS[0] :] - packed[:, _LENGTHS[0] :])
            )
        ),
        1e-3,
    )

  @parameterized.named_parameters(*_CASES[:2], _CASES[4], _CASES[6])
  def test_loss_of_a_packed_batch_sums_the_sequences(self, preset, attention):
    config = _config(preset, attention)
    params = transformer.init_params(config, jax.random.PRNGKey(1))
    rng = np.random.default_rng(1)
    inputs = jnp.asarray(
        rng.integers(0, config.vocab_size, (1, _ROW)), jnp.int32
    )
    targets = jnp.asarray(
        rng.integers(0, config.vocab_size, (1, _ROW)), jnp.int32
    )
    segment_ids, positions = _packed()
    weights = jnp.where(segment_ids > 0, 1.0, 0.0)
    loss = jax.jit(functools.partial(transformer.loss_fn, config=config))
    _, packed = loss(
        params,
        {
            "inputs": inputs,
            "targets": targets,
            "weights": weights,
            "segment_ids": segment_ids,
            "positions": positions,
        },
    )
    # The sequences alone, in one call: the sums over the rows of `_alone`,
    # each weighted over its sequence's positions only.
    _, alone = loss(
        params,
        {
            "inputs": _alone(inputs),
            "targets": _alone(targets),
            "weights": jnp.asarray(
                np.arange(_ROW)[None] < np.asarray(_LENGTHS)[:, None],
                jnp.float32,
            ),
        },
    )
    np.testing.assert_allclose(packed["loss_sum"], alone["loss_sum"], rtol=1e-5)
    self.assertEqual(float(packed["num_tokens"]), sum(_LENGTHS))
    self.assertEqual(float(alone["num_tokens"]), sum(_LENGTHS))

  def test_cudnn_takes_no_segment_ids(self):
    q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
    with self.assertRaisesRegex(ValueError, "'cudnn' takes no segment ids"):
      layers.attend(q, q, q, "cudnn", segment_ids=jnp.zeros((1, 8), jnp.int32))


if __name__ == "__main__":
  absltest.main()
