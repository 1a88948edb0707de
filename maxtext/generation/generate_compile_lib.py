"""Compiles a rollout's generation programs for given devices, ahead of time.

The programs are the paged decoder's own (`paged_lowering.lower`): a
prefill call (a chunk of `EngineOptions.prefill_tokens` positions at most of
its most contexts per data-parallel replica, running on from the chunk
before where a context takes more than one) and the decode program of every
slot over the widest page table, lowered on abstract arguments
(nothing is allocated) and compiled by the devices' compiler. On libtpu's
description of a TPU slice (`topology.abstract_devices`) the real TPU
compiler runs on this host and its memory analysis says whether the
rollout fits the slice's HBM, as `train_compile_lib` does for the training
step (whose `ProgramMemory` figures these are).

The parameters are the generation mesh's copy: the matrices in the compute
dtype (the dtype the model computes in; training keeps them in
`weight_dtype`; `decode_weights`), split
as the trainer splits them on that mesh (`model_setup`: FSDP, the expert
and tensor axes). The engine's own arrays are placed as
`paged_decoder.generate` places them (`replica_layout`): on a mesh with a
"data" axis of R devices, R replicas of the engine each hold 1 / R of the
slots (their page tables, recurrent states and logits) and 1 / R of the
pool's pages; the pool is split by key/value heads over the tensor axis
where it divides them (`paged_decoder.pool_sharding`); within a replica
the slots' arrays are on every device.

Per program, per device (as `train_compile_lib`):

  args      the parameters, the pool (and, for decode, the slots' states
            and logits)
  out       the pool, states and logits it returns
  alias     output bytes that reuse donated argument buffers (the pool;
            for decode the states and logits too)
  temp      the compiler's temporaries
  resident  the engine's arrays that are not arguments: beside the prefill
            the slots' states and logits
  peak      args + out - alias + temp + resident

`weight_copy` says what one copy of the parameters to such a mesh moves.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from maxtext.core import progress as progress_lib
from maxtext.engine import model_setup
from maxtext.engine import train_compile_lib
from maxtext.generation import decode_weights
from maxtext.generation import kv_cache
from maxtext.generation import paged_decoder
from maxtext.generation import paged_lowering
from maxtext.model import model_config


@dataclasses.dataclass(frozen=True)
class WeightCopy:
  """One copy of the parameters onto a generation mesh.

  Attributes:
    dtype: the copy's dtype (the compute dtype).
    total_bytes: the parameters' bytes in that dtype (one model).
    device_bytes: what one device of the mesh holds of them (its shard).
    devices: the mesh's devices.
  """

  dtype: str
  total_bytes: int
  device_bytes: int
  devices: int

  @property
  def received_bytes(self) -> int:
    """Bytes the mesh's devices receive together: `total_bytes` times the
    copies the mesh keeps (its axes that do not split the parameters)."""
    return self.device_bytes * self.devices


@dataclasses.dataclass(frozen=True)
class GenerationCompile:
  """A rollout's programs compiled.

  Attributes:
    step: the programs' memory ("prefill", then "decode"); compiling stops
      at one refused for memory.
    num_slots: sequences decoded together (the slots asked for, rounded
      up to a multiple of the mesh's data replicas).
    num_pages: the pool's pages.
    page_size: positions a page holds.
    length: positions of the longest sequence (a slot's table covers its
      length bucket).
    prefill_length: tokens of the prefill program.
    param_bytes: per device, the parameters.
    pool_bytes: per device, the page pool.
    state_bytes: per device, the slots' recurrent states (0 without
      recurrent layers).
    state_bytes_per_slot: one slot's recurrent states.
    copy: one copy of the parameters onto the mesh.
  """

  step: train_compile_lib.StepCompile
  num_slots: int
  num_pages: int
  page_size: int
  length: int
  prefill_length: int
  param_bytes: int
  pool_bytes: int
  state_bytes: int
  state_bytes_per_slot: int
  copy: WeightCopy


def generation_params(
    config: model_config.ModelConfig, setup: model_setup.ModelSetup
) -> Any:
  """The parameters' `jax.ShapeDtypeStruct`s as a generation mesh holds
  them: the leaves the model reads only in the compute dtype in it
  (`decode_weights.dtypes`), each split as the trainer splits it on the
  mesh (`setup`: `model_setup.setup_model` of the run's config on the
  generation mesh)."""
  return jax.tree_util.tree_map(
      lambda leaf, dtype, sharding: jax.ShapeDtypeStruct(
          leaf.shape, dtype, sharding=sharding
      ),
      setup.abstract_params,
      decode_weights.dtypes(setup.abstract_params, config.compute_dtype),
      setup.param_shardings,
  )


def weight_copy(
    config: model_config.ModelConfig, setup: model_setup.ModelSetup
) -> WeightCopy:
  """The bytes one copy of `config`'s parameters to `setup`'s mesh moves,
  from the parameters' shapes (`generation_params`)."""
  params = generation_params(config, setup)
  total = sum(
      x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params)
  )
  return WeightCopy(
      dtype=jnp.dtype(config.compute_dtype).name,
      total_bytes=int(total),
      device_bytes=train_compile_lib.device_bytes(params),
      devices=setup.mesh.devices.size,
  )


def compile_generation(
    config: model_config.ModelConfig,
    setup: model_setup.ModelSetup,
    *,
    num_slots: int,
    length: int,
    prompt_length: int,
    engine: paged_decoder.EngineOptions = paged_decoder.EngineOptions(),
    log: Callable[[str], None] = lambda _: None,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> GenerationCompile:
  """Compiles a rollout's prefill and decode programs on `setup.mesh`.

  Args:
    config: the model's config.
    setup: the model on the generation mesh (`model_setup.setup_model` of
      the run's config on `mesh.make_mesh`'s mesh of the devices to compile
      for: abstract TPU devices, or this host's).
    num_slots: sequences decoded together (>= 1).
    length: positions of the longest sequence: context plus completion
      (<= max_sequence_length).
    prompt_length: ids of the longest context prefilled (< length).
    engine: page size, pages (0 = the engine's default) and chunk.
    log: called with a line as each compile starts and ends.
    progress: hears a long compile's elapsed time (as
      `train_compile_lib.compile_program`'s).

  Returns:
    The programs' memory and the engine's figures; a program the compiler
    refuses for memory (RESOURCE_EXHAUSTED) ends the compile and is
    reported, not raised.

  Raises:
    ValueError: a slot count or length out of range (one line), before
      anything compiles.
  """
  params = generation_params(config, setup)
  lowered = paged_lowering.lower(
      params,
      config,
      num_slots=num_slots,
      length=length,
      prompt_length=prompt_length,
      engine=engine,
      mesh=setup.mesh,
  )
  device_bytes = train_compile_lib.device_bytes
  state_bytes = device_bytes(lowered.states)
  # Beside the prefill the slots' states and logits wait on the device; the
  # decode program takes them as arguments.
  resident = {
      "prefill": state_bytes + device_bytes(lowered.logits),
      "decode": 0,
  }
  done = []
  out_of_memory = None
  for name, program in lowered.programs.items():
    _, memory = train_compile_lib.compile_program(
        name, program, resident[name], log, progress
    )
    if isinstance(memory, train_compile_lib.OutOfMemory):
      out_of_memory = memory
      break
    done.append(memory)
  return GenerationCompile(
      step=train_compile_lib.StepCompile(tuple(done), out_of_memory),
      num_slots=lowered.num_slots,
      num_pages=lowered.num_pages,
      page_size=engine.page_size,
      length=length,
      prefill_length=lowered.prefill_length,
      param_bytes=device_bytes(params),
      pool_bytes=device_bytes(lowered.pool),
      state_bytes=state_bytes,
      state_bytes_per_slot=kv_cache.state_bytes_per_row(config),
      copy=weight_copy(config, setup),
  )
