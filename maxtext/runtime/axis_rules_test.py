"""Logical-axis rules on hand-made shapes: what each dimension is split over."""

from absl.testing import absltest
from jax.sharding import PartitionSpec as P

from maxtext.runtime import axis_rules

_MOE_MESH = {"data": 2, "fsdp": 4, "expert": 2}


def _spec(shape, names, sizes=None, rules=axis_rules.PARAMETERS):
  sizes = _MOE_MESH if sizes is None else sizes
  return axis_rules.partition_spec(shape, names, sizes, rules)


class AxisRulesTest(absltest.TestCase):

  def test_experts_over_expert_the_rest_over_fsdp(self):
    self.assertEqual(
        _spec((2, 8, 64, 16), ("layers", "experts", "embed", "moe_mlp")),
        P(None, "expert", "fsdp", None),
    )
    # The router: its experts dimension by name, its embed by FSDP.
    self.assertEqual(
        _spec((2, 64, 8), ("layers", "embed", "experts")),
        P(None, "fsdp", "expert"),
    )

  def test_non_expert_weights_over_fsdp_and_expert(self):
    self.assertEqual(
        _spec((2, 64, 128), ("layers", "embed", "mlp")),
        P(None, None, ("fsdp", "expert")),
    )
    self.assertEqual(
        _spec((256, 64), ("vocab", "embed")), P(("fsdp", "expert"), None)
    )
    # Data parallelism replicates.
    self.assertEqual(
        _spec((256, 64), ("vocab", "embed"), {"data": 8}), P(None, None)
    )

  def test_the_old_layout_keeps_non_expert_weights_on_fsdp(self):
    rules = axis_rules.FSDP_ONLY
    self.assertEqual(
        _spec((2, 64, 128), ("layers", "embed", "mlp"), rules=rules),
        P(None, None, "fsdp"),
    )
    self.assertEqual(
        _spec((2, 8, 64, 16), ("layers", "experts", "embed", "moe_mlp")),
        _spec(
            (2, 8, 64, 16),
            ("layers", "experts", "embed", "moe_mlp"),
            rules=rules,
        ),
    )

  def test_a_dimension_that_fsdp_x_expert_does_not_divide(self):
    # 12 is the largest, but only 8 divides by 4 x 2 = 8 devices.
    self.assertEqual(
        _spec((12, 8), ("mlp", "embed")), P(None, ("fsdp", "expert"))
    )
    # Nothing divides by 8: the expert axis is dropped, 4 divides 12.
    self.assertEqual(_spec((12, 6), ("mlp", "embed")), P("fsdp", None))
    # Nothing divides even by fsdp's 4: replicated.
    self.assertEqual(_spec((2, 6), ("layers", "embed")), P(None, None))

  def test_layers_and_experts_are_never_split_by_fsdp(self):
    self.assertEqual(_spec((64, 6), ("layers", "norm")), P(None, None))
    # Without an expert axis the experts dimension stays whole.
    self.assertEqual(
        _spec(
            (2, 64, 16, 8),
            ("layers", "experts", "embed", "moe_mlp"),
            {"fsdp": 4},
        ),
        P(None, None, "fsdp", None),
    )

  def test_axes_of_size_one_are_skipped(self):
    self.assertEqual(
        _spec((2, 64, 128), ("layers", "embed", "mlp"), {"fsdp": 4}),
        P(None, None, "fsdp"),
    )
    self.assertEqual(
        _spec((2, 64, 128), ("layers", "embed", "mlp"), {"expert": 4}),
        P(None, None, "expert"),
    )
    self.assertEqual(
        _spec((2, 64, 128), ("layers", "embed", "mlp"), {}),
        P(None, None, None),
    )

  def test_experts_that_the_expert_axis_does_not_divide(self):
    with self.assertRaisesRegex(
        ValueError, r"^expert_parallelism=3 does not divide the 4 experts$"
    ):
      _spec(
          (2, 4, 8, 8), ("layers", "experts", "embed", "moe_mlp"), {"expert": 3}
      )

  def test_a_name_per_dimension(self):
    with self.assertRaisesRegex(ValueError, "no name for each"):
      _spec((2, 4), ("embed",))

  def test_largest_dividing(self):
    self.assertEqual(axis_rules.largest_dividing((8, 16, 16), "abc", 8), 1)
    self.assertEqual(
        axis_rules.largest_dividing((8, 16, 16), "abc", 8, taken=(1,)), 2
    )
    self.assertEqual(
        axis_rules.largest_dividing((8, 16), "ab", 8, skip=("b",)), 0
    )
    self.assertIsNone(axis_rules.largest_dividing((8, 16), "ab", 1))
    self.assertIsNone(axis_rules.largest_dividing((6, 10), "ab", 4))


if __name__ == "__main__":
  absltest.main()
