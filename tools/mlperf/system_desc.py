"""The system description of a submission: `<org>/systems/<system>.json`.

The MLPerf Training package checker wants 33 fields, every value a string (the
summarizer joins them into CSV rows). What this module can know it fills in:
the submitter, division and availability from the runs' logs, the node and
accelerator counts and kinds from the devices JAX reported to the runs, the
host CPU and memory from this machine, and the framework versions. The rest
(interconnects, storage, networking, cooling, ...) cannot be detected and is
left empty, listed in `MANUAL_FIELDS`, for the submitter to fill in by hand.

The log's `submission_status` ("onprem", "cloud", "research") is not the
description's `status`: the checker wants the availability strings of
`STATUS_NAMES`.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
from typing import Any, Mapping, Optional

from maxtext.runtime import device_memory

# Log status (mlperf_logging.mllog.constants) -> the system description's
# availability string that the system description checker accepts.
STATUS_NAMES = {
    "onprem": "Available on-premise",
    "cloud": "Available cloud",
    "research": "Research, Development, or Internal (RDI)",
}

# Every field of a training system description, in the checker's order.
FIELDS = (
    "submitter",
    "division",
    "status",
    "system_name",
    "number_of_nodes",
    "host_processors_per_node",
    "host_processor_model_name",
    "host_processor_core_count",
    "host_processor_vcpu_count",
    "host_processor_frequency",
    "host_processor_caches",
    "host_processor_interconnect",
    "host_memory_capacity",
    "host_storage_type",
    "host_storage_capacity",
    "host_networking",
    "host_networking_topology",
    "host_memory_configuration",
    "accelerators_per_node",
    "accelerator_model_name",
    "accelerator_host_interconnect",
    "accelerator_frequency",
    "accelerator_on-chip_memories",
    "accelerator_memory_configuration",
    "accelerator_memory_capacity",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "cooling",
    "hw_notes",
    "framework",
    "other_software_stack",
    "operating_system",
    "sw_notes",
)

# Fields nothing here can detect: the submitter fills them in by hand.
MANUAL_FIELDS = (
    "host_processor_frequency",
    "host_processor_interconnect",
    "host_storage_type",
    "host_storage_capacity",
    "host_networking",
    "host_networking_topology",
    "host_memory_configuration",
    "accelerator_host_interconnect",
    "accelerator_frequency",
    "accelerator_on-chip_memories",
    "accelerator_memory_configuration",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "cooling",
)

# Accelerator fields of a CPU-only system.
_NOT_APPLICABLE = "N/A"
_ACCELERATOR_FIELDS = tuple(f for f in FIELDS if f.startswith("accelerator_"))


def availability(log_status: str) -> str:
  """The description's `status` for a log's `submission_status`.

  Raises:
    ValueError: `log_status` is not one of `STATUS_NAMES`.
  """
  if log_status not in STATUS_NAMES:
    raise ValueError(
        f"submission_status={log_status!r}: must be one of "
        f"{sorted(STATUS_NAMES)}"
    )
  return STATUS_NAMES[log_status]


def _gib(num_bytes: int) -> str:
  return f"{num_bytes / 2**30:.1f} GiB"


def _cpuinfo(proc_root: str) -> list[dict[str, str]]:
  """/proc/cpuinfo as one dict per logical processor ([] if unreadable)."""
  try:
    with open(os.path.join(proc_root, "cpuinfo"), encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return []
  processors = []
  for block in text.split("\n\n"):
    entry = {}
    for line in block.splitlines():
      key, sep, value = line.partition(":")
      if sep:
        entry[key.strip()] = value.strip()
    if entry:
      processors.append(entry)
  return processors


def _memory_bytes(proc_root: str) -> Optional[int]:
  try:
    with open(os.path.join(proc_root, "meminfo"), encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) * 1024  # The value is in kB.
  except (OSError, ValueError, IndexError):
    pass
  return None


def _caches(sys_root: str) -> str:
  """The first CPU's caches, e.g. "L1d 48K, L1i 32K, L2 2048K, L3 105M"."""
  names = []
  pattern = os.path.join(sys_root, "devices/system/cpu/cpu0/cache/index*")
  for index in sorted(glob.glob(pattern)):
    try:
      with open(os.path.join(index, "level"), encoding="utf-8") as f:
        level = f.read().strip()
      with open(os.path.join(index, "type"), encoding="utf-8") as f:
        kind = f.read().strip()
      with open(os.path.join(index, "size"), encoding="utf-8") as f:
        size = f.read().strip()
    except OSError:
      continue
    suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
    names.append(f"L{level}{suffix} {size}")
  return ", ".join(names)


def detect_host(
    proc_root: str = "/proc", sys_root: str = "/sys"
) -> dict[str, str]:
  """The host fields this machine reports (CPU, caches, memory, OS).

  Args:
    proc_root: where /proc is (tests pass a directory of their own).
    sys_root: where /sys is.

  Returns:
    host_processors_per_node, host_processor_model_name,
    host_processor_core_count (cores per processor), host_processor_vcpu_count,
    host_processor_caches, host_memory_capacity and operating_system, each a
    string ("" where this machine does not say).
  """
  processors = _cpuinfo(proc_root)
  vcpus = len(processors) or os.cpu_count() or 0
  sockets = {p.get("physical id") for p in processors if "physical id" in p}
  model = next(
      (p["model name"] for p in processors if "model name" in p),
      platform.processor(),
  )
  cores = next((p["cpu cores"] for p in processors if "cpu cores" in p), "")
  memory = _memory_bytes(proc_root)
  return {
      "host_processors_per_node": str(len(sockets) or 1),
      "host_processor_model_name": model,
      "host_processor_core_count": cores or str(vcpus),
      "host_processor_vcpu_count": str(vcpus) if vcpus else "",
      "host_processor_caches": _caches(sys_root),
      "host_memory_capacity": _gib(memory) if memory else "",
      "operating_system": platform.platform(),
  }


def _version(distribution: str) -> str:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


def describe(
    *,
    org: str,
    system: str,
    division: str,
    log_status: str,
    provenance: Mapping[str, Any],
    host: Mapping[str, str],
    accelerator_memory_bytes: Optional[int] = None,
) -> dict[str, str]:
  """A system description from the runs' facts and this host's.

  Args:
    org: the logs' `submission_org`.
    system: the logs' `submission_platform` (the system's name).
    division: the logs' `submission_division`.
    log_status: the logs' `submission_status` (mapped by `availability`).
    provenance: one run's config.json provenance: `jax_backend`,
      `device_count`, `process_count`, `devices` (device kinds),
      `jax_version`, `git_revision`, `requirements_lock`.
    host: `detect_host()`'s fields.
    accelerator_memory_bytes: memory of one accelerator, when known.

  Returns:
    Every field of `FIELDS`, each a string; `MANUAL_FIELDS` are "" (or
    "N/A" for accelerator fields of a CPU-only system).

  Raises:
    ValueError: an unknown `log_status`, or a provenance without device
      counts.
  """
  nodes, devices = _node_and_device_counts(provenance)
  backend = str(provenance.get("jax_backend", ""))
  kinds = ", ".join(str(k) for k in provenance.get("devices") or ())
  desc = {field: "" for field in FIELDS}
  # The summarizer multiplies this one by the node count: never "".
  desc["host_processors_per_node"] = "1"
  desc.update({k: v for k, v in host.items() if k in desc and v})
  desc.update(
      {
          "submitter": org,
          "division": division,
          "status": availability(log_status),
          "system_name": system,
          "number_of_nodes": str(nodes),
          **_software_fields(provenance),
      }
  )
  desc.update(
      _accelerator_fields(
          backend, kinds, devices // max(nodes, 1), accelerator_memory_bytes
      )
  )
  return desc


def _node_and_device_counts(provenance: Mapping[str, Any]) -> tuple[int, int]:
  """The run's process and device counts from its provenance.

  Raises:
    ValueError: the provenance has no usable counts.
  """
  try:
    nodes = int(provenance["process_count"])
    devices = int(provenance["device_count"])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(
        f"run provenance has no usable process_count/"
        f"device_count: {dict(provenance)!r}"
    ) from e
  return nodes, devices


def _software_fields(provenance: Mapping[str, Any]) -> dict[str, str]:
  """The framework and software stack fields: the run's JAX and revision,
  this host's jaxlib, Python and mlperf-logging, the requirements lock."""
  return {
      "framework": f"JAX {provenance.get('jax_version', _version('jax'))}",
      "other_software_stack": (
          f"jaxlib {_version('jaxlib')}, "
          f"Python {platform.python_version()}, "
          f"mlperf-logging {_version('mlperf-logging')}, maxtext_engine "
          f"{provenance.get('git_revision', 'unknown')}"
      ),
      "sw_notes": (
          f"Dependencies pinned by "
          f"{provenance.get('requirements_lock', 'unknown')}."
      ),
  }


def _accelerator_fields(
    backend: str,
    kinds: str,
    per_node: int,
    accelerator_memory_bytes: Optional[int],
) -> dict[str, str]:
  """The accelerator fields of a run on JAX `backend` with devices of
  `kinds`, `per_node` on each node: "N/A" for a CPU-only run, else the
  devices per node, their kinds and (when known) one's memory."""
  if backend == "cpu":
    fields = {"accelerators_per_node": "0"}
    for field in _ACCELERATOR_FIELDS:
      fields[field] = _NOT_APPLICABLE
    fields["hw_notes"] = f"CPU only ({kinds or 'cpu'} devices)."
    return fields
  fields = {
      "accelerators_per_node": str(per_node),
      "accelerator_model_name": kinds,
  }
  if accelerator_memory_bytes:
    fields["accelerator_memory_capacity"] = _gib(accelerator_memory_bytes)
  return fields


def live_accelerator_memory(device_kinds) -> Optional[int]:
  """Memory of one of this process's JAX devices, if they are of those kinds.

  Args:
    device_kinds: the device kinds the runs reported.

  Returns:
    The first local device's memory limit in bytes, or None on a CPU backend,
    on devices of other kinds, or when the backend does not say.
  """
  # Only when asked: describing a system from its run logs needs no jax.
  import jax  # pylint: disable=import-outside-toplevel

  if jax.default_backend() == "cpu":
    return None
  device = jax.local_devices()[0]
  if device.device_kind not in set(device_kinds or ()):
    return None
  return device_memory.bytes_limit(device)
