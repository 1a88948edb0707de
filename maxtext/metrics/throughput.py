"""Training throughput: samples/s, tokens/s, TFLOP/s per device and MFU.

One module holds the peak table and the FLOP convention, so the console
line, `metrics.jsonl`, TensorBoard, the MLPerf log's `tracked_stats` and the
benchmarks report the same figures.

FLOP convention (model FLOPs, as MaxText and PaLM count them): a training
step costs, per token,

  6 * N + 6 * L * H * (D_qk + D_v) * S

where N is the number of parameters that take part in a matmul (every weight
matrix and the unembedding; the embedding is a lookup and the norm scales are
element-wise, so neither counts), 6 = 2 forward + 4 backward FLOPs per
parameter, and the second term is attention's score (QK^T) and value (AV)
products: per layer and token, S x H x D_qk and S x H x D_v multiply-adds,
forward and backward, over the full sequence length S. With grouped-query
attention D_qk = D_v = head_dim, so the term is 12 * L * H * D * S; with
multi-head latent attention (`attention_type` "mla") D_qk =
qk_nope_head_dim + qk_rope_head_dim and D_v = v_head_dim. The causal mask is
not subtracted, and rematerialisation is not counted: the figure is what the
model needs, not what the hardware ran.

MFU is the model FLOP/s per device over the device's published dense peak for
the compute dtype (`peak_flops_per_device`); None where the peak is unknown
(a CPU, or an accelerator not in the table).

The module needs neither JAX nor a device: callers pass device kind strings
(`jax.Device.device_kind`).

The figures' settings are `ThroughputConfig`: the config's fields of its
names (`maxtext/core/component_config.py`), the model shape the FLOP
convention counts and the step's batch. The model's own config
(`maxtext/model/model_config.py`) sits on a layer above this one, so the
shape fields the count reads are declared here again.
"""

from collections.abc import Sequence
import dataclasses
import math
from typing import Optional

from maxtext.core import checks
from maxtext.core import component_config

# Keys of the figures, in `metrics.jsonl` train records, TensorBoard
# (`train/<key>`) and the MLPerf log's `tracked_stats`.
SAMPLES_PER_SECOND_KEY = "samples_per_s"
TOKENS_PER_SECOND_KEY = "tokens_per_s"
TFLOPS_PER_DEVICE_KEY = "tflops_per_device"
MFU_KEY = "mfu"
KEYS = (
    SAMPLES_PER_SECOND_KEY,
    TOKENS_PER_SECOND_KEY,
    TFLOPS_PER_DEVICE_KEY,
    MFU_KEY,
)

_TERA = 1e12

# Published dense (no sparsity) peak FLOP/s per device, by
# `jax.Device.device_kind`, per compute dtype. One JAX device is one chip on
# every kind listed but TPU7x (TPU v4 and v5p run their two TensorCores as
# one megacore device). NVIDIA quotes tensor-core peaks "with sparsity"; the
# dense figure is half of it.
# "float32" is the peak of the units a float32 matmul runs on at JAX's
# default precision (the project sets none): "float32 dot products may be
# computed with reduced-precision arithmetic internally (bfloat16 on TPU, TF32
# on recent GPUs)" (JAX docs, "Matmul precision"). So it is the TF32 tensor
# core peak on NVIDIA and the bfloat16 peak on TPU.
_A100 = {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12}
# NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS
# (624 with sparsity), TF32 Tensor Core 156 TFLOPS (312 with sparsity); the
# same for the 40 GB, 80 GB, SXM4 and PCIe parts.
_H100_SXM = {"bfloat16": 989e12, "float16": 989e12, "float32": 494.5e12}
# NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16/FP16 Tensor Core
# 1,979 TFLOPS with sparsity (989 dense), TF32 989 with sparsity.
_H100_PCIE = {"bfloat16": 756e12, "float16": 756e12, "float32": 378e12}
# Same datasheet, H100 PCIe: BF16/FP16 1,513 TFLOPS with sparsity, TF32 756.
_H200 = _H100_SXM
# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16/FP16 Tensor Core
# 1,979 TFLOPS with sparsity (989 dense), TF32 989 with sparsity (the H100
# SXM's compute with more, faster memory).
_TPU_V4 = {"bfloat16": 275e12, "float32": 275e12}
# Google Cloud TPU docs, "TPU v4": 275 bf16 TFLOPs peak compute per chip.
_TPU_V5E = {"bfloat16": 197e12, "float32": 197e12}
# Google Cloud TPU docs, "TPU v5e": 197 bf16 TFLOPs per chip.
_TPU_V5P = {"bfloat16": 459e12, "float32": 459e12}
# Google Cloud TPU docs, "TPU v5p": 459 bf16 TFLOPs per chip.
_TPU_V6E = {"bfloat16": 918e12, "float32": 918e12}
# Google Cloud TPU docs, "TPU v6e" (Trillium): 918 bf16 TFLOPs per chip.
_TPU7X = {"bfloat16": 1153.5e12, "float32": 1153.5e12}
# Google Cloud TPU docs, "TPU7x" (Ironwood): 4,614 FP8 TFLOPs, 2,307 bf16
# TFLOPs per chip; JAX runs each of a chip's two TensorCores as one device,
# so a device's peak is half the chip's.

_PEAK_FLOPS = {
    "TPU v4": _TPU_V4,
    "TPU v5 lite": _TPU_V5E,  # What JAX reports for a v5e.
    "TPU v5e": _TPU_V5E,
    "TPU v5": _TPU_V5P,  # What JAX reports for a v5p.
    "TPU v5p": _TPU_V5P,
    "TPU v6 lite": _TPU_V6E,  # What JAX reports for a v6e.
    "TPU v6e": _TPU_V6E,
    "TPU7x": _TPU7X,  # What JAX reports for a TPU7x (v7x) TensorCore.
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H200": _H200,
}


def known_device_kinds() -> tuple[str, ...]:
  """The device kinds with a peak in the table, sorted."""
  return tuple(sorted(_PEAK_FLOPS))


def peak_flops_per_device(
    device_kind: str, dtype: str = "bfloat16"
) -> Optional[float]:
  """Published dense peak FLOP/s of one device of `device_kind`.

  Args:
    device_kind: `jax.Device.device_kind`, e.g. "NVIDIA H200", "TPU v5 lite".
    dtype: the matmuls' compute dtype: "bfloat16", "float16" or "float32".

  Returns:
    The peak in FLOP/s, or None where the table has none (a CPU, an
    unlisted accelerator, a dtype without a published peak).

  Raises:
    TypeError: `device_kind` or `dtype` is not a str.
  """
  if not isinstance(device_kind, str):
    raise TypeError(f"device_kind must be a str, got {device_kind!r}")
  if not isinstance(dtype, str):
    raise TypeError(f"dtype must be a str, got {dtype!r}")
  return _PEAK_FLOPS.get(device_kind, {}).get(dtype)


def mean_peak_flops_per_device(
    device_kinds: Sequence[str], dtype: str = "bfloat16"
) -> Optional[float]:
  """The devices' summed peak over their count, or None if any is unknown.

  With this mean as the per-device peak, MFU is the run's total model FLOP/s
  over the devices' total peak, also on a mix of kinds.

  Raises:
    ValueError: `device_kinds` is empty.
    TypeError: a kind or `dtype` is not a str.
  """
  if not device_kinds:
    raise ValueError(
        "device_kinds must name at least one device, got " f"{device_kinds!r}"
    )
  peaks = [peak_flops_per_device(kind, dtype) for kind in device_kinds]
  if None in peaks:
    return None
  return math.fsum(peaks) / len(peaks)


@dataclasses.dataclass(frozen=True)
class ThroughputConfig(component_config.ComponentConfig):
  """What the FLOP count and the step's figures read
  (`maxtext/configs/base.py` documents each field; `config_lib.validate`
  checks them).

  Attributes:
    emb_dim, num_heads, num_kv_heads, head_dim, mlp_dim, num_layers,
      vocab_size: the model's shape (`matmul_params`).
    attention_type, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
      qk_rope_head_dim, v_head_dim: multi-head latent attention's shape
      (`attention_type` "mla").
    num_experts, num_dense_layers, moe_mlp_dim, num_experts_per_token,
      num_shared_experts: the mixture of experts' shape (`num_experts` > 0).
    max_sequence_length: tokens of a pretraining row.
    global_batch_size: rows of an optimizer step, all processes.
    compute_dtype: the dtype whose peak the MFU divides by.
  """

  emb_dim: int = 128
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 32
  mlp_dim: int = 512
  num_layers: int = 2
  vocab_size: int = 256
  attention_type: str = "gqa"
  q_lora_rank: int = 0
  kv_lora_rank: int = 0
  qk_nope_head_dim: int = 0
  qk_rope_head_dim: int = 0
  v_head_dim: int = 0
  num_experts: int = 0
  num_dense_layers: int = 0
  moe_mlp_dim: int = 0
  num_experts_per_token: int = 1
  num_shared_experts: int = 0
  max_sequence_length: int = 64
  global_batch_size: int = 16
  compute_dtype: str = "float32"


def matmul_params(settings: ThroughputConfig) -> int:
  """Parameters that take part in a matmul per token (N of the convention).

  Per layer the query, key, value and output projections (grouped-query
  attention: `num_kv_heads` key/value heads; multi-head latent attention:
  its low-rank projections, `_mla_params`) and the SwiGLU MLP's gate, up
  and down matrices; then the unembedding. The embedding (a lookup) and the
  norm scales are left out. A mixture-of-experts layer (`num_experts` > 0,
  after the first `num_dense_layers`) counts its active parameters: the
  router and the `num_experts_per_token` routed plus `num_shared_experts`
  shared experts a token goes through, each of width `moe_mlp_dim` (0 =
  `mlp_dim`).

  Args:
    settings: the model's shape.
  """
  e, h, k, d, m = (
      settings.emb_dim,
      settings.num_heads,
      settings.num_kv_heads,
      settings.head_dim,
      settings.mlp_dim,
  )
  if _is_mla(settings):
    attention = _mla_params(settings)
  else:
    attention = e * h * d + 2 * e * k * d + h * d * e
  experts = settings.num_experts
  if not experts:
    return (
        settings.num_layers * (attention + 3 * e * m) + e * settings.vocab_size
    )
  dense = settings.num_dense_layers
  width = settings.moe_mlp_dim or m
  active = settings.num_experts_per_token + settings.num_shared_experts
  moe_layer = attention + e * experts + 3 * e * width * active
  return (
      dense * (attention + 3 * e * m)
      + (settings.num_layers - dense) * moe_layer
      + e * settings.vocab_size
  )


def _is_mla(settings: ThroughputConfig) -> bool:
  return settings.attention_type == "mla"


def _mla_params(settings: ThroughputConfig) -> int:
  """Matmul parameters of one multi-head latent attention layer.

  Queries: E x Q down and Q x H(N+R) up (`q_lora_rank` Q > 0), or E x H(N+R);
  keys/values: E x (C + R) down (the latent and the shared rotary key) and
  C x H(N+D) up; output: H D x E (C kv_lora_rank, N qk_nope_head_dim,
  R qk_rope_head_dim, D v_head_dim; `maxtext.mla`).
  """
  e, h = settings.emb_dim, settings.num_heads
  q, c = settings.q_lora_rank, settings.kv_lora_rank
  n, r, d = (
      settings.qk_nope_head_dim,
      settings.qk_rope_head_dim,
      settings.v_head_dim,
  )
  query = e * q + q * h * (n + r) if q else e * h * (n + r)
  return query + e * (c + r) + c * h * (n + d) + h * d * e


def training_flops_per_token(settings: ThroughputConfig) -> int:
  """Model FLOPs of one training token, forward and backward.

  `6 * matmul_params(settings) + 6 * num_layers * num_heads * (D_qk + D_v) *
  max_sequence_length`, D_qk = D_v = head_dim for grouped-query attention
  (the module docstring states the convention).
  """
  if _is_mla(settings):
    widths = (
        settings.qk_nope_head_dim
        + settings.qk_rope_head_dim
        + settings.v_head_dim
    )
  else:
    widths = 2 * settings.head_dim
  attention = (
      6
      * settings.num_layers
      * settings.num_heads
      * widths
      * settings.max_sequence_length
  )
  return 6 * matmul_params(settings) + attention


@dataclasses.dataclass(frozen=True)
class StepThroughput:
  """A run's per-step constants; turns a step time into throughput figures.

  Built once per run; `figures(step_time)` then costs one division and a few
  multiplications, so it can run on every step.

  Attributes:
    samples_per_step: samples (sequences) per optimizer step, all processes.
    tokens_per_step: tokens per optimizer step, all processes.
    flops_per_step: model FLOPs per optimizer step, all devices (see the
      module docstring).
    num_devices: devices that share the step (all processes).
    peak_flops_per_device: dense peak FLOP/s of one device, or None when
      unknown (then no MFU).
  """

  samples_per_step: int
  tokens_per_step: int
  flops_per_step: float
  num_devices: int
  peak_flops_per_device: Optional[float] = None
  # Per-second figure = constant / step time; precomputed in __post_init__.
  _tflops_per_device_s: float = dataclasses.field(
      init=False, repr=False, compare=False, default=0.0
  )
  _mfu_s: Optional[float] = dataclasses.field(
      init=False, repr=False, compare=False, default=None
  )

  def __post_init__(self):
    set_field = object.__setattr__  # The dataclass is frozen.
    set_field(
        self,
        "samples_per_step",
        checks.check_int("samples_per_step", self.samples_per_step, 1),
    )
    set_field(
        self,
        "tokens_per_step",
        checks.check_int("tokens_per_step", self.tokens_per_step, 1),
    )
    set_field(
        self,
        "flops_per_step",
        checks.check_number(
            "flops_per_step", self.flops_per_step, positive=True
        ),
    )
    set_field(
        self,
        "num_devices",
        checks.check_int("num_devices", self.num_devices, 1),
    )
    if self.peak_flops_per_device is not None:
      set_field(
          self,
          "peak_flops_per_device",
          checks.check_number(
              "peak_flops_per_device", self.peak_flops_per_device, positive=True
          ),
      )
    per_device = self.flops_per_step / self.num_devices
    set_field(self, "_tflops_per_device_s", per_device / _TERA)
    if self.peak_flops_per_device is not None:
      set_field(self, "_mfu_s", per_device / self.peak_flops_per_device)

  @classmethod
  def for_run(
      cls,
      settings: ThroughputConfig,
      device_kinds: Sequence[str],
      dtype: Optional[str] = None,
      row_length: Optional[int] = None,
  ) -> "StepThroughput":
    """The constants of a run of `settings` on devices of `device_kinds`.

    Args:
      settings: the run's model shape and batch.
      device_kinds: `device_kind` of every device of the run, all processes
        (e.g. `[d.device_kind for d in jax.devices()]`).
      dtype: the compute dtype for the peak; None means
        `settings.compute_dtype`.
      row_length: tokens of each of a step's `global_batch_size` trained
        rows; None means `max_sequence_length` (pretraining). A GRPO step
        trains on its rollout's rows, prompt plus completion.

    Raises:
      ValueError, TypeError: no devices, or a field out of range.
    """
    samples = checks.check_int(
        "global_batch_size", settings.global_batch_size, 1
    )
    seq = (
        checks.check_int("max_sequence_length", settings.max_sequence_length, 1)
        if row_length is None
        else checks.check_int("row_length", row_length, 1)
    )
    tokens = samples * seq
    return cls(
        samples_per_step=samples,
        tokens_per_step=tokens,
        flops_per_step=float(training_flops_per_token(settings) * tokens),
        num_devices=len(device_kinds),
        peak_flops_per_device=mean_peak_flops_per_device(
            device_kinds, settings.compute_dtype if dtype is None else dtype
        ),
    )

  def figures(self, step_time: float) -> dict[str, float]:
    """Throughput of a step that took `step_time` seconds.

    Args:
      step_time: seconds (>= 0, finite; the caller checks). A step time of 0
        gives infinite figures.

    Returns:
      {"samples_per_s", "tokens_per_s", "tflops_per_device"} and "mfu" (a
      fraction, 0.5 = 50%) when the peak is known.
    """
    rate = 1.0 / step_time if step_time > 0 else math.inf
    out = {
        SAMPLES_PER_SECOND_KEY: self.samples_per_step * rate,
        TOKENS_PER_SECOND_KEY: self.tokens_per_step * rate,
        TFLOPS_PER_DEVICE_KEY: self._tflops_per_device_s * rate,
    }
    if self._mfu_s is not None:
      out[MFU_KEY] = self._mfu_s * rate
    return out

  def keys(self) -> tuple[str, ...]:
    """The keys `figures` returns."""
    return KEYS if self._mfu_s is not None else KEYS[:-1]
