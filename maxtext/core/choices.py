"""The names a config field chooses between, in one place and without JAX.

Each tuple is the set of values one field of `maxtext/configs/base.py` takes.
`maxtext.config.config_lib` refuses any other value before device work
starts; the module that implements the choice dispatches on the same tuple
(`choices_test` checks that every name has an implementation).
"""

# config.attention: "einsum" is the reference; "auto" resolves per backend
# (maxtext.model.transformer.attention_implementation).
ATTENTION_IMPLEMENTATIONS = ("auto", "einsum", "dot_product", "cudnn", "splash")
# config.attention_type: grouped key/value heads, or multi-head latent
# attention (maxtext.model.mla).
ATTENTION_TYPES = ("gqa", "mla")
# config.remat_policy: what the scanned block keeps for the backward pass
# (maxtext.model.transformer).
REMAT_POLICIES = ("none", "full", "save_dots", "save_named", "save_context")
# config.rope_scaling: the rotary frequencies as they are, or rescaled as
# Llama 3.1's or by YaRN (maxtext.model.layers.rope_scaling).
ROPE_SCALINGS = ("none", "llama3", "yarn")
# config.router_score: how the router turns logits into expert scores
# (maxtext.model.moe).
ROUTER_SCORES = ("softmax", "sigmoid")
# config.load_balance_loss: per batch ("switch") or per sequence
# (maxtext.model.moe).
LOAD_BALANCE_LOSSES = ("switch", "sequence")
# config.weight_dtype and config.compute_dtype.
DTYPES = ("float32", "bfloat16", "float16")
# The dtypes the training loss writes its logits in (`logits_dtype`).
LOGITS_DTYPES = ("float32", "bfloat16")
# config.workload: the kind of training (maxtext.workloads.WORKLOADS).
WORKLOADS = ("pretraining", "sft", "grpo")
# config.dataset_type (maxtext.data.dataset_kinds.KINDS).
DATASET_TYPES = ("synthetic", "tokens_file", "grain", "chat", "megatron")
# The kinds whose batches carry float32 "weights" [B, S] beside inputs and
# targets (the loss counts only weighted tokens): chat's assistant mask.
WEIGHTED_DATASET_TYPES = ("chat",)
# config.hardware: a JAX platform, or "auto" for whatever JAX finds.
HARDWARE = ("auto", "cpu", "tpu", "gpu")
# config.lr_schedule: the learning rate after the linear warm-up
# (maxtext.config.optimizer.make_schedule).
LR_SCHEDULES = ("cosine", "constant")
# config.grpo_decoder: the rollout's decoder, the paged one or the static
# one (maxtext.generation.rollout_decoder).
GRPO_DECODERS = ("paged", "static")
# config.grpo_tool_executor: where episodes' environments live, in the
# trainer's process or on a pool of Ray actors (maxtext.env.executor).
GRPO_TOOL_EXECUTORS = ("local", "ray")
# The GRPO choices below are implemented by registries of maxtext/grpo/
# (maxtext.grpo.loss.registry): a new one is its name here and its function
# registered there under that name.
# config.grpo_advantage_estimator: how a group's rewards become advantages
# (maxtext.grpo.loss.advantages).
GRPO_ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "rloo_normalized")
# config.grpo_kl_estimator: the per-token estimate of KL(policy || reference)
# (maxtext.grpo.loss.policy_loss).
GRPO_KL_ESTIMATORS = ("k1", "k3")
# config.grpo_loss_aggregation: how per-token losses become one number
# (maxtext.grpo.loss.policy_loss).
GRPO_LOSS_AGGREGATIONS = ("token_mean", "sequence_mean_token_mean", "dr_grpo")
