"""Starting JAX's multi-controller runtime from its settings.

Must run before any other JAX call of the process. One process (the default)
needs no runtime and this is a no-op. With `num_processes > 1` every process
passes the same `coordinator_address` and its own `process_id`; with
`num_processes == 0` JAX detects everything from the cluster environment (TPU
pods, SLURM, ...).
"""

import dataclasses
import sys
import threading

from absl import logging
import jax

from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class DistributedConfig(component_config.ComponentConfig):
  """How the process joins the runtime (`maxtext/configs/base.py`
  documents each field; `config_lib.validate` checks them)."""

  num_processes: int = 1
  coordinator_address: str = ""
  process_id: int = -1
  distributed_init_timeout_seconds: int = 300


def _explain_if_stuck(
    done: threading.Event, timeout: int, config: DistributedConfig
) -> None:
  """Prints what went wrong just before JAX gives up waiting for the processes.

  JAX ends a process whose peers never join with a fatal error (SIGABRT) from
  C++, which Python cannot catch; this watchdog says it in plain words first.
  """
  margin = min(1.0, 0.1 * timeout)
  if not done.wait(max(0.0, timeout - margin)):
    print(
        f"train_main: error: jax.distributed could not gather all "
        f"{config.num_processes} processes at coordinator "
        f"{config.coordinator_address or '(from the cluster environment)'} "
        f"within distributed_init_timeout_seconds={timeout} (this is process "
        f"{config.process_id}). Check that every process was started with the "
        "same num_processes and coordinator_address and can reach it; JAX will "
        "now abort this process.",
        file=sys.stderr,
        flush=True,
    )


def initialize(config: DistributedConfig) -> None:
  """Initialises jax.distributed as the settings ask.

  Args:
    config: the run's distributed settings (from a validated config).

  Raises:
    ValueError: an explicit multi-process setup lacks its coordinator or
      process id.
  """
  num_processes = config.num_processes
  if num_processes == 1:
    return
  timeout = int(config.distributed_init_timeout_seconds)
  done = threading.Event()
  threading.Thread(
      target=_explain_if_stuck,
      args=(done, timeout, config),
      daemon=True,
      name="distributed_init_watchdog",
  ).start()
  try:
    _initialize(config, num_processes, timeout)
  finally:
    done.set()
  logging.info(
      "jax.distributed ready: process %d of %d, %d local / %d global devices.",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
  )


def _initialize(
    config: DistributedConfig, num_processes: int, timeout: int
) -> None:
  """Calls jax.distributed.initialize with the settings' or detected setup."""
  if num_processes == 0:
    logging.info("Initialising jax.distributed from the cluster environment.")
    jax.distributed.initialize(initialization_timeout=timeout)
  else:
    if not config.coordinator_address:
      raise ValueError(
          f"coordinator_address must be set when num_processes={num_processes}"
      )
    if not 0 <= config.process_id < num_processes:
      raise ValueError(
          f"process_id={config.process_id} must be in "
          f"[0, {num_processes}) when num_processes={num_processes}"
      )
    logging.info(
        "Initialising jax.distributed: process %d of %d, coordinator %s; "
        "waiting up to %d s for every process to join.",
        config.process_id,
        num_processes,
        config.coordinator_address,
        timeout,
    )
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=num_processes,
        process_id=config.process_id,
        initialization_timeout=timeout,
    )
