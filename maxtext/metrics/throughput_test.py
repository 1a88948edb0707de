"""Tests for maxtext.metrics.throughput: peaks, the FLOP count, the figures."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import ml_collections
import numpy as np

from maxtext.model import transformer
from maxtext.configs import base
from maxtext.configs import gpu_1b
from maxtext.metrics import throughput
from testing import tiny_configs


def _config(**overrides) -> ml_collections.ConfigDict:
  config = base.get_config()
  config.update(overrides)
  return config


def _one_b() -> ml_collections.ConfigDict:
  """gpu_1b.py's model as the accelerators issue measured it.

  The 1B-class model (16 layers, emb 2048, 16 heads, 8 kv heads, head_dim
  128, mlp 8192, vocab 32768, bfloat16 compute) on sequences of 1024 tokens,
  8 per step.
  """
  config = gpu_1b.get_config()
  config.update(dict(max_sequence_length=1024, global_batch_size=8))
  return config


def _settings(config) -> throughput.ThroughputConfig:
  return throughput.ThroughputConfig.from_config(config)


def _abstract_params(config):
  """The shapes and dtypes of `config`'s parameters (nothing allocated)."""
  return jax.eval_shape(
      lambda: transformer.init_params(config, jax.random.PRNGKey(0))
  )


def _size(x) -> int:
  return int(np.prod(x.shape))


class PeakTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("h200_bf16", "NVIDIA H200", "bfloat16", 989e12),
      ("h100_sxm_fp16", "NVIDIA H100 80GB HBM3", "float16", 989e12),
      ("h100_pcie", "NVIDIA H100 PCIe", "bfloat16", 756e12),
      ("a100_fp32_runs_tf32", "NVIDIA A100-SXM4-80GB", "float32", 156e12),
      ("tpu_v4", "TPU v4", "bfloat16", 275e12),
      ("tpu_v5e_as_jax_names_it", "TPU v5 lite", "bfloat16", 197e12),
      ("tpu_v5p_as_jax_names_it", "TPU v5", "bfloat16", 459e12),
      ("tpu_v6e", "TPU v6e", "bfloat16", 918e12),
      ("tpu7x_one_tensorcore", "TPU7x", "bfloat16", 1153.5e12),
      ("cpu", "cpu", "bfloat16", None),
      ("tpu_fp32_runs_bf16", "TPU v4", "float32", 275e12),
      ("tpu_fp16_unlisted", "TPU v4", "float16", None),
      ("unknown_dtype", "NVIDIA H200", "int8", None),
  )
  def test_peak(self, kind, dtype, expected):
    self.assertEqual(throughput.peak_flops_per_device(kind, dtype), expected)

  def test_default_dtype_is_bfloat16(self):
    self.assertEqual(throughput.peak_flops_per_device("TPU v6 lite"), 918e12)

  def test_every_listed_kind_has_bfloat16_and_float32_peaks(self):
    for kind in throughput.known_device_kinds():
      bf16 = throughput.peak_flops_per_device(kind, "bfloat16")
      fp32 = throughput.peak_flops_per_device(kind, "float32")
      self.assertGreater(bf16, 1e14, kind)
      self.assertBetween(fp32, bf16 / 2, bf16)

  @parameterized.named_parameters(
      ("kind", 3, "bfloat16", "device_kind"), ("dtype", "TPU v4", None, "dtype")
  )
  def test_peak_rejects_non_strings(self, kind, dtype, regex):
    with self.assertRaisesRegex(TypeError, regex):
      throughput.peak_flops_per_device(kind, dtype)

  def test_mean_peak_of_a_mix_and_of_an_unknown(self):
    self.assertEqual(
        throughput.mean_peak_flops_per_device(
            ["NVIDIA H200", "NVIDIA H100 PCIe"]
        ),
        (989e12 + 756e12) / 2,
    )
    self.assertIsNone(
        throughput.mean_peak_flops_per_device(["NVIDIA H200", "cpu"])
    )
    with self.assertRaisesRegex(ValueError, "device_kinds"):
      throughput.mean_peak_flops_per_device([])


class FlopsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("base", {}),
      (
          "grouped_query",
          dict(
              num_heads=4,
              num_kv_heads=2,
              head_dim=8,
              mlp_dim=48,
              num_layers=3,
              vocab_size=40,
          ),
      ),
  )
  def test_matmul_params_are_the_models_matrices(self, overrides):
    config = _config(**overrides)
    shapes = _abstract_params(config)
    layers = shapes["layers"]
    expected = (
        sum(_size(x) for x in jax.tree_util.tree_leaves(shapes))
        - _size(shapes["embedding"])
        - _size(shapes["final_norm"])
        - _size(layers["attn_norm"])
        - _size(layers["mlp_norm"])
    )
    self.assertEqual(throughput.matmul_params(_settings(config)), expected)

  @parameterized.named_parameters(
      (
          "top2_shared_dense_first",
          dict(num_dense_layers=1, num_shared_experts=1),
      ),
      ("top1_all_moe", dict(num_experts_per_token=1, moe_mlp_dim=0)),
  )
  def test_moe_matmul_params_count_active_experts(self, overrides):
    values = dict(
        num_layers=3, num_experts=8, num_experts_per_token=2, moe_mlp_dim=24
    )
    values.update(overrides)
    config = _config(**values)
    shapes = _abstract_params(config)
    moe = shapes["moe_layers"]
    # Every matrix, minus the experts a token does not go through.
    inactive = (config.num_experts - config.num_experts_per_token) / (
        config.num_experts
    )
    expected = sum(_size(x) for x in jax.tree_util.tree_leaves(shapes))
    expected -= _size(shapes["embedding"]) + _size(shapes["final_norm"])
    for stack in ("layers", "moe_layers"):
      if stack in shapes:
        expected -= _size(shapes[stack]["attn_norm"]) + _size(
            shapes[stack]["mlp_norm"]
        )
    expected -= inactive * sum(
        _size(moe[n]) for n in ("w_gate", "w_up", "w_down")
    )
    self.assertEqual(throughput.matmul_params(_settings(config)), expected)

  def test_flops_per_token_convention(self):
    config = _one_b()
    # The 1B-class model has exactly 2**30 matmul parameters.
    self.assertEqual(throughput.matmul_params(_settings(config)), 2**30)
    attention = 12 * 16 * 16 * 128 * 1024  # Full sequence, no causal half.
    self.assertEqual(
        throughput.training_flops_per_token(_settings(config)),
        6 * 2**30 + attention,
    )

  @parameterized.named_parameters(
      # E 16, H 2, C 6, N 3, R 2, Dv 5, one layer, M 8, V 10, S 4. Attention:
      # queries 16*4 + 4*2*(3+2) = 104 (Q 4) or 16*2*(3+2) = 160 (Q 0);
      # keys/values 16*(6+2) + 6*2*(3+5) = 224; output 2*5*16 = 160. MLP
      # 3*16*8 = 384, unembedding 16*10 = 160. Scores and values:
      # 6 * 1 layer * 2 heads * ((3+2) + 5) * 4 positions = 480.
      ("low_rank_q", 4, 104 + 224 + 160 + 384 + 160),
      ("full_rank_q", 0, 160 + 224 + 160 + 384 + 160),
  )
  def test_mla_counts_by_hand(self, q_lora_rank, matmul_params):
    config = _config(
        attention_type="mla",
        emb_dim=16,
        num_heads=2,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=6,
        qk_nope_head_dim=3,
        qk_rope_head_dim=2,
        v_head_dim=5,
        num_layers=1,
        mlp_dim=8,
        vocab_size=10,
        max_sequence_length=4,
    )
    self.assertEqual(throughput.matmul_params(_settings(config)), matmul_params)
    self.assertEqual(
        throughput.training_flops_per_token(_settings(config)),
        6 * matmul_params + 480,
    )

  @parameterized.named_parameters(
      ("dense", dict()),
      # Every expert is active (top-4 of 4), so every matrix counts.
      ("experts", dict(tiny_configs.TINY_MOE, num_experts_per_token=4)),
  )
  def test_mla_matmul_params_are_the_models_matrices(self, overrides):
    config = _config(num_layers=2, **tiny_configs.TINY_MLA, **overrides)
    shapes = _abstract_params(config)
    norms = ("attn_norm", "mlp_norm", "q_norm", "kv_norm", "final_norm")
    expected = sum(
        _size(x)
        for path, x in jax.tree_util.tree_leaves_with_path(shapes)
        if path[-1].key not in norms + ("embedding",)
    )
    self.assertEqual(throughput.matmul_params(_settings(config)), expected)

  def test_reproduces_the_issues_h200_measurement(self):
    # The accelerators issue measured this model at 44,233 tokens/s on one
    # H200 and reported MFU 30.6% with the same convention and peak.
    run = throughput.StepThroughput.for_run(
        _settings(_one_b()), ["NVIDIA H200"]
    )
    step_time = run.tokens_per_step / 44233
    self.assertAlmostEqual(
        run.figures(step_time)[throughput.MFU_KEY], 0.306, delta=0.0005
    )


class StepThroughputTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (
          "with_a_peak",
          dict(
              samples_per_step=8,
              tokens_per_step=8192,
              flops_per_step=4e15,
              num_devices=4,
              peak_flops_per_device=1e15,
          ),
          0.5,
          {
              "samples_per_s": 16.0,
              "tokens_per_s": 16384.0,
              "tflops_per_device": 2000.0,
              "mfu": 2.0,
          },
      ),
      (
          "no_mfu_without_a_peak",
          dict(
              samples_per_step=2,
              tokens_per_step=20,
              flops_per_step=3e12,
              num_devices=3,
          ),
          2.0,
          {
              "samples_per_s": 1.0,
              "tokens_per_s": 10.0,
              "tflops_per_device": 0.5,
          },
      ),
  )
  def test_figures(self, args, step_time, expected):
    run = throughput.StepThroughput(**args)
    figures = run.figures(step_time)
    self.assertEqual(figures, expected)
    self.assertEqual(tuple(figures), run.keys())
    # With a peak every key, without one all but the last (the MFU).
    self.assertEqual(run.keys(), throughput.KEYS[: len(expected)])

  def test_zero_step_time_gives_infinite_figures(self):
    run = throughput.StepThroughput(1, 1, 1.0, 1, 1.0)
    self.assertTrue(all(math.isinf(v) for v in run.figures(0.0).values()))

  def test_for_run_on_cpu_devices(self):
    config = _config(global_batch_size=4, max_sequence_length=16)
    run = throughput.StepThroughput.for_run(_settings(config), ["cpu"] * 2)
    self.assertEqual(
        (
            run.samples_per_step,
            run.tokens_per_step,
            run.num_devices,
            run.peak_flops_per_device,
        ),
        (4, 64, 2, None),
    )
    self.assertEqual(
        run.flops_per_step,
        64 * throughput.training_flops_per_token(_settings(config)),
    )
    self.assertNotIn(throughput.MFU_KEY, run.figures(1.0))

  def test_for_run_peak_follows_the_compute_dtype(self):
    kinds = ["NVIDIA H200"] * 8
    fp32 = throughput.StepThroughput.for_run(
        _settings(_config(compute_dtype="float32")), kinds
    )
    self.assertEqual(fp32.peak_flops_per_device, 494.5e12)
    bf16 = throughput.StepThroughput.for_run(
        _settings(_config(compute_dtype="float32")), kinds, dtype="bfloat16"
    )
    self.assertEqual(bf16.peak_flops_per_device, 989e12)

  def test_for_run_without_devices(self):
    with self.assertRaisesRegex(ValueError, "device_kinds"):
      throughput.StepThroughput.for_run(_settings(_config()), [])

  @parameterized.named_parameters(
      ("samples", dict(samples_per_step=0), ValueError, "samples_per_step"),
      ("tokens", dict(tokens_per_step=2.0), TypeError, "tokens_per_step"),
      ("flops", dict(flops_per_step=-1.0), ValueError, "flops_per_step"),
      (
          "flops_nan",
          dict(flops_per_step=math.nan),
          ValueError,
          "flops_per_step",
      ),
      ("devices", dict(num_devices=True), TypeError, "num_devices"),
      (
          "peak",
          dict(peak_flops_per_device=0.0),
          ValueError,
          "peak_flops_per_device",
      ),
  )
  def test_bad_arguments(self, override, error, regex):
    args = dict(
        samples_per_step=1,
        tokens_per_step=1,
        flops_per_step=1.0,
        num_devices=1,
        peak_flops_per_device=None,
    )
    args.update(override)
    with self.assertRaisesRegex(error, regex):
      throughput.StepThroughput(**args)


if __name__ == "__main__":
  absltest.main()
