"""A Hugging Face model directory: config.json and its safetensors shards.

`HfDirectory(path)` reads `config.json`, then either
`model.safetensors.index.json` (its "weight_map": tensor name -> shard
file) or every `*.safetensors` file of the directory, and every shard's
header. Nothing else is read until `array(name)` maps one tensor. Every
problem is a `FormatError` of one line naming the file (and the tensor).
"""

import glob
import json
import os

import numpy as np

from maxtext.hf import safetensors_io

FormatError = safetensors_io.FormatError
INDEX_FILE = "model.safetensors.index.json"


def _read_index(index_path: str) -> dict[str, str]:
  """The index's weight_map (tensor -> shard file), checked.

  A shard's name is a relative path that stays inside the model directory
  (it may be a symbolic link, as in the Hugging Face cache, whose shards
  link to its blobs): an absolute path or one through `..` is refused, so
  an index never makes the import read a file outside the directory.
  """
  try:
    with open(index_path, encoding="utf-8") as f:
      index = json.load(f)
  except ValueError as e:
    raise FormatError(f"{index_path}: not JSON: {e}") from None
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict):
    raise FormatError(f"{index_path}: no weight_map object")
  for tensor, name in weight_map.items():
    if not isinstance(name, str) or not name:
      raise FormatError(
          f"{index_path}: tensor {tensor}: shard {name!r} is not a file name"
      )
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts:
      raise FormatError(
          f"{index_path}: tensor {tensor}: shard {name!r} is outside the "
          "model directory (only names inside it are read)"
      )
  return weight_map


class HfDirectory:
  """config.json and the tensors of a Hugging Face model directory."""

  def __init__(self, path: str):
    self.path = path
    if not os.path.isdir(path):
      raise FormatError(f"{path}: not a directory")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
      raise FormatError(f"{config_path}: missing (not a Hugging Face model?)")
    try:
      with open(config_path, encoding="utf-8") as f:
        self.config = json.load(f)
    except ValueError as e:
      raise FormatError(f"{config_path}: not JSON: {e}") from None
    if not isinstance(self.config, dict):
      raise FormatError(
          f"{config_path}: a JSON {type(self.config).__name__}, not an object"
      )
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
      weight_map = _read_index(index_path)
      files = sorted(set(weight_map.values()))
    else:
      weight_map = None
      files = sorted(
          os.path.basename(p)
          for p in glob.glob(os.path.join(path, "*.safetensors"))
      )
      if not files:
        raise FormatError(f"{path}: no *.safetensors files")
    shards = {}
    for name in files:
      shard = os.path.join(path, name)
      if not os.path.isfile(shard):
        raise FormatError(f"{shard}: missing (named by {INDEX_FILE})")
      shards[name] = safetensors_io.SafetensorsFile(shard)
    self._where = {}
    for name, shard in shards.items():
      for tensor in shard.names():
        self._where[tensor] = shard
    if weight_map is not None:
      for tensor, name in sorted(weight_map.items()):
        if tensor not in shards[name].names():
          raise FormatError(
              f"{shards[name].path}: tensor {tensor} missing (the index "
              "places it in this file)"
          )
        self._where[tensor] = shards[name]

  def names(self) -> list[str]:
    """Every tensor's name, sorted."""
    return sorted(self._where)

  def has(self, name: str) -> bool:
    return name in self._where

  def shape(self, name: str) -> tuple[int, ...]:
    return self._where[name].shape(name)

  def dtype(self, name: str) -> np.dtype:
    return self._where[name].dtype(name)

  def array(self, name: str) -> np.ndarray:
    """Tensor `name`, memory-mapped (read from disk as it is used)."""
    return self._where[name].array(name)

  def file_of(self, name: str) -> str:
    return self._where[name].path
