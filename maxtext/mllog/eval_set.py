"""Whether a run evaluates on its benchmark's eval set, before it starts.

Some MLPerf benchmarks define their eval set as the first N sequences of
the reference's validation data (deepseekv3_671b: the first 1,024
sequences of 4,096 tokens of C4's validation Megatron dataset, evaluated
whole at every evaluation). The compliance checker sees only the logged
`eval_samples` (the header proof holds it to the rule's N); this check
makes sure that number counts that set: the run reads the validation
prefix through dataset_type="megatron" and its eval set is exactly the
first `eval_samples` sequences, all read at each evaluation.
"""

from absl import logging

from maxtext.mllog import mlperf_config

# Benchmarks whose eval set is the first eval_samples sequences of the
# reference's validation prefix.
FIRST_N_OF_VALIDATION = frozenset({"deepseekv3_671b"})


def problem(mlperf: mlperf_config.MlperfConfig) -> str:
  """What keeps the run's eval set from being the benchmark's, or ""."""
  if mlperf.submission_benchmark not in FIRST_N_OF_VALIDATION:
    return ""
  if mlperf.dataset_type != "megatron":
    return (
        f"mlperf.dataset_type={mlperf.dataset_type!r}: "
        f"{mlperf.submission_benchmark}'s eval set is the first sequences "
        "of the reference's validation Megatron dataset; read it with "
        "dataset_type='megatron' and eval_data_path=<validation prefix>"
    )
  logged = mlperf.eval_steps * mlperf.eval_batch_size
  if mlperf.megatron_eval_samples != logged:
    return (
        f"mlperf.megatron_eval_samples={mlperf.megatron_eval_samples}: "
        f"{mlperf.submission_benchmark}'s eval set is the validation "
        f"prefix's first eval_samples = eval_steps * eval_batch_size = "
        f"{logged} sequences; name it (megatron_eval_samples={logged})"
    )
  return ""


def check(mlperf: mlperf_config.MlperfConfig) -> None:
  """Refuses (closed division) or warns about (open) a config whose eval
  set is not its benchmark's.

  Raises:
    ValueError: closed division, `problem(mlperf)`.
  """
  found = problem(mlperf)
  if not found:
    return
  if mlperf.submission_division == "closed":
    raise ValueError(found)
  logging.warning("MLPerf open division: %s", found)
