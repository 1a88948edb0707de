"""The executor a config names, made: `create(ExecutorConfig.from_config(c))`.

`"local"` is `executor.LocalExecutor`; `"ray"` is
`ray_executor.RayExecutor`, imported only here and only when asked for, so
a product without the ray lock (the TPU package set, `train_main`) runs
every other setting, and refuses this one in one line naming the field and
how to install Ray.
"""

from maxtext.env import executor

RAY_INSTALL = (
    "pip install --require-hashes --no-deps -r "
    "third_party/py/requirements_ray_lock.txt; under Bazel, run "
    "//maxtext:grpo_ray_main"
)


def check(settings: executor.ExecutorConfig) -> None:
  """Refuses (ValueError, one line naming the field) an executor that
  cannot run in this process: an unknown one, or the ray executor without
  the `ray` package."""
  kind = settings.grpo_tool_executor
  if kind not in (executor.LOCAL, executor.RAY):
    raise ValueError(
        f"config.grpo_tool_executor={kind!r}: must be one of "
        f"{(executor.LOCAL, executor.RAY)}"
    )
  if kind == executor.RAY:
    try:
      # pylint: disable-next=import-outside-toplevel,unused-import  # Ray only when asked for.
      from maxtext.env import ray_executor
    except ImportError as e:
      raise ValueError(
          f"config.grpo_tool_executor={kind!r}: {e} ({RAY_INSTALL})"
      ) from None


def create(settings: executor.ExecutorConfig) -> executor.Executor:
  """The executor `settings` names (a Ray pool starts on its first use).

  Raises:
    ValueError: as `check`.
  """
  check(settings)
  if settings.grpo_tool_executor == executor.LOCAL:
    return executor.LocalExecutor()
  # pylint: disable-next=import-outside-toplevel  # Ray only when asked for.
  from maxtext.env import ray_executor

  return ray_executor.RayExecutor(settings)
