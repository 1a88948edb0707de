"""Base configuration: every field the engine reads, with neutral defaults.

Other config files import this module and override a few fields (see
`default.py` and `llama31_8b.py`). `maxtext.config.config_lib.validate`
checks every field listed here; a field missing from this file is an error
there, so a new field is added here first, with a comment.

The defaults describe a small decoder-only model on the CPU, synthetic data,
MLPerf logging off. They validate but are not tuned to reach any target; use
`default.py` for the runnable embedded default.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the base configuration (a flat ConfigDict)."""
  config = ml_collections.ConfigDict()

  # ---------------------------------------------------------- run & output
  # The kind of training (maxtext/workloads.py, docs/ARCHITECTURE.md):
  # "pretraining" (next-token loss on a data set), "sft" (supervised
  # fine-tuning on chat examples, the loss on the assistant's tokens,
  # docs/sft.md) or "grpo" (post-training by group-relative policy
  # optimisation, docs/grpo.md). Every workload runs in
  # the one training loop, through train_main or grpo_main alike.
  config.workload = "pretraining"
  # Name of the run directory under `base_output_directory`. "" = a timestamp
  # chosen at start-up. A plain name only: no '/', no '..', not absolute.
  config.run_name = ""
  # Where run directories live: a local path (relative paths resolve against the
  # caller's working directory) or "gs://bucket/prefix".
  config.base_output_directory = "maxtext_runs"
  # Local directory that holds the run directory while it is mirrored to a
  # gs:// `base_output_directory`. "" = a directory under the system temp dir.
  # Unused for local output.
  config.local_staging_directory = ""
  # GCS mirror of a gs:// `base_output_directory` (unused for local output).
  # Least seconds between the starts of two background upload passes; changes
  # in between coalesce into the next pass.
  config.gcs_sync_interval_seconds = 30.0
  # Most seconds one GCS request may take, its retries included (also bounds
  # the download of a run from the mirror at start).
  config.gcs_request_timeout_seconds = 60.0
  # Most seconds the start-up look-up of a run in the GCS mirror (listing its
  # objects) may take in total; downloading what it finds is bounded per
  # request by gcs_request_timeout_seconds.
  config.gcs_startup_timeout_seconds = 20.0
  # Most seconds the end of the run waits for the final upload pass; after
  # that the run ends with a warning (the local staging keeps everything).
  config.gcs_final_timeout_seconds = 300.0
  # A run locks its directories for its whole life (a second run on them is
  # refused). A gs:// run also holds a lock object in the bucket, rewritten
  # every this many seconds; another run takes it over only once it is older
  # than three times this (its holder died without releasing it).
  config.run_lock_refresh_interval_seconds = 60.0
  # Orbax checkpoint directory (local or gs://). "" = <run dir>/checkpoints.
  config.checkpoint_directory = ""
  # Continue from the newest checkpoint of the run directory (an existing run
  # directory with checkpoints also resumes).
  config.resume = False
  # Train from step 0 in a run directory that has records of an earlier
  # attempt (metrics, checkpoints set aside as damaged or partial) but no
  # checkpoint to resume from; without it such a start is refused. The
  # earlier metrics records are then replaced; set-aside checkpoints stay.
  # Refused while a checkpoint exists (that run resumes). Recorded in the
  # run's config history like every field.
  config.start_over = False
  # Resume although a data file differs from the one the run recorded (its
  # size or content fingerprint, see file_fingerprint in
  # maxtext/data/builtin_datasets.py):
  # without it such a resume is refused, naming the file. The new files'
  # fingerprints and this value are in the attempt's line of the run's config
  # history.
  config.allow_data_change = False
  # Start from the parameters of an existing checkpoint (a step directory or a
  # checkpoint directory whose newest step is used), with a fresh optimizer.
  # "" = initialise parameters from `seed`.
  config.load_parameters_path = ""
  # Save a checkpoint every this many steps (and always at the end). 0 = only
  # at the end.
  config.checkpoint_period = 1000
  # Number of newest checkpoints kept; older ones are deleted. 0 = keep all.
  config.max_checkpoints_to_keep = 3

  # ------------------------------------------------------------ randomness
  # Seed of parameter initialisation and of the synthetic data streams.
  # -1 = draw one from os.urandom at the start of the run; the drawn seed is
  # what config.json records and the MLPerf log shows, and a resumed run
  # reuses the recorded seed.
  config.seed = 0
  # Seed of the order in which a tokens file's windows are visited.
  config.data_shuffle_seed = 0

  # ----------------------------------------------------------------- model
  # Decoder-only transformer (RMSNorm, rotary embeddings, SwiGLU MLP, causal
  # attention with grouped key/value heads).
  config.vocab_size = 256  # Token ids are in [0, vocab_size).
  config.emb_dim = 128  # Width of the residual stream.
  config.num_layers = 2  # Number of transformer blocks.
  config.num_heads = 4  # Query heads per attention layer.
  # Key/value heads; num_heads must be a multiple (grouped-query attention).
  config.num_kv_heads = 4
  config.head_dim = 32  # Width of one attention head.
  config.mlp_dim = 512  # Hidden width of the SwiGLU MLP.
  # Attention layout: "gqa" (query heads sharing grouped key/value heads:
  # num_heads, num_kv_heads, head_dim) or "mla" (DeepSeek-V2/V3 multi-head
  # latent attention, maxtext/model/mla.py: low-rank query and key/value
  # projections, a rotary key part shared by the heads; num_heads and the
  # five fields below; num_kv_heads and head_dim unused).
  config.attention_type = "gqa"
  # MLA: rank of the queries' low-rank bottleneck. 0 = queries projected
  # straight from the residual stream.
  config.q_lora_rank = 0
  # MLA: rank of the compressed key/value latent shared by all heads.
  config.kv_lora_rank = 0
  # MLA: width of each head's query/key part without rotary embedding.
  config.qk_nope_head_dim = 0
  # MLA: width of the query/key part with rotary embedding (even); the key's
  # is one vector per position, shared by the heads.
  config.qk_rope_head_dim = 0
  # MLA: width of each head's value (and attention output).
  config.v_head_dim = 0
  # Tokens per training sequence (the model sees inputs of this length).
  config.max_sequence_length = 64
  # Base of the rotary position embedding frequencies.
  config.rope_theta = 10000.0
  # Rescaling of the rotary frequencies: none | llama3 (Llama 3.1's
  # long-context scaling, maxtext.model.layers.Llama3Scaling; its four
  # fields below are read only then, and default to Llama 3.1's values) |
  # yarn (YaRN, maxtext.model.layers.YarnScaling: rope_scaling_factor,
  # rope_original_max_position and the rope_yarn_* fields).
  config.rope_scaling = "none"
  # llama3, yarn: low frequencies are divided by this factor.
  config.rope_scaling_factor = 8.0
  # llama3: wavelengths above original / low_freq_factor are scaled fully,
  config.rope_low_freq_factor = 1.0
  # llama3: wavelengths below original / high_freq_factor are kept; those
  # between the two bounds move smoothly from scaled to kept.
  config.rope_high_freq_factor = 4.0
  # llama3, yarn: the context length the model was first trained at.
  config.rope_original_max_position = 8192
  # yarn: dimension pairs that turn more than beta_fast times within the
  # original context keep their frequency; fewer than beta_slow times, are
  # divided by the factor; a linear ramp between.
  config.rope_yarn_beta_fast = 32.0
  # yarn: the slow bound (see rope_yarn_beta_fast).
  config.rope_yarn_beta_slow = 1.0
  # yarn: the cosines and sines are scaled by m(mscale) / m(mscale_all_dim),
  # m(c) = 0.1 c ln(factor) + 1 (m(1) when either is 0).
  config.rope_yarn_mscale = 0.0
  # yarn: > 0 multiplies the softmax scale by m(mscale_all_dim)^2
  # (DeepSeek-V3's attention correction).
  config.rope_yarn_mscale_all_dim = 0.0
  # Epsilon inside the RMSNorm square root.
  config.norm_epsilon = 1e-5
  # gqa: RMSNorm over each query and key head (a learnt scale of head_dim
  # per layer, q_norm and k_norm) before the rotary embedding (Qwen3).
  config.qk_norm = False
  # Norm scales stored zero-centred: the layer norms, the final norm and the
  # q/k norms scale by (1 + w), w initialised to 0 (Qwen3.5's
  # Qwen3_5MoeRMSNorm); the Gated DeltaNet output norm keeps its plain w.
  config.norm_zero_centered = False
  # gqa: a sigmoid gate per head and channel on the attention output before
  # the output projection, sigmoid(x wq_gate), x the normalised layer input
  # (Qwen3.5's gated attention; the gate half of its q_proj).
  config.attention_output_gate = False
  # gqa: the fraction of each head's dimensions the rotary embedding turns
  # (the first head_dim * factor, an even count, with their own frequencies
  # theta^(-2i/rotary_dim)); the rest pass unrotated (Qwen3.5: 0.25).
  config.partial_rotary_factor = 1.0
  # Layer pattern: 0 = every layer full attention; n > 0 = layers n-1,
  # 2n-1, ... full attention and the others Gated DeltaNet linear attention
  # (maxtext/model/gated_deltanet.py; transformers' full_attention_interval,
  # Qwen3.5: 4). Needs experts in every layer (num_experts > 0,
  # num_dense_layers 0) and num_layers a multiple of n.
  config.full_attention_interval = 0
  # Gated DeltaNet (full_attention_interval > 0), as transformers names the
  # fields: key heads (queries and keys).
  config.linear_num_key_heads = 16
  # Gated DeltaNet: value heads, a multiple of the key heads.
  config.linear_num_value_heads = 32
  # Gated DeltaNet: width of a query/key head.
  config.linear_key_head_dim = 128
  # Gated DeltaNet: width of a value head.
  config.linear_value_head_dim = 128
  # Gated DeltaNet: kernel of the causal depthwise convolution over q, k, v.
  config.linear_conv_kernel_dim = 4
  # Gated DeltaNet: tokens per chunk of the chunked delta rule (a speed
  # choice: any value gives the same result).
  config.linear_chunk_size = 64
  # Tied embeddings (Hugging Face's tie_word_embeddings, e.g. Llama 3.2 1B/3B):
  # no separate unembedding parameter; the logits use the embedding transposed.
  config.tie_word_embeddings = False
  # Storage dtype of parameters and optimizer state:
  # float32 | bfloat16 | float16.
  config.weight_dtype = "float32"
  # Dtype of activations and matmuls (parameters are cast at use); logits and
  # the loss are always float32. float32 on the CPU, bfloat16 on accelerators.
  config.compute_dtype = "float32"
  # Attention implementation: "einsum" (the reference), "dot_product"
  # (jax.nn.dot_product_attention on XLA), "cudnn" (cuDNN fused flash
  # attention; GPU, bfloat16/float16 compute only), "splash" (Pallas TPU
  # kernel; interpret mode elsewhere, slow) or "auto": cudnn on a capable GPU
  # with half-precision compute, dot_product on other GPUs and TPUs, einsum
  # on the CPU.
  config.attention = "auto"
  # What each scanned block keeps for the backward pass: "none" (everything,
  # fastest), "full" (only its input; recompute the rest), "save_dots" (also
  # the projection matmul outputs), "save_named" (also q, k, v, the attention
  # context and the attention and MLP outputs). Same gradients; less memory.
  config.remat_policy = "none"
  # Compute the loss this many sequence positions at a time, so the float32
  # [batch, seq, vocab] logits never exist at once. 0 = all at once.
  config.loss_chunk_size = 0
  # The dtype the training loss's logits are written in: "float32", or
  # "bfloat16" (MaxText's and Megatron-LM's numerics: the output projection
  # accumulates in float32 and rounds its output; every reduction over the
  # logits stays float32), which halves the loss's memory traffic over the
  # vocabulary. The cross-entropy loss only (training and its evaluation):
  # GRPO's log-probabilities and the decoders' logits stay float32.
  config.logits_dtype = "float32"
  # Compute the dense MLP's [batch, seq, mlp_dim] hidden activations for
  # this many groups of sequence positions one after another, forward and
  # backward (each group rematerialised), so they never exist whole.
  # 1 = all at once.
  config.mlp_chunks = 1
  # Packed rows: several sequences share a row, attention and the recurrent
  # layers restart at each sequence's start and rotary positions restart at
  # 0 (segment ids and positions ride the batch; docs/training.md,
  # "Packing"). Pretraining rows are split at document boundaries, SFT
  # examples and GRPO completions are packed first-fit into rows of the
  # micro-batch's length. False: pretraining windows attend across
  # documents (DeepSeek-V3's and Megatron's reset_attention_mask=False),
  # SFT and GRPO rows hold one sequence each, padded.
  config.packing = False
  # The end-of-document id that ends each document of a token stream
  # (dataset_type tokens_file, grain, megatron) when packing; -1 = grain's
  # metadata.json eod_id (the other two need it set).
  config.eod_id = -1
  # Mixture of experts (maxtext/model/moe.py). Number of routed experts per MoE
  # layer; 0 = a dense model (every layer a SwiGLU MLP).
  config.num_experts = 0
  # Experts each token is routed to (top-k), in [1, num_experts].
  config.num_experts_per_token = 1
  # Experts every token also goes through (DeepSeek's shared experts).
  config.num_shared_experts = 0
  # The first this many layers keep a dense MLP; the rest are MoE layers.
  config.num_dense_layers = 0
  # Hidden width of one expert (and of each shared expert). 0 = mlp_dim.
  config.moe_mlp_dim = 0
  # Hidden width of the shared experts together; 0 = num_shared_experts x
  # the expert width (Qwen3.5's shared_expert_intermediate_size).
  config.shared_expert_mlp_dim = 0
  # The shared experts' output scaled per token by sigmoid(x shared_gate),
  # a learnt [emb_dim] vector (Qwen3.5's shared_expert_gate).
  config.shared_expert_gate = False
  # Router scores: "softmax" (top-k probabilities are the weights) or
  # "sigmoid" (DeepSeek-V3: top-k sigmoid affinities normalised to sum 1).
  config.router_score = "softmax"
  # softmax: the top-k probabilities renormalised to sum to 1 before they
  # weight the experts (Qwen3-MoE's norm_topk_prob). "sigmoid" always
  # normalises its top-k weights.
  config.router_norm_topk = False
  # A per-expert bias added to the scores for the choice only, never to the
  # combine weights (DeepSeek-V3's e_score_correction_bias, a parameter
  # named moe_layers/router_bias that no gradient moves).
  config.router_bias = False
  # With router_bias: after each step every layer's bias of an expert that
  # took more than the mean share of the step's assignments goes down by
  # this much, of one that took less goes up (DeepSeek-V3's auxiliary-loss-
  # free balancing, 0.001 in its pre-training). 0 = the bias is held as
  # initialised (zero) or imported.
  config.router_bias_update_rate = 0.0
  # Group-limited routing (DeepSeek-V3's n_group, topk_group): the experts
  # form num_expert_groups groups of consecutive experts, a group is ranked
  # by the sum of its two best scores, and a token chooses its experts
  # among its best expert_groups_per_token groups. 1 group = no limit.
  config.num_expert_groups = 1
  # The groups a token's experts may come from (ignored with 1 group).
  config.expert_groups_per_token = 1
  # The combine weights are multiplied by this (DeepSeek-V3's
  # routed_scaling_factor, 2.5).
  config.routed_scaling_factor = 1.0
  # Load-balancing loss: "switch" (over the micro-batch) or "sequence"
  # (DeepSeek-V3's sequence-wise form), averaged over the MoE layers.
  config.load_balance_loss = "switch"
  # Weight of the load-balancing loss in the training loss (and the MLPerf
  # log's moe_aux_loss_coeff).
  config.load_balance_loss_weight = 0.01
  # Each expert takes at most ceil(capacity_factor * tokens * k /
  # num_experts) assignments of a micro-batch; the rest are dropped (and
  # counted). 0 = no limit, nothing dropped.
  config.capacity_factor = 0.0

  # ------------------------------------------------------------------ data
  # "synthetic": generated, learnable sequences (no files).
  # "tokens_file": a flat NumPy .npy file of token ids (any integer dtype), or a
  # raw .bin file of little-endian uint16 token ids, memory-mapped.
  # "grain": a directory written by tools/prepare_data (ArrayRecord shards of
  # tokenized text plus metadata.json), read with Grain, resumable.
  # "chat": JSONL files of {"messages": [{"role", "content"}, ...]} rendered
  # with the chat template of tokenizer_path, one padded row per example, the
  # loss on the assistant's tokens only (fine-tuning, docs/sft.md).
  # "megatron": Megatron indexed datasets (PREFIX.idx + PREFIX.bin), as the
  # MLPerf LLM references ship their tokenized C4 (docs/data.md).
  config.dataset_type = "synthetic"
  # tokens_file: the training tokens file. grain: the prepared directory.
  # chat: the training examples (JSONL).
  config.train_data_path = ""
  # megatron: Megatron's data-path list, one prefix or weights and prefixes
  # alternating ("0.3 /data/a 0.7 /data/b").
  # tokens_file: the eval tokens file. grain: a prepared directory whose eval
  # split is read; "" = train_data_path's eval split. chat: the held-out
  # examples (JSONL). megatron: the validation prefix.
  config.eval_data_path = ""
  # chat: a directory of Hugging Face tokenizer files (tokenizer.json and a
  # chat template: chat_template.jinja or tokenizer_config.json's
  # chat_template). "" = the files tools/import_checkpoint copied beside
  # load_parameters_path's checkpoint.
  config.tokenizer_path = ""
  # megatron: the eval set is the validation prefix's first this many
  # sequences of max_sequence_length, in file order, all read at every
  # evaluation (eval_steps * eval_batch_size must equal it); 0 = eval_steps *
  # eval_batch_size.
  config.megatron_eval_samples = 0
  # grain: Grain worker processes reading batches ahead (0 = reader threads
  # in the training process only).
  config.grain_worker_count = 0

  # --------------------------------------------------------- batch & steps
  # Sequences per optimizer step, over all processes and micro-batches.
  config.global_batch_size = 16
  # Micro-batches per optimizer step; global_batch_size must be divisible by it.
  config.gradient_accumulation_steps = 1
  # Optimizer steps to run at most (the run stops earlier at the eval target).
  config.steps = 1000

  # ------------------------------------------------------------- optimizer
  # AdamW with linear warmup from 0 to `learning_rate` over `warmup_steps`, then
  # the decay `lr_schedule` names (maxtext/config/optimizer.py): "cosine"
  # decays to learning_rate * lr_end_fraction at `lr_schedule_steps` and
  # stays there;
  # "constant" keeps `learning_rate` (lr_end_fraction plays no part).
  config.lr_schedule = "cosine"
  config.learning_rate = 1e-3  # Peak learning rate.
  config.warmup_steps = 100  # Steps of linear warmup from 0.
  config.lr_schedule_steps = 0  # Length of warmup + decay. 0 = `steps`.
  config.lr_end_fraction = 0.1  # Final learning rate as a fraction of the peak.
  config.adam_b1 = 0.9  # AdamW first-moment decay.
  config.adam_b2 = 0.95  # AdamW second-moment decay.
  config.adam_eps = 1e-8  # AdamW denominator epsilon.
  # Decoupled weight decay, applied to matrices (not to norm scales).
  config.weight_decay = 0.1
  # Clip gradients to this global L2 norm. 0 = no clipping.
  config.grad_clip_norm = 1.0
  # The program that takes the optimizer update (the step's last
  # micro-step; with K = 1 the update program) reuses the parameters' and
  # optimizer state's memory: one copy on the device, and a step whose
  # values are already lost is refused before it. False keeps both copies
  # until the step's metrics are flushed, so that any failed flush leaves
  # the old state (see docs/training.md, "One copy of the training
  # state").
  config.donate_state = True

  # ------------------------------------------------------------ evaluation
  config.eval_interval = 100  # Evaluate every this many steps (and at the end).
  # Samples trained before the first evaluation (a multiple of
  # global_batch_size); later ones follow every eval_interval steps after it.
  # 0 = the first at eval_interval steps. MLPerf deepseekv3_671b fixes the
  # first evaluation's sample count.
  config.first_eval_samples = 0
  config.eval_steps = 4  # Eval batches per evaluation.
  config.eval_batch_size = 16  # Sequences per eval batch, over all processes.
  # Stop with success when the mean eval loss (nats per token) is <= this.
  # 0 = no target: run for `steps`.
  config.target_eval_loss = 0.0
  # MLPerf deferred evaluation (the training rules' "timestamped
  # checkpoints evaluated after the clock has stopped"): where the eval
  # schedule would evaluate, the run saves a weights-only checkpoint in
  # <run dir>/eval_checkpoints instead (the step, samples trained and the
  # time the step's update had finished), logs that point in the MLPerf log,
  # and ends after `steps` with the log left open: no eval_accuracy and no
  # run_stop. //tools/mlperf:deferred_eval then evaluates the checkpoints in
  # order and closes the log (docs/mlperf.md). Needs enable_mllog.
  config.deferred_eval = False

  # ------------------------------------------------------------ monitoring
  config.log_period = 10  # Console line every this many steps.
  # Least seconds between two log lines of the progress of a run's long work
  # (a checkpoint's save, restore and checksums, the GCS mirror's uploads
  # and downloads, a deferred evaluation); work shorter than this logs
  # none.
  config.progress_interval_s = 30.0
  # Steps traced by the JAX profiler (trace next to the TensorBoard logs).
  # 0 = no trace.
  config.profiler_steps = 0
  # First step of the profiler window (later than 0 keeps compilation out).
  config.profiler_start_step = 3
  # Stop the run after this many consecutive steps whose gradients were not
  # finite (each such step is skipped, parameters untouched).
  config.max_consecutive_skipped_steps = 5

  # ----------------------------------------------------------- parallelism
  # Device mesh axes. -1 = all devices the other axis leaves; at most one -1.
  config.data_parallelism = -1  # Data-parallel replicas.
  config.fsdp_parallelism = 1  # Devices that shard parameters (FSDP).
  # Devices that shard the experts (the "expert" mesh axis; batches are split
  # over it too). 1 = no expert axis. Must divide num_experts.
  config.expert_parallelism = 1
  # Devices that split each layer's attention heads and MLP / expert hidden
  # widths (the "tensor" mesh axis, Megatron's tensor parallelism; batches
  # are not split over it). 1 = no tensor axis. Must divide the heads, key/
  # value heads and hidden widths (docs/scaling.md).
  config.tensor_parallelism = 1
  # Devices that split each row's tokens (the "context" mesh axis, context
  # parallelism, in the zig-zag layout; batches' rows are not split over it,
  # parameters are, as over fsdp). 1 = no context axis. 2 x it must divide
  # max_sequence_length; not with full_attention_interval (docs/scaling.md).
  config.context_parallelism = 1
  # Across TPU slices (a multi-slice job, or `train_compile --num_slices`):
  # the mesh axes over the data-center network, each a number of slices;
  # the axes above then count devices within one slice. -1 = all slices the
  # other leaves; at most one -1. Data parallelism across slices keeps the
  # FSDP collectives on the slices' fast links.
  config.dcn_data_parallelism = -1  # Slices holding data-parallel replicas.
  config.dcn_fsdp_parallelism = 1  # Slices that FSDP shards over.

  # ---------------------------------------------------------- distribution
  # Multi-process (multi-host) runs through jax.distributed.
  # num_processes: 1 = one process, no distributed runtime; > 1 = explicit
  # setup from `coordinator_address` and `process_id`; 0 = detect everything
  # from the cluster environment (TPU pods, SLURM).
  config.num_processes = 1
  config.coordinator_address = ""  # "host:port" of process 0's coordinator.
  config.process_id = -1  # This process's index when num_processes > 1.
  config.distributed_init_timeout_seconds = 300  # Wait for all processes.

  # --------------------------------------------------------------- runtime
  # Persistent JAX compilation cache directory. "" = no persistent cache.
  config.jax_compilation_cache_dir = ""
  # A training step compiled ahead of time (train_compile
  # --compiled_step_file): the run loads its programs and compiles none of
  # them; a file compiled for another config, mesh or JAX is refused. A
  # pickle: load only files you made. "" = compile in this process.
  config.compiled_step_file = ""
  # Accelerator the run expects: "auto" (whatever JAX finds; the start-up log
  # names it) | "cpu" | "tpu" | "gpu".
  config.hardware = "auto"
  # When `hardware` (not "auto") is not present: True = warn and run on the
  # CPU, False = stop with an error.
  config.allow_cpu_fallback = False

  # ------------------------------------------------------------------ GRPO
  # Post-training with group-relative policy optimisation (maxtext/grpo/;
  # docs/grpo.md). Read only by GRPO runs. A step draws global_batch_size /
  # grpo_num_generations prompts and grpo_num_generations completions of each.
  config.grpo_num_generations = 4  # G, completions per prompt (>= 2).
  # Passes of the policy loss over each rollout batch (>= 1).
  config.grpo_num_iterations = 1
  # "grpo" | "dr_grpo" | "rloo" | "rloo_normalized" (the MLPerf reference's
  # leave-one-out baseline over the others' std, ddof 1;
  # maxtext/grpo/loss/advantages.py). A group of equal rewards is 0 under each.
  config.grpo_advantage_estimator = "grpo"
  # Added to the std by "grpo" and "rloo_normalized" (>= 0; 0 is safe).
  config.grpo_advantage_eps = 1e-4
  # Clip range of the probability ratio: [1 - epsilon, 1 + epsilon_high];
  # grpo_epsilon_high 0 = grpo_epsilon.
  config.grpo_epsilon = 0.2
  config.grpo_epsilon_high = 0.0  # The upper clip; 0 = grpo_epsilon.
  # Weight of the KL term to the frozen reference policy; 0 = no reference.
  config.grpo_beta = 0.0
  config.grpo_kl_estimator = "k3"  # "k1" | "k3".
  # "token_mean" | "sequence_mean_token_mean" | "dr_grpo" (a constant
  # normaliser: sequences x grpo_max_completion_length).
  config.grpo_loss_aggregation = "token_mean"
  # The MLPerf qwen35_397b_grpo reference's loss
  # (maxtext/grpo/loss/policy_loss.py; docs/grpo.md): the PPO ratio forced to
  # 1 with each token weighted by pi_train / pi_generator (needs
  # grpo_num_iterations 1).
  config.grpo_force_on_policy_ratio = False
  # Sequence-mask truncated importance sampling: a sequence whose
  # geometric-mean pi_train / pi_generator leaves [min, max] trains nothing
  # (max 0 = off; needs grpo_force_on_policy_ratio).
  config.grpo_tis_ratio_min = 0.0  # The lower bound (reference: 0.999).
  config.grpo_tis_ratio_max = 0.0  # The upper bound (reference: 1.002).
  # A sequence whose mean exp(|logp_generator - logp_train|) exceeds this
  # trains nothing (0 = off, else > 1; needs grpo_num_iterations 1).
  config.grpo_logprob_error_threshold = 0.0
  # A completion cut by grpo_max_completion_length (no stop id) trains
  # nothing; it still counts in its group's advantages.
  config.grpo_overlong_filtering = False
  # The MoE router gets no gradient and no optimizer update
  # (maxtext/grpo/loss/frozen_router.py); a dense model has none to freeze.
  config.grpo_freeze_router = False
  # A resume whose KL reference (grpo_beta > 0) is not the one the run
  # pinned at its start (checkpoint step and fingerprint) is refused unless
  # this is True (the change is then recorded in the run's log).
  config.grpo_allow_reference_change = False
  # Reward functions, comma-separated "module:function=weight" (weight 1
  # when "=weight" is left out), each called on every completion
  # (maxtext/grpo/rewards/rewards.py).
  config.grpo_reward_functions = (
      "maxtext.grpo.tasks.progression_task:exact_match"
  )
  # The most seconds one reward call may take; the functions run in a worker
  # process, and a call past this is stopped and stops the run (with a
  # checkpoint), naming the function and the prompt. > 0.
  config.grpo_reward_timeout_seconds = 60.0
  # Rollout: tokens generated per completion at most, and how each is drawn.
  config.grpo_max_completion_length = 8
  config.grpo_temperature = 1.0  # > 0.
  config.grpo_top_p = 1.0  # In (0, 1].
  config.grpo_top_k = 0  # 0 = the whole vocabulary.
  # Ids that end a completion, comma-separated ("" = none).
  config.grpo_stop_ids = ""
  # The rollout's decoder: "paged" (continuous batching over a paged
  # key/value cache, each prompt prefilled once and its pages shared by its
  # completions: maxtext/generation/paged_decoder.py) or "static" (one
  # batch over a dense cache: maxtext/generation/decoder.py). Both draw the
  # same ids.
  config.grpo_decoder = "paged"
  # Paged decoder: sequences decoded together (0 = one per completion of
  # the rollout).
  config.grpo_decode_slots = 0
  config.grpo_decode_page_size = 16  # Positions per page (a power of two).
  # Rollouts drawn ahead: 0 = each rollout is drawn with the newest
  # parameters before its updates (synchronous); 1 = rollout s + 1 is drawn
  # while update s runs, with the parameters before it, so every sample is
  # at most 1 update old when it trains (its age is recorded as
  # rollout/age_max and rollout/age_mean; the importance ratio uses the
  # log-probabilities recorded at generation). docs/grpo.md.
  config.grpo_max_age = 0
  # Devices given to generation alone (0 = generation runs on the training
  # devices): each process's last N / processes devices hold a copy of the
  # parameters in the compute dtype, FSDP over them (tensor_parallelism
  # where it divides N), copied from the training mesh before each rollout;
  # training runs on the rest. With grpo_max_age 1 the rollout of step s + 1
  # runs on them while update s runs on the others. docs/grpo.md.
  config.grpo_generation_devices = 0
  # The generation mesh's data axis: replicas that each hold the whole
  # model (FSDP over grpo_generation_devices / replicas devices,
  # tensor_parallelism where it divides them) and decode their own share of
  # the slots and pages (the paged decoder's replicas), so they exchange no
  # weights while they decode. 1 = one copy split over all of them. Must
  # divide grpo_generation_devices. docs/grpo.md.
  config.grpo_generation_replicas = 1
  # Held-out evaluation: completions drawn with these options (temperature 0
  # = greedy) on grpo_eval_prompts prompts.
  config.grpo_eval_temperature = 0.0
  config.grpo_eval_top_p = 1.0  # In (0, 1].
  config.grpo_eval_prompts = 64  # Held-out prompts per evaluation (>= 1).
  # Completions drawn per held-out prompt, k (separate from
  # grpo_num_generations); 0 = 1 when greedy, else grpo_num_generations. The
  # eval reports pass@1 and, for k > 1, pass@k (grouped: a prompt passes if
  # any of its k samples does).
  config.grpo_eval_samples_per_prompt = 0
  # The eval metric the target (and MLPerf's eval_accuracy) is on: "pass@1"
  # or "pass@<k>" for the eval's k.
  config.grpo_eval_target_metric = "pass@1"
  # The run ends with success once an eval's grpo_eval_target_metric reaches
  # this (higher is better); 0 = no target.
  config.grpo_target_pass_rate = 0.0
  # The built-in task (maxtext/grpo/tasks/progression_task.py): prompt tokens
  # given of each progression. With grpo_task: grpo_prompt_length +
  # grpo_max_completion_length is an episode's whole length, its first
  # prompt counted, and a first prompt of at least grpo_prompt_length tokens
  # can use all of it (the ids after a first prompt fill at most
  # grpo_max_completion_length columns).
  config.grpo_prompt_length = 4
  # A task of text records played as episodes (maxtext/env/, docs/grpo.md),
  # "module:factory", e.g. "maxtext.env.math_task:make_task" or
  # "maxtext.env.repair_task:make_task"; "" = the progression task of ids.
  # grpo_max_completion_length then bounds an episode's tokens after its
  # first prompt (the model's and the environment's), and
  # grpo_prompt_length + grpo_max_completion_length its whole conversation.
  config.grpo_task = ""
  # The policy's tokenizer and chat template: a Hugging Face tokenizer
  # directory (what tools/import_checkpoint copies), "" for the one imported
  # beside load_parameters_path's checkpoint, or "byte_chatml", the built-in
  # byte-level ChatML tokenizer (maxtext/text/byte_chat.py, 259 ids) for
  # models trained here. Used with grpo_task.
  config.grpo_tokenizer_path = "byte_chatml"
  # Episode limits (maxtext/env/episodes.py): model turns per episode.
  config.grpo_max_turns = 1
  # Tokens per model turn (0 = the whole grpo_max_completion_length).
  config.grpo_max_turn_tokens = 0
  # Each episode's wall-clock seconds; one past it after a turn ends with
  # the reward its environment gives a timed-out episode (0 by default),
  # stays in its group and trains (counted in episode/timeouts).
  config.grpo_episode_timeout_seconds = 600.0
  # Each tool call's wall-clock seconds in the sandbox (the verifier's is
  # grpo_reward_timeout_seconds).
  config.grpo_tool_timeout_seconds = 30.0
  # Tools run under bubblewrap; where it cannot run, the run refuses to
  # start. True runs them unisolated (trusted tools only; recorded in the
  # run's config.json).
  config.grpo_allow_unisolated_tools = False
  # Where episodes' environments (their tools and verifiers) run
  # (maxtext/env/executor.py, docs/ray_tools.md): "local" in process 0, one
  # call after another; "ray" on a pool of Ray actors, many episodes' calls
  # at once (needs Ray: third_party/py/requirements_ray_lock.txt).
  config.grpo_tool_executor = "local"
  # The Ray cluster's address (as ray.init takes it, e.g. "10.0.0.2:6379"
  # or "auto"); "" starts a Ray instance on this host.
  config.grpo_ray_address = ""
  # The pool's actors: each holds one CPU and runs one call at a time.
  config.grpo_ray_actors = 4
  # The most one remote call (an episode's opening, a turn's tools, its
  # verifier) may take; past it the episode ends as an executor error.
  config.grpo_ray_call_timeout_seconds = 900.0
  # Input files of a task that reads them (maxtext/env/benchmark_task.py,
  # the MLPerf benchmark's inputs; docs/grpo.md); all "" for the built-in
  # tasks. Each file is refused unless its SHA-256 (hex) is the one given.
  # The training curriculum (JSONL, read in order) and its SHA-256.
  config.grpo_task_curriculum_path = ""
  config.grpo_task_curriculum_sha256 = ""  # The curriculum's SHA-256.
  # The validation set (JSONL) and its SHA-256.
  config.grpo_task_validation_path = ""
  config.grpo_task_validation_sha256 = ""  # The validation set's SHA-256.
  # The directory of the tasks' root filesystems, one per task image.
  config.grpo_task_rootfs_dir = ""
  # The prompt template ("" = the task's own) and its SHA-256.
  config.grpo_task_prompt_path = ""
  config.grpo_task_prompt_sha256 = ""  # The template's SHA-256.

  # ------------------------------------------------------------ MLPerf log
  # Write an MLPerf Training :::MLLOG log (process 0 only). Off = no work.
  config.enable_mllog = False
  config.mllog_file = ""  # "" = <run dir>/mllog.log.
  # Shell command every host runs to flush its caches before the run; the
  # log's cache_clear is True only if it exits 0 on every host, else False
  # with a warning saying why. "" = `sync` and drop the page cache (needs
  # root on Linux; elsewhere nothing is flushed and cache_clear is False).
  config.cache_clear_command = ""
  # Throw-away training steps (and one eval batch) on placeholder batches
  # before the run starts, so that compilation falls outside MLPerf's timed
  # region (run_start .. run_stop); the model, optimizer, step and data are
  # left exactly as without them. -1 = 1 when enable_mllog is on, else 0.
  config.warmup_steps_before_run_start = -1
  # Training ruleset the log follows (a ruleset the installed checker knows).
  config.mllog_ruleset = "6.1.0"
  config.submission_org = "maxtext-engine"  # Submitting organisation.
  config.submission_platform = "cpu"  # System name in the submission.
  config.submission_division = "open"  # "closed" | "open".
  # System availability: "onprem" | "cloud" | "research".
  config.submission_status = "onprem"
  # Benchmark name known to the ruleset (e.g. "llama31_8b").
  config.submission_benchmark = "llama31_8b"
  # `train_samples` logged: size of the training set in sequences.
  # 0 = steps * global_batch_size (the samples the step budget covers).
  config.mllog_train_samples = 0

  return config
