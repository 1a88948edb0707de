"""A Hugging Face model's tokenizer files, carried through import and export.

`FILES` are the files beside a model's weights that its tokenizer and
generation read: what `save_pretrained` of transformers 5 writes
(tokenizer.json, tokenizer_config.json, chat_template.jinja, and the
model's generation_config.json) and what published models also carry
(special_tokens_map.json, written by older transformers; a sentencepiece
tokenizer.model).

The import copies those present in the Hugging Face directory next to the
checkpoint (`present`, `copy`). The export (`for_export`) writes the run's
tokenizer: the files of the imported checkpoint the run started from
(`load_parameters_path`) or that it is (a run directory written by the
import), and the tokenizer of the run's prepared data, which is what the
model trained on. When both exist and their tokenizers differ, the data's
is written and the imported tokenizer files are not; a note says so. Every
decision is a line for the user: nothing is dropped or overwritten
silently.
"""

from collections.abc import Mapping
import dataclasses
import os
import shutil
from typing import Optional

from maxtext.text import tokenizer as tokenizer_lib

FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "generation_config.json",
)
# The files that define the tokenizer itself (the rest configure it).
_DEFINING = ("tokenizer.json", "tokenizer.model")
_MODEL_FILES = ("generation_config.json",)


def present(directory: str) -> list[str]:
  """The names of FILES that `directory` holds, in FILES' order."""
  return [n for n in FILES if os.path.isfile(os.path.join(directory, n))]


def copy(files: Mapping[str, str], output_dir: str) -> list[str]:
  """Copies `files` (name in output_dir -> source path) into `output_dir`.

  Returns:
    The names copied, in order.

  Raises:
    ValueError: a file of that name is already in `output_dir` (one line).
  """
  for name in files:
    target = os.path.join(output_dir, name)
    if os.path.exists(target):
      raise ValueError(f"{target}: exists; tokenizer files never overwrite")
  for name, source in files.items():
    shutil.copyfile(source, os.path.join(output_dir, name))
  return list(files)


@dataclasses.dataclass(frozen=True)
class Selection:
  """What an export writes: `files` (name -> source path) and `notes`
  (one line each: where the files came from, what was left out and why)."""

  files: dict[str, str]
  notes: list[str]


def _imported_dir(run_dir: str, load_parameters_path: str) -> Optional[str]:
  """The imported checkpoint directory holding tokenizer files: the run
  directory itself, or the one `load_parameters_path` names (or the
  directory above it, when it names a step)."""
  candidates = [run_dir]
  if load_parameters_path:
    path = os.path.abspath(load_parameters_path.rstrip("/"))
    candidates.append(path)
    if os.path.basename(path).isdigit():
      candidates.append(os.path.dirname(path))
  for directory in candidates:
    if os.path.isdir(directory) and present(directory):
      return directory
  return None


def _same_file(a: str, b: str) -> bool:
  return tokenizer_lib.file_sha256(a) == tokenizer_lib.file_sha256(b)


def for_export(
    run_dir: str,
    load_parameters_path: str,
    data_tokenizer: Optional[str],
) -> Selection:
  """The tokenizer files an export of the run writes.

  Args:
    run_dir: the run directory (an imported checkpoint directory is one).
    load_parameters_path: the run's `load_parameters_path` ("" if none).
    data_tokenizer: the tokenizer file of the run's prepared data (a
      tokenizer.json or a sentencepiece model), or None.

  Returns:
    The Selection.
  """
  imported = _imported_dir(run_dir, load_parameters_path)
  files, notes = {}, []
  if imported:
    files = {n: os.path.join(imported, n) for n in present(imported)}
  if data_tokenizer:
    name = (
        "tokenizer.model"
        if tokenizer_lib.kind_of(data_tokenizer) == tokenizer_lib.SENTENCEPIECE
        else "tokenizer.json"
    )
    # The imported tokenizer is another one: another kind, or other bytes.
    clash = any(
        n in files and (n != name or not _same_file(files[n], data_tokenizer))
        for n in _DEFINING
    )
    if clash:
      dropped = [n for n in files if n not in _MODEL_FILES]
      notes.append(
          f"warning: not writing {', '.join(dropped)} of {imported}: the "
          f"run trained on another tokenizer, {data_tokenizer}, written as "
          f"{name}"
      )
      files = {n: p for n, p in files.items() if n in _MODEL_FILES}
    files[name] = data_tokenizer
  if not files:
    notes.append(
        "no tokenizer files: the run neither started from an imported "
        "checkpoint holding them nor trained on prepared text"
    )
  return Selection(files, notes)
