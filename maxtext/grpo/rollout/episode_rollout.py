"""A GRPO rollout of episodes: P task records x G episodes, as a `Rollout`.

The text counterpart of `rollout.rollout`: each of the step's task records
is played G times against its task's environment (`maxtext.env.episodes`),
generation going through one function: `paged_generate` (the paged,
continuous-batching decoder on the engine's parameters, GRPO's default)
or `decoder_generate` (the static key/value-cache decoder); another engine
plugs in by giving `rollout` its own. The episodes become the same
`rollout.Rollout` the loss reads:

* tokens: the first prompt, then every id of the episode (the model's and
  the environment's), then padding: W = grpo_prompt_length +
  grpo_max_completion_length columns, the episode's whole length; the
  loss's columns are the ids after the prompt
  (`grpo_max_completion_length` of them, so a first prompt of at least
  grpo_prompt_length tokens can use the whole W);
* mask: 1 on the model's own ids only, so tool results and template tokens
  carry no loss and no gradient;
* rewards: the task's verifier (the environment's reward, if any, reported
  as rewards/verifier) plus the run's reward functions of the text form on
  (prompt text, the model's turns joined by newlines, the record's other
  fields), computed on process 0 and shared;
* every episode is a sample of its group, as in MLPerf qwen35_397b_grpo's
  reference: one its time limit ended has the reward its environment gives
  a timed-out episode (`Environment.timed_out_reward`, 0 by default; no
  reward function sees it), takes its place in its group's baseline and
  trains, and `episode/timeouts` counts it. One whose executor failed a
  call (`Episode.executor_error`: a remote actor died, a call missed its
  deadline) likewise, with reward 0, counted in `episode/executor_errors`.
  Only an episode whose conversation reached the length limit is
  truncated (overlong filtering then masks it; it stays in its group's
  baseline).

Timings: timing/generate (the generation function's seconds), timing/tools
(the environments': tools, verifiers, rendering), timing/episodes (both and
the runner's bookkeeping), timing/reward (the reward functions).

Statistics beside `rollout.rollout_stats`': episode/turns,
episode/tool_calls, episode/tool_errors (means per episode),
episode/timeouts and episode/executor_errors (counts), episode/truncated
(the share that reached the length limit), episode/turn_limit (the share
that used the last turn),
episode/model_tokens and episode/env_tokens (means per episode),
rewards/kind/<task kind> (mean total reward per kind).
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from maxtext.env import episodes as episodes_lib
from maxtext.env import executor as executor_lib
from maxtext.env import share
from maxtext.env import tasks as tasks_lib
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.grpo.loss import advantages as advantages_lib
from maxtext.grpo.rewards import pass_rate
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.grpo.rollout import rollout as rollout_lib

# The record's fields that are not keyword arguments of a text reward.
_NOT_FIELDS = ("prompt", "messages")


def _completions(out, rows: int) -> list[episodes_lib.Completion]:
  """The first `rows` rows of a decoder's output (ids, lengths, log_probs)
  as the runner's completions."""
  return [
      episodes_lib.Completion(
          [int(i) for i in out.ids[r, : out.lengths[r]]],
          [float(x) for x in out.log_probs[r, : out.lengths[r]]],
      )
      for r in range(rows)
  ]


def decoder_generate(
    params: Any,
    model_config: Any,
    rows: int,
    allowed_vocab: int,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> episodes_lib.GenerateFn:
  """The generation function over the key/value-cache decoder.

  Every call generates `rows` rows (the contexts, then copies of the first
  to fill), so the decoder's programs keep one batch shape whatever number
  of episodes is still going.

  Args:
    params: the policy's parameters (read in place).
    model_config: the model's config.
    rows: the batch rows of every call (>= the episodes).
    allowed_vocab: the tokenizer's vocabulary (ids above are never drawn).
    mesh: the engine's mesh, or None.
  """

  def generate(contexts, options, budgets):
    # The rows share one length: a turn gets at most what the longest
    # context leaves of the model's length (the paged decoder gives each
    # row its own).
    del budgets
    room = model_config.max_sequence_length - max(len(c) for c in contexts)
    if options.max_new_tokens > room:
      options = dataclasses.replace(options, max_new_tokens=room)
    filled = list(contexts) + [contexts[0]] * (rows - len(contexts))
    out = decoder.generate(
        params,
        model_config,
        filled,
        options,
        allowed_vocab=allowed_vocab,
        mesh=mesh,
    )
    return _completions(out, len(contexts))

  return generate


def paged_generate(
    params: Any,
    model_config: Any,
    rows: int,
    allowed_vocab: int,
    engine: paged_decoder.EngineOptions,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> episodes_lib.GenerateFn:
  """The generation function over the paged, continuous-batching decoder.

  The decoder runs `engine.num_slots` slots, or `rows` (the step's
  episodes) when that is 0, so its programs keep one shape whatever number
  of episodes is still going. Each call prefills its contexts anew (an
  episode's earlier turns are not kept in the pool between calls).

  Args:
    params: the policy's parameters (read in place).
    model_config: the model's config.
    rows: the slots when `engine.num_slots` is 0.
    allowed_vocab: the tokenizer's vocabulary (ids above are never drawn).
    engine: the paged decoder's slots and pages.
    mesh: the engine's mesh, or None.
  """
  engine = dataclasses.replace(engine, num_slots=engine.num_slots or rows)

  def generate(contexts, options, budgets):
    out = paged_decoder.generate(
        params,
        model_config,
        contexts,
        options,
        max_new_tokens=budgets,
        engine=engine,
        allowed_vocab=allowed_vocab,
        mesh=mesh,
    )
    return _completions(out, len(contexts))

  return generate


def generation_fn(
    params: Any,
    model_config: Any,
    rows: int,
    allowed_vocab: int,
    paged: Optional[paged_decoder.EngineOptions],
    mesh: Optional[jax.sharding.Mesh] = None,
) -> episodes_lib.GenerateFn:
  """`paged_generate` with `paged`'s slots and pages, or `decoder_generate`
  of `rows` rows when `paged` is None (the config's `grpo_decoder`)."""
  if paged is None:
    return decoder_generate(params, model_config, rows, allowed_vocab, mesh)
  return paged_generate(params, model_config, rows, allowed_vocab, paged, mesh)


def prompt_text(record: dict[str, Any]) -> str:
  """The prompt a text reward gets: the record's text, or its last user
  message."""
  if isinstance(record.get("prompt"), str):
    return record["prompt"]
  users = [m for m in record.get("messages", []) if m.get("role") == "user"]
  return str(users[-1]["content"]) if users else ""


@dataclasses.dataclass(frozen=True)
class EpisodeSetup:
  """What a step's episodes need besides the parameters.

  Attributes:
    task: the run's task.
    chat: the policy's `chat.ChatTokenizer`.
    limits: the episodes' limits.
    tools: how tools and verifiers run.
    clock: seconds, for the episodes' wall-time limit.
    executor: where the environments live (`grpo_tool_executor`); None:
      in this process.
  """

  task: tasks_lib.Task
  chat: Any
  limits: episodes_lib.Limits
  tools: tasks_lib.ToolSettings
  clock: Callable[[], float] = time.monotonic
  executor: Optional[executor_lib.Executor] = None


def play(
    setup: EpisodeSetup,
    records: Sequence[dict[str, Any]],
    options: sampling.SamplingOptions,
    generate: episodes_lib.GenerateFn,
    timings: Optional[dict[str, float]] = None,
) -> list[episodes_lib.Episode]:
  """options.num_samples episodes of each record, record-major (timings:
  as `episodes.run`'s)."""
  g = options.num_samples
  return episodes_lib.run(
      [dict(r) for r in records for _ in range(g)],
      # A remote executor pickles it: the task and the tool settings.
      functools.partial(setup.task.make_environment, tools=setup.tools),
      setup.chat,
      generate,
      options,
      setup.limits,
      clock=setup.clock,
      timings=timings,
      executor=setup.executor,
  )


def _score(functions, records, played, g):
  """(per function [N], totals [N]) of the episodes, on process 0, shared;
  every process raises process 0's RewardError. A timed-out episode's total
  is its environment's timed-out reward alone (no reward function sees
  it)."""
  n = len(played)
  scored = [
      r for r, e in enumerate(played) if not (e.timed_out or e.executor_error)
  ]
  answer = None
  if share.is_lead():
    try:
      per_function, total = {}, np.zeros(n)
      if functions and scored:
        rows = [records[r // g] for r in scored]
        values, totals = rewards_lib.score_here(
            functions,
            [prompt_text(rec) for rec in rows],
            ["\n".join(played[r].model_text) for r in scored],
            1,
            [
                {k: v for k, v in rec.items() if k not in _NOT_FIELDS}
                for rec in rows
            ],
        )
        for name, v in values.items():
          per_function[name] = np.zeros(n)
          per_function[name][scored] = v
        total[scored] = totals
      verifier = np.array(
          [0.0 if e.env_reward is None else float(e.env_reward) for e in played]
      )
      if any(played[r].env_reward is not None for r in scored):
        per_function["verifier"] = verifier
        total = total + verifier
      else:
        total = total + np.where([e.timed_out for e in played], verifier, 0.0)
      answer = {
          "per_function": {k: v.tolist() for k, v in per_function.items()},
          "total": total.tolist(),
      }
    except rewards_lib.RewardError as e:
      answer = {"error": str(e)}
  answer = share.from_lead(answer)
  if "error" in answer:
    raise rewards_lib.RewardError(answer["error"])
  return rewards_lib.Rewards(
      np.asarray(answer["total"], np.float64),
      {k: np.asarray(v, np.float64) for k, v in answer["per_function"].items()},
  )


def episode_stats(played, rewards) -> dict[str, float]:
  """The episode/* and rewards/kind/* statistics (module docstring)."""

  def mean(values):
    return float(np.mean(values)) if len(values) else 0.0

  stats = {
      "episode/turns": mean([e.turns for e in played]),
      "episode/tool_calls": mean([e.tool_calls for e in played]),
      "episode/tool_errors": mean([e.tool_errors for e in played]),
      "episode/timeouts": float(sum(e.timed_out for e in played)),
      "episode/executor_errors": float(
          sum(bool(e.executor_error) for e in played)
      ),
      "episode/truncated": mean([e.truncated for e in played]),
      "episode/turn_limit": mean([e.turn_limit for e in played]),
      "episode/model_tokens": mean([e.model_tokens for e in played]),
      "episode/env_tokens": mean([e.env_tokens for e in played]),
  }
  for kind in sorted({e.kind for e in played}):
    rows = [r for r, e in enumerate(played) if e.kind == kind]
    stats[f"rewards/kind/{kind}"] = mean(rewards.total[rows])
  return stats


def rollout(
    params: Any,
    model_config: Any,
    records: Sequence[dict[str, Any]],
    options: sampling.SamplingOptions,
    reward_functions: Sequence[rewards_lib.RewardFunction],
    *,
    setup: EpisodeSetup,
    estimator: str = "grpo",
    advantage_eps: float = 1e-4,
    width: int,
    mesh: Optional[jax.sharding.Mesh] = None,
    overlong_filtering: bool = False,
    paged: Optional[paged_decoder.EngineOptions] = None,
    generate: Optional[episodes_lib.GenerateFn] = None,
) -> rollout_lib.Rollout:
  """Plays, scores and computes advantages for one step (module docstring).

  Args:
    params, model_config, options, reward_functions, estimator,
      advantage_eps, mesh, overlong_filtering: as `rollout.rollout`
      (`options.num_samples` is G; its max_new_tokens is unused: the
      limits bound each turn).
    records: the step's P task records.
    setup: the task, tokenizer, limits and tool settings.
    width: W, the token columns of every row: every episode's whole
      conversation must fit (`setup.limits.max_length` <= W does it).
    paged: when `generate` is None, generate with the paged decoder of
      these slots and pages (`paged_generate`); None = `decoder_generate`.
    generate: the generation function; None = as `paged` says.

  Raises:
    ValueError: a first prompt that leaves no room for a turn, or an
      episode longer than the width (one line).
    rewards.RewardError: a reward function failed (one line).
  """
  g = options.num_samples
  if g < 2:
    raise ValueError(f"num_generations={g}: a group needs at least 2")
  if generate is None:
    n = len(records) * g
    generate = generation_fn(
        params, model_config, n, setup.chat.vocab_size, paged, mesh
    )
  played, rewards, timing = _play_and_score(
      setup, records, options, generate, reward_functions, width
  )
  adv = advantages_lib.per_completion(
      rewards.total, g, estimator, advantage_eps
  )
  result = _assemble(
      played,
      rewards,
      adv,
      g,
      (width, setup.limits.max_tokens),
      overlong_filtering,
  )
  result.stats.update(timing)
  return result


def _play_and_score(setup, records, options, generate, reward_functions, width):
  """(the episodes, their rewards, the timing stats): `rollout`'s playing
  and scoring, timed.

  Raises:
    ValueError: an episode longer than the width (one line).
    rewards.RewardError: a reward function failed (one line).
  """
  start = time.perf_counter()
  timings = {}
  played = play(setup, records, options, generate, timings)
  generated = time.perf_counter()
  for e in played:
    if e.length > width:
      raise ValueError(
          f"an episode of {e.length} tokens (a first prompt of "
          f"{len(e.prompt_ids)}) does not fit the rollout width {width}: "
          "its limits' max_length must be at most the width"
      )
  rewards = _score(reward_functions, records, played, options.num_samples)
  scored = time.perf_counter()
  # Generation alone; the environments' time (tools, verifiers) apart.
  timing = {
      "timing/generate": timings["generate"],
      "timing/tools": timings["environment"],
      "timing/episodes": generated - start,
      "timing/reward": scored - generated,
  }
  return played, rewards, timing


def _assemble(played, rewards, adv, g, shape, overlong_filtering):
  """The Rollout of scored episodes: their rows, masks and statistics.

  Args:
    played: the N episodes, record-major.
    rewards: theirs.
    adv: float32 [N]: their advantages.
    g: G, the episodes of each record.
    shape: (W, L): the token columns of the rows and of the completions.
    overlong_filtering: a truncated episode trains nothing.
  """
  width, length = shape
  n = len(played)
  tokens = np.full((n, width), sampling.PAD_ID, np.int32)
  prompt_lengths = np.zeros((n,), np.int32)
  lengths = np.zeros((n,), np.int32)
  mask = np.zeros((n, length), np.float32)
  old = np.zeros((n, length), np.float32)
  for r, e in enumerate(played):
    row = e.prompt_ids + e.ids
    tokens[r, : len(row)] = row
    prompt_lengths[r] = len(e.prompt_ids)
    lengths[r] = len(e.ids)
    mask[r, : len(e.ids)] = e.model_mask
    old[r, : len(e.ids)] = e.log_probs
  truncated = np.array([e.truncated for e in played])
  sequence_mask = np.ones((n,), np.float32)
  if overlong_filtering:
    sequence_mask[truncated] = 0.0
  stats = rollout_lib.rollout_stats(
      rewards, lengths, truncated, g, overlong_filtering
  )
  stats.update(episode_stats(played, rewards))
  return rollout_lib.Rollout(
      prompts=[e.prompt_ids for e in played[::g]],
      completions=[tuple(e.ids) for e in played],
      rewards=rewards,
      advantages=adv,
      stats=stats,
      tokens=tokens,
      prompt_lengths=prompt_lengths,
      completion_lengths=lengths,
      mask=mask,
      old_log_probs=old,
      sequence_mask=sequence_mask,
  )


def evaluate(
    params: Any,
    model_config: Any,
    setup: EpisodeSetup,
    options: sampling.SamplingOptions,
    reward_functions: Sequence[rewards_lib.RewardFunction],
    *,
    paged: Optional[paged_decoder.EngineOptions] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> dict[str, float]:
  """pass@1 and pass@k of the held-out records (k = options.num_samples).

  The episodes are generated as the rollouts' are (`paged`:
  `generation_fn`). An episode passes when its total reward reaches 1 (the
  verifier's full mark; a timed-out one has its environment's timed-out
  reward).
  """
  records = setup.task.eval_records()
  k = options.num_samples
  generate = generation_fn(
      params,
      model_config,
      len(records) * k,
      setup.chat.vocab_size,
      paged,
      mesh,
  )
  played = play(setup, records, options, generate)
  rewards = _score(reward_functions, records, played, k)
  passed = rewards.total >= 1.0
  correct = passed.reshape(len(records), k).tolist()
  out = {"pass@1": pass_rate.mean_pass_at_k(correct, 1)}
  if k > 1:
    out[f"pass@{k}"] = pass_rate.mean_pass_at_k(correct, k)
  return out
