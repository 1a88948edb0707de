"""The model run over a key/value cache: prefill and decode steps alike.

`forward(params, tokens, positions, cache, config)` runs the transformer of
`maxtext.model.transformer` on `tokens` at their `positions`: each layer
writes the new tokens' keys and values (for MLA, the latent and rotary key;
`kv_cache`) into the cache at those positions and attends to the cache
slots at or before each token's position. A prefill is a call with whole
prompts (positions 0..T-1); a decode step is a call with one token per row
at that row's own position. The layers are the training model's own
(`transformer.gqa_projections`, `mla.queries` and `latent_keys`,
`transformer.mlp`, `moe.moe_mlp`), scanned over the stacked parameters and
cache, so the logits equal `transformer.apply` over the same ids up to
float32 summation order.

A hybrid model (`full_attention_interval`) runs as training runs it, a scan
over groups of Gated DeltaNet layers and one attention layer; each DeltaNet
layer continues its per-row `gated_deltanet.State` from the cache (the
chunked delta rule for a call of several tokens, the token-by-token one for
a decode step) and returns the state after the call's real tokens
(`lengths`), so a right-padded prefill leaves each row's state after its own
prompt.

Mixture-of-experts layers route each call's tokens as training does; with
`capacity_factor` > 0 an expert's capacity counts the call's tokens, so
drops (and logits) can differ from a whole-sequence pass. Use
capacity_factor 0 (no drops, the default) to decode.
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from maxtext.generation import kv_cache
from maxtext.model import gated_deltanet
from maxtext.model import layers
from maxtext.model import mla
from maxtext.model import model_config
from maxtext.model import moe
from maxtext.model import transformer

# (the stack's entries, a layer index, new entries [B, S, ...] by name,
# positions [B, S]) -> (the stack's entries with the layer's new entries
# written, the layer's [B, T, ...] keys/values by name that attention reads).
# The store writes into the stack's [L, ...] leaves at (layer, ...) itself:
# slicing a layer out of the stack and writing it back would copy the whole
# layer's cache twice a call, which is most of a decode step's time on a TPU.
Store = Callable[[Any, jax.Array, dict, jax.Array], tuple[Any, dict]]

# (the stack's entries after the store wrote, the layer index, queries [B,
# S, H, D]) -> [B, S, H, D]: grouped-query attention that reads the stack's
# entries itself (a paged pool read in place by a kernel) instead of the
# store's view.
Attend = Callable[[Any, jax.Array, jax.Array], jax.Array]


def dense_store(entries, index, new, positions):
  """The dense cache's store: writes `new` [B, S, ...] entries at their
  positions into row b's slots of layer `index` of the [L, B, T, ...]
  stack (positions at or past T are dropped); what attention reads is the
  layer's [B, T, ...] cache."""
  rows = jnp.arange(positions.shape[0], dtype=positions.dtype)[:, None]
  written, view = {}, {}
  for name, value in new.items():
    leaf = entries[name]
    leaf = leaf.at[index, rows, positions].set(
        value.astype(leaf.dtype), mode="drop"
    )
    written[name] = leaf
    view[name] = leaf[index]
  return written, view


def _attention(
    x,
    layer,
    entries,
    index,
    positions,
    config: model_config.ModelConfig,
    store,
    attend,
):
  """Layer `index`'s attention over the stack's cache; returns (out,
  entries)."""
  if config.attention_type == "mla":
    q = mla.queries(x, layer, config, positions)
    latent, k_rope = mla.latent_keys(x, layer, config, positions)
    entries, view = store(
        entries, index, {"kv_latent": latent, "k_rope": k_rope}, positions
    )
    k, v = mla.expand_keys_values(
        view["kv_latent"], view["k_rope"], layer, config
    )
  else:
    q, k, v = transformer.gqa_projections(x, layer, config, positions)
    entries, view = store(entries, index, {"k": k, "v": v}, positions)
    if attend is not None:
      out = attend(entries, index, q)
      return _project(out, x, layer), entries
    k, v = view["k"], view["v"]
  out = layers.attend_cached(q, k, v, positions, layers.rope_scaling(config))
  return _project(out, x, layer), entries


def _project(out, x, layer):
  """The attention output [B, S, H, D] gated and projected to [B, S, E]."""
  out = transformer.output_gate(out, x, layer)
  return jnp.einsum("bshd,hde->bse", out, layer["wo"].astype(x.dtype))


def _unstacked(tree: Any) -> Any:
  """Leaves [groups, n, ...] viewed as [groups * n, ...]."""
  return jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), tree)


def forward(
    params: Any,
    tokens: jax.Array,
    positions: jax.Array,
    cache: kv_cache.Cache,
    config: model_config.ModelConfig,
    store: Optional[Store] = None,
    lengths: Optional[jax.Array] = None,
    attend: Optional[Attend] = None,
) -> tuple[jax.Array, kv_cache.Cache]:
  """Runs the blocks over `tokens`, reading and extending `cache`.

  Args:
    params: the parameter pytree (`transformer.init_params`).
    tokens: int32 [B, S] ids.
    positions: int32 [B, S] their positions, each < the cache length; a
      row's earlier positions must already be in the cache (or in `tokens`).
    cache: `kv_cache.init(config, B, T)` or a cache a call returned.
    config: the model's config.
    store: how a layer writes its new entries and what it attends to
      (`dense_store`, the default: slot j of row b is position j of row b;
      `maxtext.generation.paged_model` passes a page table's).
    lengths: int32 [B]: row b's first lengths[b] tokens are real, the rest
      padding, for the Gated DeltaNet states (`gated_deltanet.apply`); the
      attention entries follow `store`. None: every token is real.
    attend: grouped-query attention that reads the entries itself
      (`paged_model.ragged_attend`); None: `layers.attend_cached` over the
      store's view.

  Returns:
    (hidden, cache): hidden [B, S, E] final-normed hidden states in the
    compute dtype (`logits` turns them into logits); the cache with these
    tokens' entries written.
  """
  cdt = jnp.dtype(config.compute_dtype)
  x = jnp.take(params["embedding"], tokens, axis=0).astype(cdt)
  blocks = _Blocks(
      config, tokens, positions, store or dense_store, attend, lengths
  )
  new_cache = {}
  if "layers" in params:
    x, new_cache["layers"], _ = blocks.attention_stack(
        x, params["layers"], cache["layers"]
    )
  if "linear_layers" in params:
    x, new_cache["moe_layers"], states = blocks.attention_stack(
        x,
        params["moe_layers"],
        cache["moe_layers"],
        before=transformer.grouped_linear_layers(params, config),
        # The states grouped as the parameters are.
        states=transformer.grouped_linear_layers(cache, config),
    )
    new_cache["linear_layers"] = _unstacked(states)
  elif "moe_layers" in params:
    x, new_cache["moe_layers"], _ = blocks.attention_stack(
        x, params["moe_layers"], cache["moe_layers"]
    )
  return transformer.norm(x, params["final_norm"], config), new_cache


class _Blocks:
  """The layers of one `forward` call, over its positions and store."""

  def __init__(
      self,
      config: model_config.ModelConfig,
      tokens: jax.Array,
      positions: jax.Array,
      store: Store,
      attend: Optional[Attend],
      lengths: Optional[jax.Array],
  ):
    """Args: as `forward`'s (`store` not None)."""
    self._config = config
    # One token a row: a decode step, which the DeltaNet layers take
    # recurrently.
    self._recurrent = tokens.shape[1] == 1
    self._positions = positions
    self._store = store
    self._attend = attend
    self._lengths = lengths

  def ffn(self, x, layer):
    """The residual feed-forward half of a layer (a MoE one with a router)."""
    normed = transformer.norm(x, layer["mlp_norm"], self._config)
    if "router" in layer:
      return x + moe.moe_mlp(normed, layer, self._config)[0]
    return x + transformer.mlp(normed, layer)

  def block(self, x, layer, entries, index):
    """An attention layer: attention over its cache entries, then `ffn`."""
    out, entries = _attention(
        transformer.norm(x, layer["attn_norm"], self._config),
        layer,
        entries,
        index,
        self._positions,
        self._config,
        self._store,
        self._attend,
    )
    return self.ffn(x + out, layer), entries

  def linear_block(self, x, inputs):
    """A Gated DeltaNet layer with its recurrent state, then `ffn`."""
    layer, state = inputs
    out, state = gated_deltanet.apply(
        transformer.norm(x, layer["attn_norm"], self._config),
        layer,
        self._config,
        state,
        recurrent=self._recurrent,
        lengths=self._lengths,
    )
    return self.ffn(x + out, layer), state

  def attention_stack(self, x, stack, entries, before=None, states=None):
    """`block` over a stack's layers (after `before`, a group's DeltaNet
    layers, with `states`, if given). The stack's entries are the scan's
    carry, which the store updates in place at each layer's index: entries
    as the scan's input and output would be a second buffer of the whole
    cache."""

    def step(carry, inputs):
      x, entries = carry
      layer, index, linear, state = inputs
      if before is not None:
        x, state = jax.lax.scan(self.linear_block, x, (linear, state))
      x, entries = self.block(x, layer, entries, index)
      return (x, entries), state

    count = jax.tree_util.tree_leaves(entries)[0].shape[0]
    (x, entries), states = jax.lax.scan(
        step,
        (x, entries),
        (stack, jnp.arange(count, dtype=jnp.int32), before, states),
    )
    return x, entries, states


def logits(params: Any, hidden: jax.Array) -> jax.Array:
  """float32 [B, S, V] logits of `forward`'s hidden states."""
  return transformer.unembed(hidden, transformer.output_projection(params))
