"""XLA's CPU compiles as a run's, for a test that compares numbers or
trains many steps.

The suite's tests compile XLA CPU programs without LLVM's optimisations
and with XLA's older fusion emitters (`.bazelrc`'s XLA_FLAGS:
`--xla_backend_optimization_level=0`,
`--xla_llvm_disable_expensive_passes=true` and
`--xla_cpu_use_fusion_emitters=false`), which makes their compiles cheap
and their float32 results slightly different from a run's: other code for
the same elementwise functions and reductions. A test that holds
the model's numbers to a reference implementation within a tolerance
measured at XLA's default level (the transformers comparisons) calls
`request()` before JAX starts, so it compiles as a run does; so does a
test whose programs run long enough that the cheap compiles' slower code
costs more than they save (`episode_learn_test`'s GRPO runs). XLA reads
XLA_FLAGS once, when the backend starts; this module imports no JAX.
"""

from collections.abc import MutableMapping
import os

# The flags that lower XLA's CPU compile level, by name (any value).
LEVEL_FLAGS = (
    "--xla_backend_optimization_level",
    "--xla_llvm_disable_expensive_passes",
    "--xla_cpu_use_fusion_emitters",
)


def without_level_flags(xla_flags: str) -> str:
  """`xla_flags` without `LEVEL_FLAGS` (whatever their values); the
  other flags kept in order."""
  return " ".join(
      flag
      for flag in xla_flags.split()
      if flag.split("=", 1)[0] not in LEVEL_FLAGS
  )


def request(environ: MutableMapping[str, str] = os.environ) -> None:
  """Sets `environ`'s XLA_FLAGS to compile at XLA's default level (call
  before JAX starts)."""
  environ["XLA_FLAGS"] = without_level_flags(environ.get("XLA_FLAGS", ""))
