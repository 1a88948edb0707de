"""Per-device training-state bytes, checked by hand on tiny configs."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.configs import default
from maxtext.configs import moe_tiny
from tools.benchmarks import state_memory

# default.py's parameters: embedding and unembedding 256 x 128, final norm
# 128, and per layer (2 layers) wq + wo 2 x 128 x 4 x 32, wk + wv
# 2 x 128 x 2 x 32, two norms of 128, the SwiGLU MLP 3 x 128 x 512.
_DEFAULT = 2 * 256 * 128 + 128 + 2 * (2 * 16384 + 2 * 8192 + 256 + 196608)
# moe_tiny's 4 routed experts (one MoE layer, 3 x 128 x 128 each) and its
# router (128 x 4) have an experts dimension; the rest has none. Its other
# parameters: default's with layer 1's MLP replaced by a shared expert.
_MOE_EXPERTS = 4 * 3 * 128 * 128 + 128 * 4
_MOE_REST = _DEFAULT - 196608 + 3 * 128 * 128
_F32 = 4


class StateMemoryTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # Every dimension FSDP picks divides by 2: everything halves.
      ("fsdp", default.get_config, "fsdp=2", _DEFAULT // 2),
      # Data parallelism replicates.
      ("data", default.get_config, "data=4", _DEFAULT),
      # The expert axis holds a share of the batch: it halves everything,
      # the experts by their experts dimension, the rest like FSDP.
      (
          "expert",
          moe_tiny.get_config,
          "expert=2",
          _MOE_REST // 2 + _MOE_EXPERTS // 2,
      ),
      (
          "expert_and_fsdp",
          moe_tiny.get_config,
          "expert=2,fsdp=2",
          _MOE_REST // 4 + _MOE_EXPERTS // 4,
      ),
      # Data parallelism still replicates, expert groups or not.
      (
          "expert_fsdp_data",
          moe_tiny.get_config,
          "expert=2,fsdp=2,data=2",
          _MOE_REST // 4 + _MOE_EXPERTS // 4,
      ),
  )
  def test_bytes_by_hand(self, get_config, mesh, params_per_device):
    state = state_memory.state_bytes(
        get_config(), state_memory.parse_mesh(mesh)
    )
    self.assertEqual(state.params, params_per_device * _F32)
    # The gradient accumulator is float32, like the float32 parameters.
    self.assertEqual(state.grads, state.params)
    # AdamW's two moments, plus the optimizer's int32 step counters.
    self.assertBetween(state.opt_state - 2 * state.params, 4, 16)
    self.assertEqual(state.total, state.params + state.grads + state.opt_state)

  def test_bfloat16_weights_halve_parameters_not_gradients(self):
    config = default.get_config()
    config.weight_dtype = "bfloat16"
    state = state_memory.state_bytes(config, state_memory.parse_mesh("fsdp=1"))
    self.assertEqual(state.params, _DEFAULT * 2)
    self.assertEqual(state.grads, _DEFAULT * _F32)
    self.assertBetween(state.opt_state - 2 * state.params, 4, 16)

  def test_parse_mesh(self):
    self.assertEqual(
        state_memory.parse_mesh("expert=32, fsdp=8"),
        {"data": 1, "fsdp": 8, "expert": 32},
    )
    for bad, message in (
        ("tensor=2", "got 'tensor=2'"),
        ("fsdp=2,fsdp=4", "got 'fsdp=4'"),
        ("fsdp", "got 'fsdp'"),
        ("fsdp=0", "fsdp must be a positive integer"),
        ("fsdp=x", "fsdp must be a positive integer"),
    ):
      with self.subTest(bad), self.assertRaisesRegex(ValueError, message):
        state_memory.parse_mesh(bad)

  def test_expert_axis_must_divide_the_experts(self):
    with self.assertRaisesRegex(ValueError, "expert_parallelism=3"):
      state_memory.state_bytes(
          moe_tiny.get_config(), state_memory.parse_mesh("expert=3")
      )


if __name__ == "__main__":
  absltest.main()
