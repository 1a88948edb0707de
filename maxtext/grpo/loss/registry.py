"""The implementations of one GRPO choice field, looked up by name.

A choice field of the config (`grpo_advantage_estimator`,
`grpo_kl_estimator`, `grpo_loss_aggregation`) takes one of the names listed
in `maxtext.core.choices`, the one table the config check
(`maxtext.config.config_lib`) and this package both read. Each module that
implements a field keeps a `Registry` of it: one function per name, all
with the signature the module documents, registered with the decorator

    @_ESTIMATORS.register("rloo")
    def _rloo(rewards, eps): ...

A registry accepts only the table's names, and the module closes it with
`complete()` once every function is registered, so a name without an
implementation (or an implementation under no name) fails at import, not at
the first step that asks for it.
"""

from typing import Callable, Sequence


class Registry:
  """One config field's implementations by name (module docstring)."""

  def __init__(self, field: str, names: Sequence[str]):
    """A registry of `field` (its config name), whose choices are `names`."""
    self._field = field
    self._names = tuple(names)
    self._functions: dict[str, Callable] = {}

  @property
  def names(self) -> tuple[str, ...]:
    """The field's choices, in the table's order."""
    return self._names

  def register(self, name: str) -> Callable[[Callable], Callable]:
    """A decorator that registers its function under `name`.

    Raises:
      ValueError: `name` is not one of the table's, or already registered.
    """
    if name not in self._names:
      raise ValueError(
          f"{self._field}: {name!r} is not one of the choices "
          f"{list(self._names)} (maxtext.core.choices)"
      )
    if name in self._functions:
      raise ValueError(f"{self._field}: {name!r} is registered twice")

    def add(function: Callable) -> Callable:
      self._functions[name] = function
      return function

    return add

  def complete(self) -> None:
    """Checks that every choice has its function.

    Raises:
      ValueError: a choice without one.
    """
    missing = [name for name in self._names if name not in self._functions]
    if missing:
      raise ValueError(f"{self._field}: no implementation of {missing}")

  def check(self, name: str) -> None:
    """Raises ValueError naming the field and its choices for an unknown
    `name`."""
    if name not in self._functions:
      raise ValueError(
          f"{self._field}={name!r}: must be one of {list(self._names)}"
      )

  def __getitem__(self, name: str) -> Callable:
    """The function registered under `name` (ValueError as `check`)."""
    self.check(name)
    return self._functions[name]
