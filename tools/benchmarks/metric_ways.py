"""Ways of recording M metrics over K micro-batches per step, and their
device dispatches per step.

Every way runs the same training step (K jitted micro-steps of a loss's
forward/backward with gradient accumulation, then one jitted optimizer apply)
and ends the step with all metric values on the host:

  baseline     the micro-step computing all M metrics, returned packed in one
               array (the engine's form) and dropped; nothing recorded.
  dict_step    (reference, not a way) the micro-step returning the M metrics
               as M separate outputs, dropped: ways a, b and d need that form,
               so their overheads include its cost.
  a/append     one device array per metric, `jnp.append` per micro-batch.
  b/stack      host lists of device scalars, one `jnp.stack` per metric.
  c/engine     `maxtext.engine.engine.Engine`: packed metrics, `buffer_packed`,
               one flush (plus learning_rate, grad_norm, step_skipped, which
               the program that takes the update returns).
  d/per_name   `MetricsRecorder.buffer_metrics` per metric, one flush.

The loss is a `Problem`: a small MLP with any number of metrics
(`mlp_problem`), a config file's model (`model_problem`), or a config's GRPO
loss on a synthetic rollout micro-batch (`grpo_problem`). `dispatches_per_step`
counts each way's executable launches in one step with JAX's C++ dispatch
fast path off (`testing.dispatch_counter`). `metrics_bench` times the ways;
`grpo_bench` counts them on a GRPO step's metric set.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maxtext.config import config_lib
from maxtext.engine import engine as engine_lib
from maxtext.grpo.loss import train_loss
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.model import transformer
from maxtext.metrics import recorder as metrics_recorder
from testing import dispatch_counter

WAYS = (
    "baseline",
    "dict_step",
    "a/append",
    "b/stack",
    "c/engine",
    "d/per_name",
)
_WIDTH = 32


def _loss_fn(num_metrics: int) -> Callable:
  """A 2-layer MLP regression loss with num_metrics - 1 aux metrics."""

  def loss_fn(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"])
    err = h @ params["w2"] - batch["y"]
    loss = jnp.mean(err**2)
    col = jnp.mean(err * h, axis=0)
    aux = {
        f"m{i:03d}": loss * (i + 1) + col[i % _WIDTH]
        for i in range(num_metrics - 1)
    }
    return loss, aux

  return loss_fn


class Problem:
  """What every way trains: `loss_fn(params, batch) -> (loss, aux)` with
  flat scalar aux metrics, a parameter factory and one batch."""

  def __init__(self, loss_fn: Callable, make_params: Callable, batch):
    self.loss_fn, self.make_params, self.batch = loss_fn, make_params, batch
    _, aux = jax.eval_shape(loss_fn, jax.eval_shape(make_params), batch)
    # The names a way must bring home: the loss and every aux metric.
    self.names = ("loss", *aux)


def _values(aux: dict) -> dict:
  """The aux metrics as arrays: a SummedMetric gives its value (that it is
  reduced by a sum matters only on the host)."""
  return {
      name: v.value if isinstance(v, metrics_recorder.SummedMetric) else v
      for name, v in aux.items()
  }


def mlp_problem(num_metrics: int) -> Problem:
  """The small MLP with num_metrics metrics."""

  def make_params():
    rng = np.random.default_rng(0)
    return {
        "w1": jnp.asarray(rng.normal(size=(_WIDTH, _WIDTH)) * 0.1, jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(_WIDTH, 1)) * 0.1, jnp.float32),
    }

  rng = np.random.default_rng(1)
  x = rng.normal(size=(8, _WIDTH)).astype(np.float32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray(x[:, :1] * 2.0)}
  return Problem(_loss_fn(num_metrics), make_params, batch)


def model_problem(path: str) -> Problem:
  """The model of the config file at `path`, one micro-batch of its shape.

  The aux metrics are flattened to "moe/aux_loss"-style names, as the
  engine names them, so the ways that record by name see the same metrics.
  """
  config = config_lib.load_config_file(path)
  config_lib.validate(config)

  def loss_fn(params, batch):
    loss, aux = transformer.loss_fn(params, batch, config)
    return loss, dict(engine_lib.flatten_metrics("", aux))

  def make_params():
    return transformer.init_params(config, jax.random.PRNGKey(0))

  rows = config_lib.micro_batch_size(config)
  seq = config.max_sequence_length
  tokens = np.random.default_rng(1).integers(
      0, config.vocab_size, size=(rows, seq + 1), dtype=np.int32
  )
  batch = {
      "inputs": jnp.asarray(tokens[:, :-1]),
      "targets": jnp.asarray(tokens[:, 1:]),
  }
  return Problem(loss_fn, make_params, batch)


def grpo_problem(config) -> Problem:
  """The GRPO loss of the config's model on one synthetic rollout
  micro-batch: every metric a GRPO step's device programs record (the
  rollout's statistics are host values, added to the record on the host).

  Args:
    config: a GRPO config, validated (`config_lib.validate_grpo`).
  """
  frozen = ml_collections.FrozenConfigDict(config)
  options = grpo_workload.loss_options(
      grpo_config.GrpoConfig.from_config(config)
  )

  def loss_fn(params, batch):
    loss, aux = train_loss.loss_fn(params, batch, frozen, options)
    return loss, dict(engine_lib.flatten_metrics("", aux))

  def make_params():
    return transformer.init_params(config, jax.random.PRNGKey(0))

  rows = config_lib.micro_batch_size(config)
  length = config.grpo_max_completion_length
  width = config.grpo_prompt_length + length
  rng = np.random.default_rng(1)
  batch = {
      "tokens": jnp.asarray(
          rng.integers(0, config.vocab_size, (rows, width), dtype=np.int32)
      ),
      "prompt_lengths": jnp.full((rows,), config.grpo_prompt_length, jnp.int32),
      "mask": jnp.ones((rows, length), jnp.float32),
      "old_log_probs": jnp.full((rows, length), -1.0, jnp.float32),
      "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
  }
  if options.beta > 0:
    batch["ref_log_probs"] = jnp.full((rows, length), -1.0, jnp.float32)
  return Problem(loss_fn, make_params, batch)


class _ManualPrograms:
  """The jitted micro-steps and apply of the baseline and ways a, b, d.

  Built once per problem and K and shared by those ways: each program is
  then compiled once, not once per way.
  """

  def __init__(self, problem: Problem, k: int):
    loss_fn = problem.loss_fn
    self.optimizer = optax.sgd(1e-3)

    def micro_metrics(params, acc, batch):
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch
      )
      return jax.tree.map(jnp.add, acc, grads), {"loss": loss, **_values(aux)}

    def micro_plain(params, acc, batch):
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch
      )
      packed = jnp.stack([loss, *_values(aux).values()])
      return jax.tree.map(jnp.add, acc, grads), packed

    def apply(params, opt_state, acc):
      grads = jax.tree.map(lambda g: g / k, acc)
      updates, opt_state = self.optimizer.update(grads, opt_state, params)
      return (
          optax.apply_updates(params, updates),
          opt_state,
          jax.tree.map(jnp.zeros_like, acc),
      )

    self.micro_metrics = jax.jit(micro_metrics, donate_argnums=(1,))
    self.micro_plain = jax.jit(micro_plain, donate_argnums=(1,))
    self.apply = jax.jit(apply, donate_argnums=(2,))


class _Manual:
  """Baseline and ways a, b, d: each its own state, the shared programs."""

  def __init__(
      self, problem: Problem, programs: _ManualPrograms, k: int, way: str
  ):
    self.k, self.way = k, way
    self.params = problem.make_params()
    self.opt_state = programs.optimizer.init(self.params)
    self.acc = jax.tree.map(jnp.zeros_like, self.params)
    self.recorder = metrics_recorder.MetricsRecorder(max_history=4)
    self.step_count = 0
    self.micro_metrics = programs.micro_metrics
    self.micro_plain = programs.micro_plain
    self.apply = programs.apply

  def step(self, batch):
    """One training step; returns the host values of the step's metrics."""
    way, out = self.way, None
    if way == "baseline":
      for _ in range(self.k):
        self.acc, _ = self.micro_plain(self.params, self.acc, batch)
    elif way == "dict_step":
      for _ in range(self.k):
        self.acc, _ = self.micro_metrics(self.params, self.acc, batch)
    elif way == "a/append":
      arrays = None
      for _ in range(self.k):
        self.acc, metrics = self.micro_metrics(self.params, self.acc, batch)
        if arrays is None:
          arrays = {n: jnp.reshape(v, (1,)) for n, v in metrics.items()}
        else:
          arrays = {n: jnp.append(arrays[n], metrics[n]) for n in arrays}
      out = arrays
    elif way == "b/stack":
      lists = None
      for _ in range(self.k):
        self.acc, metrics = self.micro_metrics(self.params, self.acc, batch)
        if lists is None:
          lists = {n: [] for n in metrics}
        for n, v in metrics.items():
          lists[n].append(v)
      out = {n: jnp.stack(l) for n, l in lists.items()}
    else:  # d/per_name
      for _ in range(self.k):
        self.acc, metrics = self.micro_metrics(self.params, self.acc, batch)
        for n, v in metrics.items():
          self.recorder.buffer_metrics(self.step_count, n, v)
      self.recorder.flush()
      out = self.recorder.get_step_metrics(self.step_count).scalar_metrics
      self.recorder.cleanup()  # The trainer releases each written step.
    self.params, self.opt_state, self.acc = self.apply(
        self.params, self.opt_state, self.acc
    )
    self.step_count += 1
    if out is not None and way != "d/per_name":
      out = jax.device_get(out)
    jax.block_until_ready(self.params)
    return out


class _EngineWay:
  """Way c: the engine's fwd_bwd and update."""

  def __init__(self, problem: Problem, k: int):
    self.k = k
    self.engine = engine_lib.Engine(
        problem.loss_fn,
        problem.make_params(),
        optax.sgd(1e-3),
        1e-3,
        metrics_recorder.MetricsRecorder(max_history=4),
        k,
    )

  def step(self, batch):
    for _ in range(self.k):
      self.engine.fwd_bwd(batch)
    # As the trainer: the step's buffer leaves the recorder.
    out = self.engine.update(release=True).scalar_metrics
    jax.block_until_ready(self.engine.params)
    return out


def make_ways(problem: Problem, k: int, names=WAYS) -> dict:
  """The ways `names` (of WAYS), each with its own state, at K=k."""
  programs = _ManualPrograms(problem, k)
  ways = {w: _Manual(problem, programs, k, w) for w in names if w != "c/engine"}
  if "c/engine" in names:
    ways["c/engine"] = _EngineWay(problem, k)
  return ways


def check_values(ways: dict, problem: Problem, k: int) -> None:
  """Every recording way ends with the M metrics, K host values each."""
  for name, way in ways.items():
    out = way.step(problem.batch)
    if name in ("baseline", "dict_step"):
      continue
    missing = [n for n in problem.names if np.shape(out.get(n)) != (k,)]
    if missing:
      raise RuntimeError(
          f"{name}: metrics {missing} missing or not of shape ({k},)"
      )


def dispatches_per_step(ways: dict, batch) -> dict[str, int]:
  """Each way's device dispatches in one step (after one to warm its
  Python dispatch path), counted with the C++ fast path off."""
  out = {}
  with dispatch_counter.count_dispatches() as count:
    for name, way in ways.items():
      way.step(batch)
      before = count[0]
      way.step(batch)
      out[name] = count[0] - before
  return out
