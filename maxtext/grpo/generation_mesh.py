"""Generation on devices of its own: the mesh and the weight copy.

With `grpo_generation_devices` = N > 0, the last N devices of a
single-process job generate and the others train (`mesh.generation_split`).
The generation mesh splits the parameters FSDP over its devices, with the
config's tensor parallelism where it divides N (and no expert or context
axis: a decode step holds one token a sequence). Before each rollout the
engine's parameters are cast to the compute dtype on the training mesh and
copied onto the generation mesh (`copy`): `rollout/weight_copy_bytes` and
`timing/weight_copy` record what it moved and how long it took, the
parameters' bytes in the compute dtype (one model) and the seconds until
the copy is on the generation devices.

The rollout then runs there (its programs dispatched to other devices than
the training step's), so with `grpo_max_age` 1 the rollout of step s + 1 and
update s run at the same time on different devices; with `grpo_max_age` 0
the rollout waits for the update as it does on shared devices. The copy is
of the parameters the rollout is drawn with, so its samples' versions (ages)
are the same as on shared devices.
"""

import time
from typing import Any, Optional

import jax
import jax.numpy as jnp

from maxtext.engine import model_setup
from maxtext.generation import generate_compile_lib
from maxtext.runtime import mesh as mesh_lib


def _generation_config(config, num_devices: int):
  """`config` with the generation mesh's fields: data 1, FSDP over the
  rest, the config's tensor parallelism where it divides the devices."""
  tensor = getattr(config, "tensor_parallelism", 1)
  out = config.copy_and_resolve_references()
  with out.unlocked():
    out.data_parallelism = 1
    out.fsdp_parallelism = -1
    out.dcn_data_parallelism = 1
    out.dcn_fsdp_parallelism = 1
    out.expert_parallelism = 1
    out.context_parallelism = 1
    out.tensor_parallelism = tensor if num_devices % tensor == 0 else 1
    out.grpo_generation_devices = 0
  return out


class GenerationMesh:
  """The generation devices' mesh and the copy of the weights onto it.

  Attributes:
    mesh: the generation mesh.
    copy_bytes: bytes one copy moves (the parameters in the compute dtype).
  """

  def __init__(self, config, devices: list):
    gen_config = _generation_config(config, len(devices))
    self.mesh = mesh_lib.make_mesh(gen_config, devices)
    setup = model_setup.setup_model(gen_config, self.mesh)
    self._shardings = setup.param_shardings
    dtype = jnp.dtype(config.compute_dtype)

    def cast(params):
      return jax.tree.map(
          lambda x: (
              x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
          ),
          params,
      )

    self._cast = jax.jit(cast)
    self.copy_bytes = generate_compile_lib.weight_copy(
        gen_config, self.mesh
    ).total_bytes

  def copy(self, params: Any) -> tuple[Any, float]:
    """(`params` cast to the compute dtype on the generation mesh, the
    seconds the copy took: dispatch to arrival, measured by waiting on
    it)."""
    start = time.perf_counter()
    copied = jax.device_put(self._cast(params), self._shardings)
    jax.block_until_ready(copied)
    return copied, time.perf_counter() - start


def make(config) -> Optional[GenerationMesh]:
  """The run's `GenerationMesh`, or None when generation shares the
  training devices (`grpo_generation_devices` 0).

  Raises:
    ValueError: as `mesh.generation_split`.
  """
  _, devices = mesh_lib.generation_split(config)
  return GenerationMesh(config, devices) if devices else None
