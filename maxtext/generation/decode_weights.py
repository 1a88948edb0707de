"""The parameters as a decoder reads them: matrices in the compute dtype.

A training run holds its parameters in `weight_dtype` (float32 by default)
and the model casts each matrix to its compute dtype (bfloat16) where it
multiplies by it. A decoder handed those parameters casts again in every
program it runs: XLA hoists the cast out of the decode loop, so a decode
call of up to `EngineOptions.chunk` steps reads every float32 matrix once
(4 bytes a parameter) and writes a bfloat16 copy (2 more) before its first
step: 6 bytes a parameter a call beside the 2 each of its steps reads.

`cast` makes that copy once, before a rollout's first call: the leaves
the model reads only in its compute dtype (`transformer.compute_dtype_mask`:
the matrices but the Gated DeltaNet's convolution kernels) cast, the rest
(norm scales, router biases, decay parameters, kernels the model applies in
float32) as they are. The model's own cast of a leaf already in the compute
dtype is no operation, so a decoder gives the same outputs from the copy as
from the parameters (`decode_weights_test`). The copy takes the place of
the one each decode program held as a temporary, with each leaf where its
source was (same sharding).
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from maxtext.model import transformer


def cast(params: Any, compute_dtype: str) -> Any:
  """`params` with the leaves the model reads only in its compute dtype
  (the config's `compute_dtype`) in that dtype (new arrays, each placed as
  its source), the others the same arrays; `params` itself when no leaf
  needs a cast."""
  dtype = jnp.dtype(compute_dtype)
  leaves, tree = jax.tree_util.tree_flatten(params)
  mask = jax.tree_util.tree_leaves(transformer.compute_dtype_mask(params))
  which = [
      i for i, leaf in enumerate(leaves) if mask[i] and leaf.dtype != dtype
  ]
  if not which:
    return params
  copies = _cast([leaves[i] for i in which], dtype)
  for i, copy in zip(which, copies):
    leaves[i] = copy
  return jax.tree_util.tree_unflatten(tree, leaves)


def dtypes(abstract_params: Any, compute_dtype: str) -> Any:
  """The dtype of each leaf of `cast`'s copy of parameters shaped as
  `abstract_params` (arrays or `jax.ShapeDtypeStruct`s)."""
  dtype = jnp.dtype(compute_dtype)
  return jax.tree_util.tree_map(
      lambda leaf, w: dtype if w else leaf.dtype,
      abstract_params,
      transformer.compute_dtype_mask(abstract_params),
  )


@functools.partial(jax.jit, static_argnums=1)
def _cast(leaves: list, dtype) -> list:
  """The leaves cast to `dtype`, in one program (elementwise: each output
  placed as its input)."""
  return [x.astype(dtype) for x in leaves]
