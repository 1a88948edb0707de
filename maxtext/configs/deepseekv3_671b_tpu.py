"""MLPerf Training deepseekv3_671b, closed division, on one TPU v5p-512 slice.

The model, the hyperparameters and the batch argument are
`deepseekv3_671b.py`'s (the closed rules' values; see its docstring); this
file changes only what a TPU needs.

Its target is one TPU v5p-512 slice: 256 chips (v5p:4x8x8), 95.74 GiB of
HBM each, as many devices as the GPU layout counts. The layout is the GPU
file's: experts over 8 chips, every parameter's other dimensions over the
other 32 (expert 8 x fsdp 32); the non-expert weights are split over
both axes (`axis_rules.PARAMETERS`), so every parameter is split 256 ways
and the training state is 41.94 GB (39.07 GiB) per chip, as fsdp=256's
would be, where plain FSDP over 256 would have every MoE layer gather all
256 experts' weights onto every chip. The TPU
compiler's figures for it (docs/PERFORMANCE.md) come from any host,
without a TPU:

  tools/bazel run --config=tpu //tools:train_compile -- \
    --config=maxtext/configs/deepseekv3_671b_tpu.py --topology=v5p-512

It fits: the step's one program (its last micro-step takes the update)
peaks at 78.47 GiB per chip (39.08 of state, 39.38 of temporaries). The MoE
layer runs per chip on the mesh: each chip
routes its own sequence and runs, for its 32 experts, the assignments of
its expert group's 8 sequences, with those experts' weights gathered in
bfloat16 (docs/models.md, "On a TPU slice").

It needs the slice, the benchmark's data and its warm-start checkpoint:

  tools/bazel run --config=tpu //maxtext:train_main -- \
    --config=maxtext/configs/deepseekv3_671b_tpu.py:16384 \
    --config.train_data_path=/data/c4-train.en_6_text_document \
    --config.eval_data_path=/data/c4-validation-91205-samples.en_text_document \
    --config.load_parameters_path=/ckpt/deepseekv3_warm_start

Set the batch through the argument, as for the GPU file; it must be a
multiple of 256 (the micro-batches hold one sequence per chip).
"""

import ml_collections

from maxtext.configs import deepseekv3_671b

# The slice this layout is for, as train_compile's --topology takes it,
# and its chips (one JAX device each).
TOPOLOGY = "v5p-512"
CHIPS = 256


def get_config(batch: str = "") -> ml_collections.ConfigDict:
  """Returns deepseekv3_671b for a TPU v5p-512: the GPU file, then below.

  Args:
    batch: the global batch size as text, as `deepseekv3_671b.get_config`
      takes it; "" = its reference batch size.

  Raises:
    ValueError: `batch` is not an integer of at least the rules' least, or
      not a multiple of the slice's CHIPS.
  """
  config = deepseekv3_671b.get_config(batch)
  if config.global_batch_size % CHIPS:
    raise ValueError(
        f"deepseekv3_671b_tpu: global batch size {config.global_batch_size} "
        f"is not a multiple of the {CHIPS} chips of a {TOPOLOGY}"
    )

  # "auto" is the splash kernel on a TPU (flash attention in shard_map over
  # the batch and head axes): the [heads, S, S] scores of 128 heads of 4096
  # positions (8 GiB in float32 per sequence and layer) never exist.
  config.attention = "auto"
  # Keep only each block's input for the backward pass (61 x 4096 x 7168
  # bfloat16 = 3.3 GiB per sequence): without remat every layer's MLA
  # projections, router scores and the 8 chosen experts' hidden
  # activations of each token stay alive until the backward pass. The
  # recomputation costs about a third more FLOPs.
  config.remat_policy = "full"
  # The loss 1024 positions at a time: the float32 logits of a sequence
  # over the 129280-entry vocabulary (2 GiB) never exist at once.
  config.loss_chunk_size = 1024
  # One sequence per chip per micro-batch: 64 micro-batches at the
  # reference batch (16384 = 64 x 256), 60 at the rules' least (15360). A
  # fixed count would leave a micro-batch that 256 chips do not divide at
  # any batch but 16384.
  config.gradient_accumulation_steps = config.global_batch_size // CHIPS

  # Same mesh as the GPU file (expert 8, FSDP over the rest): the docstring
  # says why.
  config.data_parallelism = 1
  config.fsdp_parallelism = -1
  config.expert_parallelism = 8

  config.hardware = "tpu"
  config.submission_platform = "tpu"

  return config
