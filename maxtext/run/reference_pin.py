"""The frozen reference a run pinned, and the resume that would change it.

A frozen reference policy (`frozen_reference`; GRPO's KL reference with
`grpo_beta` > 0) is the checkpoint that
`load_parameters_path` resolves to, read again at every start: the newest
step of a checkpoint directory. If that directory gains a checkpoint (its
pretraining run went on), a resumed run would silently regularise towards
another policy. So the first attempt pins the reference in the run
directory (`grpo_reference.json`: the path, the checkpoint step it resolved
to and a fingerprint of the parameters read), and every later attempt
compares: a different step or fingerprint is refused in one line unless
`grpo_allow_reference_change` is set, and an allowed change is recorded in
the same file (the old pin, the new one, the time) and becomes the pin.

The fingerprint is computed on the device: per parameter array two 32-bit
wrapping sums of its float32 bit patterns (one plain, one weighted by
position), fetched as scalars and hashed with each array's path, shape and
dtype, so it reads no array onto the host and works on sharded arrays.
"""

import datetime
import hashlib
import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp

from maxtext.storage import checkpointing

PIN_FILE = "grpo_reference.json"


@jax.jit
def _leaf_sums(x):
  bits = jax.lax.bitcast_convert_type(
      x.astype(jnp.float32).reshape(-1), jnp.uint32
  )
  position = jnp.arange(bits.shape[0], dtype=jnp.uint32) * jnp.uint32(
      2654435761
  ) + jnp.uint32(1)
  return jnp.stack([jnp.sum(bits), jnp.sum(bits * position)])


def fingerprint(params: Any) -> str:
  """A hex digest that changes when any parameter's value does.

  Args:
    params: a pytree of arrays (any float dtype; sharded or not).
  """
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_leaves_with_path(params)
  sums = jax.device_get([_leaf_sums(leaf) for _, leaf in leaves])
  for (path, leaf), pair in zip(leaves, sums):
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(f"{tuple(leaf.shape)}{leaf.dtype}".encode())
    digest.update(bytes(memoryview(pair)))
  return digest.hexdigest()[:16]


def pin_of(load_parameters_path: str, params: Any) -> dict:
  """The pin of a reference read from `load_parameters_path` ("" = drawn
  from the seed: no checkpoint step)."""
  step: Optional[int] = (
      checkpointing.params_checkpoint_step(load_parameters_path)
      if load_parameters_path
      else None
  )
  return {
      "load_parameters_path": load_parameters_path,
      "step": step,
      "fingerprint": fingerprint(params),
  }


def _describe(pin: dict) -> str:
  return f"step {pin['step']} (fingerprint {pin['fingerprint']})"


def check_and_record(
    run_dir: str, pin: dict, *, allow_change: bool, write: bool = True
) -> Optional[str]:
  """Pins `pin` on a first attempt; on a later one, refuses a change.

  Args:
    run_dir: the run's local directory.
    pin: this attempt's `pin_of`.
    allow_change: grpo_allow_reference_change.
    write: this process writes the record (process 0).

  Returns:
    None, or a line saying which change was allowed (logged by the caller).

  Raises:
    ValueError: one line, the reference differs from the pinned one and
      allow_change is False; nothing is written then.
  """
  path = os.path.join(run_dir, PIN_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except FileNotFoundError:
    record = None
  if record is None:
    if write:
      _write(path, {"pinned": pin, "changes": []})
    return None
  pinned = record["pinned"]
  if (pinned["step"], pinned["fingerprint"]) == (
      pin["step"],
      pin["fingerprint"],
  ):
    return None
  change = (
      f"the KL reference changed: load_parameters_path="
      f"{pin['load_parameters_path']!r} now reads {_describe(pin)}, the run "
      f"pinned {_describe(pinned)} at its start"
  )
  if not allow_change:
    raise ValueError(
        f"{change}; resume with that checkpoint (a step directory may be "
        "named), or set grpo_allow_reference_change=True if the change is "
        "intended"
    )
  if write:
    record["changes"].append(
        {
            "time_utc": datetime.datetime.now(
                datetime.timezone.utc
            ).isoformat(),
            "from": pinned,
            "to": pin,
        }
    )
    record["pinned"] = pin
    _write(path, record)
  return change + " (allowed by grpo_allow_reference_change)"


def _write(path: str, record: dict) -> None:
  temporary = path + ".tmp"
  with open(temporary, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(temporary, path)
