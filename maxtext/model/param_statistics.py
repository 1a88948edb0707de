"""Parameters that statistics of the forward pass move, not gradients.

Some parameters are not trained by gradient descent but set from what the
forward pass observed. DeepSeek-V3's router correction bias is one: after
each step it moves by a fixed amount toward balancing the experts' load
("auxiliary-loss-free load balancing"), and no gradient reaches it (it
steers the top-k choice only).

The contract between a loss function and the engine:

* The loss function's aux holds, under `KEY`, a dict {parameter path:
  statistic}, each statistic an array of the shape of the parameter at
  that path (`path` joins the parameter tree's keys with "/", e.g.
  "moe_layers/router_bias"). The engine does not record it as a metric.
* The engine is given one rule per path, `rule(param, statistic) -> new
  param`. It sums a step's statistics over the micro-batches in the
  gradient accumulator's slot of that parameter (the parameter takes no
  gradient, so the slot is free), and after the optimizer's update it
  replaces the parameter by its rule applied to the step's mean statistic.
  The optimizer sees a zero gradient there and its update of the parameter
  is discarded; the gradient norm, the clipping and the finiteness check
  cover the gradients alone.

So a statistic costs no dispatch and no memory beyond its parameter's
accumulator slot, a skipped step (non-finite gradients) moves nothing, and
the checkpointed state (parameters, optimizer state) keeps its structure.
"""

from typing import Any, Callable, Mapping

# The aux key under which a loss function returns its statistics.
KEY = "param_statistics"

# rule(param, mean statistic of the step) -> the parameter's new value.
Rule = Callable[[Any, Any], Any]


def path_name(path) -> str:
  """A parameter's path (from `jax.tree_util.tree_flatten_with_path`) as
  the "/"-joined names this module's contract uses."""
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def check_rules(rules: Mapping[str, Rule], param_paths) -> dict[str, Rule]:
  """`rules` checked against the parameters' paths.

  Raises:
    TypeError/ValueError: a rule that is not callable, or a path that names
      no parameter.
  """
  if not isinstance(rules, Mapping):
    raise TypeError(f"statistic_rules must be a mapping; got {rules!r}")
  known = set(param_paths)
  for path, rule in rules.items():
    if path not in known:
      raise ValueError(
          f"statistic_rules[{path!r}]: no such parameter; the parameters "
          f"are {sorted(known)}"
      )
    if not callable(rule):
      raise TypeError(f"statistic_rules[{path!r}] is not callable: {rule!r}")
  return dict(rules)


def statistics_of(aux, rules: Mapping[str, Rule], shapes: Mapping) -> dict:
  """The loss's statistics (at trace time), checked against the rules.

  Args:
    aux: the loss function's aux (a mapping or None).
    rules: path -> rule, as the engine was given.
    shapes: path -> the parameter's shape.

  Returns:
    path -> statistic, one for every rule ({} without rules).

  Raises:
    ValueError: the loss returns statistics for other paths than the rules
      name, or one of another shape than its parameter.
  """
  given = aux.get(KEY, {}) if isinstance(aux, Mapping) else {}
  if not isinstance(given, Mapping) or set(given) != set(rules):
    got = sorted(given) if isinstance(given, Mapping) else given
    raise ValueError(
        f"loss_fn's aux[{KEY!r}] holds {got!r}; the engine has statistic "
        f"rules for {sorted(rules)}"
    )
  for path, value in given.items():
    if tuple(value.shape) != tuple(shapes[path]):
      raise ValueError(
          f"statistic {path!r}: shape {tuple(value.shape)}, but the "
          f"parameter's is {tuple(shapes[path])}"
      )
  return dict(given)
