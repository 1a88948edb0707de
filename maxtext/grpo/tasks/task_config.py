"""A GRPO run's task settings: `TaskConfig`.

The tasks package's settings class (`maxtext/core/component_config.py`):
what the built-in progression task's prompts (`prompts`) and a text task's
episodes (`text_task`) read, with the files a text task reads (the
`grpo_task_*` fields, handed to the environment package as its
`env/tasks.TaskInputs`). The executor its environments run in
(`env/executor.ExecutorConfig`) is the environment package's settings,
held whole. `vocab_size` is the model's, declared here again: a task's
ids and a tokenizer's vocabulary must fit it. The fields' checks are
`config_lib.validate_grpo`'s and, for what loading a task reveals,
`text_task.episode_setup`'s.
"""

import dataclasses

from maxtext.core import component_config
from maxtext.env import executor as executor_lib
from maxtext.env import tasks


@dataclasses.dataclass(frozen=True)
class TaskConfig(component_config.ComponentConfig):
  """What a GRPO run's prompts and episodes are (`maxtext/configs/base.py`
  documents each field).

  Attributes:
    seed: the prompts' and held-out records' seed.
    vocab_size: the model's vocabulary.
    global_batch_size: sequences a rollout holds.
    grpo_num_generations: completions per prompt (a rollout's prompts are
      global_batch_size / grpo_num_generations).
    grpo_prompt_length: a prompt's tokens (a text task's first prompt's
      share of an episode).
    grpo_max_completion_length: an episode's new tokens.
    grpo_eval_prompts: held-out prompts (or records).
    grpo_task: the text task's name ("": the built-in progression task).
    grpo_tokenizer_path: the policy's tokenizer ("byte_chatml", a
      directory, or "" for the one beside load_parameters_path).
    load_parameters_path: the checkpoint the policy starts from.
    grpo_max_turns: model turns an episode may take.
    grpo_max_turn_tokens: new tokens a turn may have (0: all of the
      completion).
    grpo_episode_timeout_seconds: an episode's wall-clock limit.
    grpo_tool_timeout_seconds: a tool call's wall-clock limit.
    grpo_allow_unisolated_tools: the task's tools may run without the
      sandbox.
    grpo_reward_timeout_seconds: a verifier's wall-clock limit.
    files: the files the task reads.
    executor: where the episodes' environments run (its `check_sandbox`
      is `text_task.episode_setup`'s to set).
  """

  seed: int = 0
  vocab_size: int = 256
  global_batch_size: int = 16
  grpo_num_generations: int = 4
  grpo_prompt_length: int = 4
  grpo_max_completion_length: int = 8
  grpo_eval_prompts: int = 64
  grpo_task: str = ""
  grpo_tokenizer_path: str = "byte_chatml"
  load_parameters_path: str = ""
  grpo_max_turns: int = 1
  grpo_max_turn_tokens: int = 0
  grpo_episode_timeout_seconds: float = 600.0
  grpo_tool_timeout_seconds: float = 30.0
  grpo_allow_unisolated_tools: bool = False
  grpo_reward_timeout_seconds: float = 60.0
  grpo_task_curriculum_path: str = ""
  grpo_task_curriculum_sha256: str = ""
  grpo_task_validation_path: str = ""
  grpo_task_validation_sha256: str = ""
  grpo_task_rootfs_dir: str = ""
  grpo_task_prompt_path: str = ""
  grpo_task_prompt_sha256: str = ""
  executor: executor_lib.ExecutorConfig = dataclasses.field(
      default_factory=executor_lib.ExecutorConfig
  )

  def task_inputs(self) -> tasks.TaskInputs:
    """The files the task reads, as the environment package names them."""
    return tasks.TaskInputs(
        curriculum_path=self.grpo_task_curriculum_path,
        curriculum_sha256=self.grpo_task_curriculum_sha256,
        validation_path=self.grpo_task_validation_path,
        validation_sha256=self.grpo_task_validation_sha256,
        rootfs_dir=self.grpo_task_rootfs_dir,
        prompt_path=self.grpo_task_prompt_path,
        prompt_sha256=self.grpo_task_prompt_sha256,
    )

  @property
  def prompts_per_rollout(self) -> int:
    """A rollout's prompts: global_batch_size / grpo_num_generations."""
    return self.global_batch_size // self.grpo_num_generations
