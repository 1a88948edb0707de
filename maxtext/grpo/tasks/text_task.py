"""A GRPO run's text task from its config: records, tokenizer, limits.

With `grpo_task` set, the run's prompts are the task's records
(`TaskDataset`, by rollout, as `prompts.PromptDataset` for the progression
task) and each step plays them as episodes (`episode_rollout`).
`episode_setup(settings)` (the run's `task_config.TaskConfig`) loads what
the episodes need, before any device work, each error one line naming the
field:

* the task (`tasks.load(grpo_task)`, with the input files the
  `grpo_task_*` fields name, checked against their digests);
* the policy's tokenizer and chat template (`grpo_tokenizer_path`: a
  Hugging Face tokenizer directory; "" for the one imported beside
  `load_parameters_path`'s checkpoint; or "byte_chatml", the built-in
  byte-level one, written to a temporary directory and read back like any
  other), whose vocabulary must fit the model's;
* the limits (grpo_max_turns; grpo_prompt_length +
  grpo_max_completion_length tokens per episode in all, the first prompt
  counted, of which at most grpo_max_completion_length after it;
  grpo_max_turn_tokens per turn; grpo_episode_timeout_seconds);
* the tool settings: a task whose tools run in the sandbox
  (`task.uses_sandbox`) needs bubblewrap, or the run refuses to start,
  unless `grpo_allow_unisolated_tools` says the tools are trusted;
* the executor the environments live in (`grpo_tool_executor`): "ray"
  without the ray package is refused here; its pool starts on the first
  rollout, each actor checking bubblewrap on its own node.
"""

import dataclasses
import tempfile
from typing import Any, Optional

from absl import logging
import numpy as np

from maxtext.data import chat_dataset
from maxtext.data import dataset
from maxtext.env import episodes
from maxtext.env import executors
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.grpo.rollout import episode_rollout
from maxtext.grpo.tasks import task_config
from maxtext.text import byte_chat
from maxtext.text import chat

BYTE_CHATML = "byte_chatml"


def load_tokenizer(
    path: str, field: str = "grpo_tokenizer_path"
) -> chat.ChatTokenizer:
  """The tokenizer `path` names ("byte_chatml" or a directory; ValueError
  naming `field`)."""
  if path == BYTE_CHATML:
    with tempfile.TemporaryDirectory() as directory:
      return chat.ChatTokenizer.load(byte_chat.write(directory))
  try:
    return chat.ChatTokenizer.load(path)
  except ValueError as e:
    raise ValueError(f"config.{field}={path!r}: {e}") from None


def policy_tokenizer(settings: task_config.TaskConfig) -> chat.ChatTokenizer:
  """The policy's tokenizer and chat template: `grpo_tokenizer_path`, or
  ("") the tokenizer files `tools/import_checkpoint` copied beside
  `load_parameters_path`'s checkpoint (a published model's own template),
  checked against the model's vocabulary and for an end of turn.

  Raises:
    ValueError: one line naming the field.
  """
  path, field = settings.grpo_tokenizer_path, "grpo_tokenizer_path"
  if not path:
    if not settings.load_parameters_path:
      raise ValueError(
          "config.grpo_tokenizer_path='': a text task needs the policy's "
          "tokenizer and chat template: set grpo_tokenizer_path, or "
          "load_parameters_path to an imported checkpoint with its "
          "tokenizer files beside it"
      )
    path = chat_dataset.tokenizer_directory("", settings.load_parameters_path)
    field = "load_parameters_path"
  elif path != BYTE_CHATML:
    path = chat_dataset.tokenizer_directory(path, "")
  tokenizer = load_tokenizer(path, field)
  if tokenizer.vocab_size > settings.vocab_size:
    raise ValueError(
        f"config.vocab_size={settings.vocab_size}: the tokenizer "
        f"({path}) has {tokenizer.vocab_size} ids"
    )
  if tokenizer.end_of_turn_id is None:
    raise ValueError(
        f"config.{field}={path!r}: the tokenizer has no eos_token, so a "
        "model turn cannot end"
    )
  return tokenizer


def episode_setup(
    settings: task_config.TaskConfig,
) -> episode_rollout.EpisodeSetup:
  """The run's task, tokenizer, limits and tool settings (module doc).

  Raises:
    ValueError: one line naming the field.
  """
  # The tokenizer first: it reads a few small files, the task may hash and
  # check large ones.
  tokenizer = policy_tokenizer(settings)
  task = tasks.load(
      settings.grpo_task,
      settings.grpo_eval_prompts,
      settings.seed,
      settings.task_inputs(),
  )
  completion = settings.grpo_max_completion_length
  turn = settings.grpo_max_turn_tokens or completion
  if turn > completion:
    raise ValueError(
        f"config.grpo_max_turn_tokens={turn}: must be <= "
        f"grpo_max_completion_length={completion}"
    )
  try:
    limits = episodes.Limits(
        max_turns=settings.grpo_max_turns,
        max_tokens=completion,
        max_length=settings.grpo_prompt_length + completion,
        max_turn_tokens=turn,
        episode_seconds=settings.grpo_episode_timeout_seconds,
    )
    tool_limits = sandbox.Limits(
        wall_seconds=settings.grpo_tool_timeout_seconds
    )
  except ValueError as e:
    raise ValueError(f"config: {e}") from None
  isolated = not settings.grpo_allow_unisolated_tools
  uses_sandbox = getattr(task, "uses_sandbox", False)
  if uses_sandbox:
    if isolated:
      try:
        sandbox.check_available()
      except sandbox.SandboxUnavailable as e:
        raise ValueError(
            f"config.grpo_task={settings.grpo_task!r}: {e} (trusted tools may "
            "run unisolated: config.grpo_allow_unisolated_tools=True)"
        ) from None
    else:
      logging.warning(
          "grpo_allow_unisolated_tools: the task's tools run without "
          "isolation (network and host files reachable)."
      )
  return episode_rollout.EpisodeSetup(
      task,
      tokenizer,
      limits,
      tasks.ToolSettings(
          tool_limits, isolated, settings.grpo_reward_timeout_seconds
      ),
      executor=executors.create(
          dataclasses.replace(
              settings.executor, check_sandbox=uses_sandbox and isolated
          )
      ),
  )


class TaskDataset(dataset.Dataset):
  """A text task's records, by rollout: {"prompts": object array of
  records}; eval batch 0 is the held-out records."""

  def __init__(
      self,
      settings: task_config.TaskConfig,
      task: tasks.Task,
      tokenizer: chat.ChatTokenizer,
  ):
    self._task = task
    self._count = settings.prompts_per_rollout
    self._provenance = {
        "kind": task.kind,
        "task": settings.grpo_task,
        "tokenizer": settings.grpo_tokenizer_path,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "eval_prompts": settings.grpo_eval_prompts,
        "seed": settings.seed,
    }

  @staticmethod
  def _batch(records) -> dataset.Batch:
    out = np.empty((len(records),), object)
    out[:] = records
    return {"prompts": out}

  def get_batch(self, step: int) -> dataset.Batch:
    if step < 0:
      raise ValueError(f"rollout {step}: must be >= 0")
    return self._batch(self._task.train_records(step, self._count))

  def get_eval_batch(self, index: int) -> dataset.Batch:
    if index != 0:
      raise ValueError(f"eval batch {index}: the held-out records are batch 0")
    return self._batch(self._task.eval_records())

  def provenance(self) -> Optional[dict[str, Any]]:
    return {"prompts": self._provenance}
