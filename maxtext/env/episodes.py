"""The episode runner: environments and the policy, turn by turn, in tokens.

`run(tasks, make_environment, chat, generate, options, limits)` plays one
episode per task record (a GRPO group is G copies of a record, in order):

1. process 0 has its executor (`executor.py`: in this process, or on a
   pool of Ray actors) make each episode's environment, and renders its
   first messages with the policy's chat template (and the environment's
   tools) followed by the generation prompt: the episode's prompt ids;
2. every turn, the active episodes' contexts (their prompt, then every
   token so far) go to `generate` in one call, which continues each once
   and stops on the template's end-of-turn id;
3. process 0 decodes each model turn, hands all of the turn's texts to the
   executor, whose environments answer them (the local executor one after
   another, a remote one many at once), and renders each answer: the
   tokens the template writes after the model's stop id and for the new
   messages, up to the next generation prompt. An answer the executor
   could not get (`executor.Fault`: its actor died, it missed its
   deadline) ends that episode `executor_error`: it keeps its tokens,
   gets no reward function and reward 0, and stays a sample of its group,
   as a timed-out one;
4. every result of process 0 (prompt ids, environment tokens, ends, counts,
   rewards) is shared with every process (`share.from_lead`), so all
   processes hold the same episodes and call `generate` alike.

The tokens are built by appending, never by rendering the conversation
again, so the ids a turn trained on are exactly the ids the model saw and
wrote. `model_mask` is 1 on the model's own ids only: the environment's and
the template's tokens carry no loss.

Limits (`Limits`), as MLPerf qwen35_397b_grpo's reference (NeMo-RL's
multi-turn rollout) sets them:

* the length: `max_length` tokens in all, the first prompt counted (the
  reference's `max_total_sequence_length`, the model's length), and
  `max_tokens` ids after the first prompt (model and environment: the
  columns a rollout keeps for them); what is left of an episode is the
  less of the two (`Limits.room`). An episode whose conversation reaches
  it ends `truncated`: a model turn that fills what is left without its
  stop id, or an environment answer that does not fit (the part that fits
  is not kept: the model never saw it). Only these are truncated, which
  overlong filtering drops. A first prompt that leaves no room for a turn
  is refused (ValueError) before anything is generated.
* `max_turns` model turns: an episode that uses its last turn ends there
  and is scored and trained like one the model ended (`turn_limit`).
* `max_turn_tokens` per model turn: a turn cut there (below the length
  limit) goes to the environment like any other turn (the template closes
  it with the end-of-turn id, an environment token), and the episode goes
  on.
* `episode_seconds`: each episode's own wall time, from the making of its
  environment (its `deadline`: a tool's command gets at most what is left
  of it). An episode past it after a turn ends `timed_out`, keeps its
  tokens and takes the reward its environment gives a timed-out episode
  (`Environment.timed_out_reward`, 0 unless the environment says
  otherwise): it stays a sample of its group.

`generate(contexts, options, budgets) -> [Completion]` is the one
generation function: `contexts` are id lists, `options` the step's sampling
options with `num_samples` 1, the turn's seed and `max_new_tokens` the
largest of `budgets`, and `budgets[i]` the most ids context i may get: the
turn's limit or, when less, what is left of its episode's length, so a
context plus its budget never passes `max_length` (nor the first prompt
plus `max_tokens`); it returns one completion per context. Any engine
that continues id lists plugs in there.
"""

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from maxtext.env import environment as environment_lib
from maxtext.env import executor as executor_lib
from maxtext.env import share
from maxtext.generation import sampling


@dataclasses.dataclass(frozen=True)
class Completion:
  """One continuation: its ids (a stop id kept) and their log-probs."""

  ids: list[int]
  log_probs: list[float]


GenerateFn = Callable[
    [Sequence[Sequence[int]], sampling.SamplingOptions, Sequence[int]],
    list[Completion],
]


@dataclasses.dataclass(frozen=True)
class Limits:
  """How far an episode may go (module docstring)."""

  max_turns: int = 1
  max_tokens: int = 256
  max_turn_tokens: int = 256
  episode_seconds: float = 600.0
  # The whole conversation's tokens, the first prompt included; None: only
  # max_tokens bounds an episode.
  max_length: Optional[int] = None

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value is None and field.name == "max_length":
        continue
      if not value > 0:
        raise ValueError(f"episode limit {field.name}={value!r}: must be > 0")

  def room(self, episode: "Episode") -> int:
    """The ids `episode` may still add: what is left of `max_tokens` after
    its first prompt and of `max_length` in all, whichever is less."""
    left = self.max_tokens - len(episode.ids)
    if self.max_length is not None:
      left = min(left, self.max_length - episode.length)
    return left


@dataclasses.dataclass
class Episode:
  """One played episode.

  Attributes:
    kind: the task's kind.
    prompt_ids: the rendered first messages and generation prompt.
    ids: every id after the prompt, the model's and the environment's.
    model_mask: int8 per id of `ids`: 1 where the model wrote it.
    log_probs: per id of `ids`: the behaviour policy's (0 off the model's).
    model_text: each model turn, decoded.
    turns, tool_calls, tool_errors: counts.
    truncated: its conversation reached the length limit (`Limits.room`).
    turn_limit: it used its last turn (scored and trained).
    timed_out: its wall time ended it (scored with the environment's
      `timed_out_reward`, trained).
    env_reward: the environment's verifier reward (None: none).
    executor_error: why a call of its environment ended without an answer
      (a remote executor's fault: its actor died or it missed its
      deadline), or "": the episode ended there, invalid, with reward 0.
  """

  kind: str
  prompt_ids: list[int]
  ids: list[int] = dataclasses.field(default_factory=list)
  model_mask: list[int] = dataclasses.field(default_factory=list)
  log_probs: list[float] = dataclasses.field(default_factory=list)
  model_text: list[str] = dataclasses.field(default_factory=list)
  turns: int = 0
  tool_calls: int = 0
  tool_errors: int = 0
  truncated: bool = False
  turn_limit: bool = False
  timed_out: bool = False
  env_reward: Optional[float] = None
  executor_error: str = ""
  done: bool = False

  @property
  def length(self) -> int:
    """The conversation's tokens: the first prompt and every id after it."""
    return len(self.prompt_ids) + len(self.ids)

  @property
  def model_tokens(self) -> int:
    return int(sum(self.model_mask))

  @property
  def env_tokens(self) -> int:
    return len(self.ids) - self.model_tokens

  @property
  def active(self) -> bool:
    return not (
        self.done
        or self.truncated
        or self.turn_limit
        or self.timed_out
        or self.executor_error
    )


class _Conversation:
  """Process 0's side of one episode: its environment's kind, tools and
  the messages so far (the environment itself lives in the executor)."""

  def __init__(self, started: executor_lib.Started, chat):
    self.kind = started.kind
    self.tools = started.tools
    self.chat = chat
    self.messages = list(started.messages)

  def prompt_ids(self) -> list[int]:
    return self.chat.encode_prompt(self.messages, tools=self.tools)

  def answer(
      self, model_ids: Sequence[int], text: str, reply: environment_lib.Reply
  ) -> dict[str, Any]:
    """The environment's answer `reply` to the model turn `model_ids`
    (decoded: `text`), in tokens."""
    assistant = {"role": "assistant", "content": text}
    out = {
        "text": text,
        "done": reply.done,
        "tool_calls": reply.tool_calls,
        "tool_errors": reply.tool_errors,
        "env_ids": [],
    }
    history = self.messages
    self.messages = history + [assistant] + reply.messages
    if reply.done:
      return out
    tools = self.tools
    head = self.chat.render(history, add_generation_prompt=True, tools=tools)
    base = self.chat.render(history + [assistant], tools=tools)
    full = self.chat.render(
        self.messages, add_generation_prompt=True, tools=tools
    )
    if not full.startswith(base) or not base.startswith(head):
      raise ValueError(
          "the chat template does not render an episode's conversation as "
          "a prefix of its continuation, so the environment's tokens "
          "cannot be appended"
      )
    # What the template writes after the model's stop id (a newline) goes
    # with the environment's tokens.
    said = self.chat.tokenizer.decode(
        [int(i) for i in model_ids], skip_special_tokens=False
    )
    turn = base[len(head) :]
    tail = turn[len(said) :] if turn.startswith(said) else ""
    out["env_ids"] = self.chat.tokenizer.encode(
        tail + full[len(base) :], add_special_tokens=False
    ).ids
    return out


def _turn_seed(seed: int, turn: int) -> int:
  return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0] >> 1)


def run(
    tasks: Sequence[dict[str, Any]],
    make_environment: Callable[[dict], environment_lib.Environment],
    chat,
    generate: GenerateFn,
    options: sampling.SamplingOptions,
    limits: Limits,
    *,
    clock: Callable[[], float] = time.monotonic,
    timings: Optional[dict[str, float]] = None,
    executor: Optional[executor_lib.Executor] = None,
) -> list[Episode]:
  """Plays one episode per task (module docstring).

  Args:
    tasks: task records, one per episode (process 0's are used).
    make_environment: task record -> its Environment (called on process 0,
      or where `executor` keeps the environments).
    chat: the policy's `chat.ChatTokenizer`.
    generate: the generation function (module docstring).
    options: the sampling options; its seed and stop ids are used,
      num_samples and max_new_tokens are set per turn.
    limits: the episodes' limits.
    clock: seconds (the wall-time limit reads it).
    timings: if given, gets "generate" (seconds in `generate`) and
      "environment" (seconds process 0 spent on the environments: starting
      them, their answers and tools, their rewards), on the host clock.
    executor: where the environments live (`executor.py`); None: here.

  Returns:
    The episodes, in the order of `tasks`, equal on every process.
  """
  batch = None
  spent = {"generate": 0.0, "environment": 0.0}
  try:
    first, conversations = None, []
    if share.is_lead():
      began = time.perf_counter()
      batch = (executor or executor_lib.LocalExecutor()).open(
          make_environment, tasks, limits.episode_seconds, clock
      )
      conversations = [_Conversation(s, chat) for s in batch.started]
      first = [(c.kind, c.prompt_ids()) for c in conversations]
      spent["environment"] += time.perf_counter() - began
    episodes = [Episode(k, list(ids)) for k, ids in share.from_lead(first)]
    _check_prompts(episodes, limits)
    turn = _Turns(episodes, conversations, batch, generate, options, limits)
    for number in range(limits.max_turns):
      if not turn.play(number, clock, spent):
        break
    for e in episodes:
      if e.active:  # The last turn was used.
        e.turn_limit = True
    _set_rewards(episodes, batch, spent)
    if timings is not None:
      timings.update(spent)
    return episodes
  finally:
    if batch is not None:
      batch.close()


def _set_rewards(episodes, batch, spent: dict[str, float]) -> None:
  """Each episode's environment reward, asked on process 0 (the timed-out
  reward for an episode past its wall time; none for one its executor
  failed, whose environment may be gone) and shared, with the executor's
  faults."""
  rewards = None
  if share.is_lead():
    began = time.perf_counter()
    asked = batch.rewards(
        {i: e.timed_out for i, e in enumerate(episodes) if not e.executor_error}
    )
    rewards = [
        [None, r.reason] if isinstance(r, executor_lib.Fault) else [r, ""]
        for r in (asked.get(i) for i in range(len(episodes)))
    ]
    spent["environment"] += time.perf_counter() - began
  for e, (reward, error) in zip(episodes, share.from_lead(rewards)):
    e.env_reward = reward
    e.executor_error = e.executor_error or error


class _Turns:
  """The turns of `run`'s episodes (on process 0, with their conversations).

  Attributes are `run`'s: the episodes, process 0's conversations and
  executor batch (empty and None elsewhere), the generation function, the
  sampling options and the limits.
  """

  def __init__(self, episodes, conversations, batch, generate, options, limits):
    self._episodes = episodes
    self._conversations = conversations
    self._batch = batch
    self._generate = generate
    self._options = options
    self._limits = limits

  def play(self, turn: int, clock, spent: dict[str, float]) -> bool:
    """Plays turn `turn` of every active episode; False when none is.

    The active episodes' continuations are generated together; process 0
    has their environments answer (and marks the episodes past their wall
    time), and every process applies the answers it shares.

    Args:
      turn: the turn's number, from 0.
      clock: `run`'s clock.
      spent: "generate" and "environment" seconds, added to.
    """
    episodes, limits = self._episodes, self._limits
    active = [i for i, e in enumerate(episodes) if e.active]
    if not active:
      return False
    budgets, turn_options = _turn_request(
        [episodes[i] for i in active], self._options, limits, turn
    )
    began = time.perf_counter()
    completions = self._generate(
        [episodes[i].prompt_ids + episodes[i].ids for i in active],
        turn_options,
        budgets,
    )
    spent["generate"] += time.perf_counter() - began
    answers = None
    if share.is_lead():
      began = time.perf_counter()
      answers = _answers(
          episodes,
          (self._conversations, self._batch),
          active,
          completions,
          self._options,
          limits,
      )
      spent["environment"] += time.perf_counter() - began
      now = clock()
      answers["timed_out"] = [
          i
          for i in active
          if now - self._batch.opened_at[i] > limits.episode_seconds
      ]
    answers = share.from_lead(answers)
    _apply(episodes, active, completions, answers, limits, turn)
    return True


def _check_prompts(episodes, limits):
  """Refuses (one line) a first prompt that leaves an episode no room for
  a turn."""
  for e in episodes:
    if limits.room(e) < 1:
      raise ValueError(
          f"a first prompt of {len(e.prompt_ids)} tokens leaves no room for "
          f"a turn in an episode's length ({limits.max_length} tokens in "
          "all, the first prompt counted)"
      )


def _turn_request(active, options, limits, turn):
  """(budgets, sampling options) of a turn of the `active` episodes. Ids
  past an episode's length would be cut, and asking for them could pass
  the model's length: each asks for what it has left."""
  budgets = [min(limits.max_turn_tokens, limits.room(e)) for e in active]
  turn_options = dataclasses.replace(
      options,
      num_samples=1,
      max_new_tokens=max(budgets),
      seed=_turn_seed(options.seed, turn),
  )
  return budgets, turn_options


def _answers(episodes, environments, active, completions, options, limits):
  """Process 0: every active episode's answer to its model turn, their
  environments (`environments`: the conversations and the executor's
  batch) asked all at once."""
  conversations, batch = environments
  stop_ids = set(options.stop_ids)
  turns, texts, kept = {}, {}, {}
  for i, completion in zip(active, completions):
    room = limits.room(episodes[i])
    kept[i] = list(completion.ids)[:room]
    turns[i] = {"keep": len(kept[i])}
    if len(kept[i]) == room and not (kept[i] and kept[i][-1] in stop_ids):
      # The turn filled the episode's length without ending: the
      # conversation reached the limit; the environment does not see a
      # half turn.
      turns[i].update(cut=True, text="")
      continue
    texts[i] = conversations[i].chat.decode(kept[i])
  replies = batch.step(texts)
  for i, text in texts.items():
    if isinstance(replies[i], executor_lib.Fault):
      turns[i].update(text=text, fault=replies[i].reason)
      continue
    answer = conversations[i].answer(kept[i], text, replies[i])
    answer["keep"] = len(kept[i])
    left = limits.room(episodes[i]) - len(kept[i]) - len(answer["env_ids"])
    if not answer["done"] and left <= 0:
      # The answer does not fit, or fills the length with no room for
      # another turn.
      answer["cut"] = left < 0
      answer["full"] = left == 0
      if left < 0:
        answer["env_ids"] = []
    turns[i] = answer
  return {"turns": [turns[i] for i in active]}


def _apply(episodes, active, completions, answers, limits, turn):
  """Every process: the turn's ids and process 0's answers, appended."""
  del limits
  for i, completion, answer in zip(active, completions, answers["turns"]):
    e = episodes[i]
    keep = answer["keep"]
    e.ids += list(completion.ids[:keep])
    e.model_mask += [1] * keep
    e.log_probs += [float(x) for x in completion.log_probs[:keep]]
    e.turns = turn + 1
    e.model_text.append(answer.get("text", ""))
    e.tool_calls += answer.get("tool_calls", 0)
    e.tool_errors += answer.get("tool_errors", 0)
    if answer.get("fault"):
      e.executor_error = answer["fault"]
      continue
    if answer.get("cut"):
      e.truncated = True
      continue
    if answer.get("done"):
      e.done = True
      continue
    env_ids = answer["env_ids"]
    e.ids += env_ids
    e.model_mask += [0] * len(env_ids)
    e.log_probs += [0.0] * len(env_ids)
    if answer.get("full"):
      e.truncated = True
  for i in answers["timed_out"]:
    if episodes[i].active:
      episodes[i].timed_out = True
