"""Checks a run's paths, data and MLPerf rules before any device work.

`workloads.check` calls `check(settings)` after `config_lib.validate`: a
path the run cannot create, write or read, a malformed data file, prepared
data that does not fit the model, and a config the MLPerf rules refuse
(`maxtext.mllog.mlperf_preflight`) are then refused with one line,
`config.<field>=<value>: <problem>` (a ValueError), before the distributed
runtime, the devices, the run directory or the MLPerf log are touched.

Nothing is created here. Whether a directory can be written is tried with a
temporary file in the directory (or its nearest existing ancestor, where the
run would create it), removed at once: permission bits say nothing for root,
and a read-only mount shows only when written to.

Its settings are `PreflightConfig`: the few fields of its own, and the run
directory's, the data's and the MLPerf log's settings whole, which it hands
to their packages' checks.
"""

import dataclasses
import errno
import os
import stat
import tempfile
from typing import Optional

from maxtext.core import caller_paths
from maxtext.core import checks
from maxtext.core import component_config
from maxtext.data import builtin_datasets
from maxtext.mllog import mlperf_config
from maxtext.mllog import mlperf_preflight as mllog_preflight
from maxtext.storage import gcs_mirror
from maxtext.data import chat_dataset
from maxtext.data import data_config
from maxtext.data import megatron_dataset
from maxtext.text import metadata as text_metadata
from maxtext.storage import run_dir as run_dir_lib

# Bytes the run's own files add below its run directory (and a checkpoint
# directory), e.g. "checkpoints/<step>/state/ocdbt.process_0/d/<32 hex>" or
# "tensorboard/events.out.tfevents.<time>.<host>.<pid>.0.v2".
_ROOM_INSIDE = 160
# Bytes an attempt number adds to the MLPerf log's name ("mllog.12.log").
_ATTEMPT_ROOM = 4
# When the file system does not say (POSIX minimums are lower; Linux's).
_DEFAULT_NAME_MAX = 255
_DEFAULT_PATH_MAX = 4096
_PROBE_PREFIX = ".maxtext_preflight_"


@dataclasses.dataclass(frozen=True)
class PreflightConfig(component_config.ComponentConfig):
  """What the pre-flight checks read (`maxtext/configs/base.py` documents
  each field; `config_lib.validate` checks them).

  Attributes:
    run_name: the run directory's name; "" = a default name, chosen later.
    num_processes, process_id: which process this is (only process 0 writes
      the MLPerf log).
    jax_compilation_cache_dir: JAX's persistent compilation cache; "" = none.
    run_dir: where the run writes and the paths it reads.
    data: the data set's settings (its files are checked by their readers).
    mlperf: the MLPerf log's settings (its rules: `mlperf_preflight`).
  """

  run_name: str = ""
  num_processes: int = 1
  process_id: int = -1
  jax_compilation_cache_dir: str = ""
  run_dir: run_dir_lib.RunDirConfig = dataclasses.field(
      default_factory=run_dir_lib.RunDirConfig
  )
  data: data_config.DataConfig = dataclasses.field(
      default_factory=data_config.DataConfig
  )
  mlperf: mlperf_config.MlperfConfig = dataclasses.field(
      default_factory=mlperf_config.MlperfConfig
  )


def _fail(
    field: str, value: str, path: Optional[str], problem: str
) -> ValueError:
  """`config.<field>=<value>: [<path> ]<problem>`, the path if it says more."""
  if path and path != value:
    problem = f"{path} {problem}"
  return ValueError(f"config.{field}={value!r}: {problem}")


def _limit(path: str, name: str, default: int) -> int:
  try:
    return os.pathconf(path, name)
  except (OSError, ValueError):
    return default


def _os_problem(e: OSError, directory: str) -> str:
  """A write error in `directory`, in words."""
  if e.errno == errno.EROFS:
    return f"read-only file system ({directory})"
  if e.errno in (errno.EACCES, errno.EPERM):
    return f"permission denied: cannot write in {directory}"
  if e.errno == errno.ENOSPC:
    return f"no space left on device ({directory})"
  if e.errno == errno.EDQUOT:
    return f"disk quota exceeded ({directory})"
  return f"cannot write in {directory}: {e.strerror or e}"


def _write_problem(directory: str) -> Optional[str]:
  """Why no file can be created in `directory` (an existing one), or None.

  A real file is tried rather than os.access: access() grants root
  everything, and fails on a read-only mount without saying why.
  """
  try:
    fd, probe = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=directory)
  except OSError as e:
    return _os_problem(e, directory)
  os.close(fd)
  os.unlink(probe)
  return None


def _walk(path: str) -> tuple[Optional[str], str]:
  """Follows an absolute path from the root as far as it exists.

  Returns:
    (problem or None, the deepest existing directory on the path). The
    problem is the first thing that stops `os.makedirs(path)`: a component
    that is not a directory, a name longer than the file system allows, a
    directory that cannot be searched.
  """
  nearest = os.sep
  prefix = os.sep
  for name in path.split(os.sep)[1:]:
    if not name:
      continue
    name_max = _limit(nearest, "PC_NAME_MAX", _DEFAULT_NAME_MAX)
    length = len(os.fsencode(name))
    if length > name_max:
      return (f"name too long ({length} > {name_max} characters)", nearest)
    prefix = os.path.join(prefix, name)
    try:
      mode = os.stat(prefix).st_mode
    except FileNotFoundError:
      if os.path.islink(prefix):
        if prefix == path:
          return "is a broken symbolic link", nearest
        return f"is under {prefix}, a broken symbolic link", nearest
      return None, nearest  # The rest is created by the run.
    except PermissionError:
      return f"permission denied: cannot search {nearest}", nearest
    except OSError as e:
      return f"cannot be reached: {prefix}: {e.strerror or e}", nearest
    if not stat.S_ISDIR(mode):
      if prefix == path:
        return f"is {checks.file_kind(mode)}, not a directory", nearest
      return f"is under {prefix}, which is {checks.file_kind(mode)}", nearest
    nearest = prefix
  return None, nearest


def _directory_problem(
    path: str, *, room: int = 0, write: bool = True
) -> Optional[str]:
  """Why the run cannot create (if needed) and write directory `path`.

  Args:
    path: an absolute, normalised local path.
    room: bytes the run's files add below `path`, for the path length limit.
    write: also try writing where the run would write first.

  Returns:
    The problem in words, or None.
  """
  problem, nearest = _walk(path)
  if problem:
    return problem
  path_max = _limit(nearest, "PC_PATH_MAX", _DEFAULT_PATH_MAX)
  length = len(os.fsencode(path)) + room
  if length >= path_max:
    return (
        f"path too long ({len(os.fsencode(path))} characters, and the "
        f"run's files need {room} more; the limit is {path_max})"
    )
  return _write_problem(nearest) if write else None


def _nearest_directory(path: str) -> str:
  """The deepest existing directory on `path` (an absolute path)."""
  while not os.path.isdir(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def _check_run_name(config: PreflightConfig, run_dir: str) -> None:
  """The named run directory: a name the file system takes, not a file."""
  name_max = _limit(
      _nearest_directory(os.path.dirname(run_dir)),
      "PC_NAME_MAX",
      _DEFAULT_NAME_MAX,
  )
  length = len(os.fsencode(config.run_name))
  if length > name_max:
    raise _fail(
        "run_name",
        config.run_name,
        None,
        f"name too long ({length} > {name_max} characters)",
    )
  try:
    mode = os.stat(run_dir).st_mode
  except OSError:
    if os.path.islink(run_dir):
      # The named run itself is the dangling link, not the output directory.
      raise _fail(
          "run_name",
          config.run_name,
          run_dir,
          f"is a broken symbolic link (to {os.readlink(run_dir)})",
      ) from None
    return  # Absent (the run creates it), or the directory checks say why.
  if not stat.S_ISDIR(mode):
    raise _fail(
        "run_name",
        config.run_name,
        run_dir,
        f"is {checks.file_kind(mode)}, not a run directory",
    )


def _check_output(config: PreflightConfig) -> None:
  """The run directory (where it goes, and itself when named) and the
  checkpoint directory."""
  # make_run_paths is the one place that says where a run writes; a default
  # run name (the trainer chooses one later) stands in for an unnamed run.
  name = config.run_name or run_dir_lib.default_run_name()
  paths = run_dir_lib.make_run_paths(config.run_dir, name)
  if paths.remote_url:
    field = "local_staging_directory"
    value = config.run_dir.local_staging_directory
  else:
    field = "base_output_directory"
    value = config.run_dir.base_output_directory
  parent = os.path.dirname(paths.run_dir)
  problem = _directory_problem(parent, write=False)
  if problem:
    raise _fail(field, value, parent, problem)
  if config.run_name:
    _check_run_name(config, paths.run_dir)
  problem = _directory_problem(paths.run_dir, room=_ROOM_INSIDE)
  if problem:
    raise _fail(field, value, parent, problem)
  if gcs_mirror.is_gs_url(paths.checkpoint_dir):
    return
  # The default checkpoint directory lives in the run directory (where a
  # file of that name would stop it); an explicit one is checked on its own.
  problem = _directory_problem(paths.checkpoint_dir, room=_ROOM_INSIDE)
  if problem:
    raise _fail(
        "checkpoint_directory",
        config.run_dir.checkpoint_directory,
        paths.checkpoint_dir,
        problem,
    )


def _check_load_parameters(paths: run_dir_lib.RunDirConfig) -> None:
  """Raises when a local load_parameters_path is not a readable directory."""
  value = paths.load_parameters_path
  if not value or gcs_mirror.is_gs_url(value):
    return  # gs:// is read by orbax at restore time; no access here.
  # As the restore opens it: relative to the working directory.
  path = os.path.abspath(value)
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
      raise _fail(
          "load_parameters_path", value, None, "does not exist"
      ) from None
    raise _fail(
        "load_parameters_path",
        value,
        None,
        f"cannot be read: {e.strerror or e}",
    ) from None
  if not stat.S_ISDIR(mode):
    raise _fail(
        "load_parameters_path",
        value,
        None,
        f"is {checks.file_kind(mode)}, not a checkpoint directory",
    )
  if not os.access(path, os.R_OK | os.X_OK):
    raise _fail(
        "load_parameters_path", value, None, "permission denied: cannot be read"
    )
  # A checkpoint directory holds step directories ("500"); a step directory
  # is named by its step.
  if os.path.basename(path).isdigit():
    return
  with os.scandir(path) as entries:
    steps = [e.name for e in entries if e.name.isdigit() and e.is_dir()]
  if not steps:
    raise _fail(
        "load_parameters_path",
        value,
        None,
        "holds no checkpoint: expected a checkpoint directory with "
        "step subdirectories, or one step directory",
    )


def _check_mllog(config: PreflightConfig) -> None:
  """The MLPerf log's directory, when the log is on and not in the run dir."""
  mllog_file = config.mlperf.mllog_file
  if not config.mlperf.enable_mllog or not mllog_file:
    return  # The default log is in the run directory, checked above.
  if config.num_processes > 1 and config.process_id != 0:
    return  # Only process 0 writes the log.
  path = caller_paths.resolve_local_path(mllog_file)
  directory, name = os.path.split(path)
  problem = _directory_problem(directory)
  if problem:
    raise _fail("mllog_file", mllog_file, directory, problem)
  name_max = _limit(directory, "PC_NAME_MAX", _DEFAULT_NAME_MAX)
  length = len(os.fsencode(name))
  if length + _ATTEMPT_ROOM > name_max:
    raise _fail(
        "mllog_file",
        mllog_file,
        None,
        f"name too long ({length} characters, and an attempt number "
        f"adds {_ATTEMPT_ROOM}; the limit is {name_max})",
    )


def _check_compilation_cache(value: str) -> None:
  if not value:
    return
  path = caller_paths.resolve_local_path(value)
  # Structure only: JAX reads a cache it cannot write to (and says so), so a
  # read-only cache is not a mistake.
  problem = _directory_problem(path, room=_ROOM_INSIDE, write=False)
  if problem:
    raise _fail("jax_compilation_cache_dir", value, path, problem)


def _check_prepared_data(data: data_config.DataConfig) -> None:
  """A grain run's prepared data: reads only its metadata.json. A directory
  without one, or a vocabulary larger than the model's, is refused."""
  if data.dataset_type != "grain":
    return
  text_metadata.check_config(
      data.train_data_path,
      data.eval_data_path,
      data.vocab_size,
      data.max_sequence_length,
  )


def check(config: PreflightConfig, header=None) -> None:
  """Checks every path of a validated config, creating nothing.

  Local output directories (the run directory's parent and the run
  directory, the staging directory of a gs:// run, checkpoint_directory,
  the MLPerf log's directory): every existing component is a directory,
  names and the whole path fit the file system's limits, and a file can be
  created where the run writes first (not a read-only file system). Input
  files: the tokens_file dataset's files exist, are regular, readable and
  well-formed (through `maxtext.data`, the reader the run uses); a
  megatron run's prefixes (index, .bin size, the eval set's rows) through
  `maxtext.data.megatron_dataset`; a grain run's prepared data fits the
  model (its metadata.json); a chat run's tokenizer and every line of its
  files (`text.chat_dataset.check_config`);
  load_parameters_path is a local checkpoint directory. gs:// locations are
  left to the run (their trouble is retried, never a stop). Before the
  paths: the prepared data, then the MLPerf rules
  (`maxtext.mllog.mlperf_preflight.check`: the submission fields always, the
  reference points and the header proof when enable_mllog is on).

  Args:
    config: the pre-flight's settings, from a config already validated by
      `config_lib.validate` (`PreflightConfig.from_config`).
    header: the workload's part of the MLPerf log
      (`Workload.mlperf_header`: a GRPO run's; the benchmark must be of its
      kind); None = pretraining's.

  Raises:
    ValueError: one line, `config.<field>=<value>: <problem>`, for the first
      problem found.
  """
  _check_prepared_data(config.data)
  mllog_preflight.check(config.mlperf, header)
  _check_output(config)
  _check_mllog(config)
  _check_compilation_cache(config.jax_compilation_cache_dir)
  _check_load_parameters(config.run_dir)
  builtin_datasets.check_token_files(config.data)
  chat_dataset.check_config(config.data)
  megatron_dataset.check_config(config.data)
