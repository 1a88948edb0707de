"""Published peak memory (HBM) bandwidth of one device, by device kind.

A decode step of a large model reads every weight and every row's visible
key/value cache once and does little arithmetic on each byte: its time is
bounded below by those bytes over the device's memory bandwidth. This table
gives that bandwidth for the accelerators the project runs on, keyed by
`jax.Device.device_kind` as `throughput`'s peak FLOP/s table is, with the
figure's source beside each entry. A device kind not in the table (a CPU, an
unlisted accelerator) has no known bandwidth: callers print the bytes and
say the limit is unknown.

The module needs neither JAX nor a device.
"""

from typing import Optional

_GB = 1e9  # Vendors quote decimal gigabytes per second.

# Peak HBM bandwidth per chip, bytes/s. One JAX device is one chip on every
# kind listed (TPU v5p runs its two TensorCores as one megacore device).
_TPU_V5E = 819 * _GB
# Google Cloud TPU docs, system architecture, "TPU v5e": HBM2 bandwidth
# 819 GBps per chip.
_TPU_V5P = 2765 * _GB
# Google Cloud TPU docs, system architecture, "TPU v5p": HBM2e bandwidth
# 2,765 GBps per chip.
_TPU_V6E = 1640 * _GB
# Google Cloud TPU docs, system architecture, "TPU v6e" (Trillium): HBM
# bandwidth 1,640 GBps per chip.
_H100_SXM = 3350 * _GB
# NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth
# 3.35 TB/s.
_H100_PCIE = 2000 * _GB
# Same datasheet, H100 PCIe: 2 TB/s.
_H200 = 4800 * _GB
# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: GPU memory bandwidth
# 4.8 TB/s.

_HBM_BYTES_PER_S = {
    "TPU v5 lite": _TPU_V5E,  # What JAX reports for a v5e.
    "TPU v5e": _TPU_V5E,
    "TPU v5": _TPU_V5P,  # What JAX reports for a v5p.
    "TPU v5p": _TPU_V5P,
    "TPU v6 lite": _TPU_V6E,  # What JAX reports for a v6e.
    "TPU v6e": _TPU_V6E,
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H200": _H200,
}


def known_device_kinds() -> tuple[str, ...]:
  """The device kinds with a bandwidth in the table, sorted."""
  return tuple(sorted(_HBM_BYTES_PER_S))


def hbm_bytes_per_s(device_kind: str) -> Optional[float]:
  """Published peak HBM bandwidth of one device of `device_kind`.

  Args:
    device_kind: `jax.Device.device_kind`, e.g. "TPU v5 lite", "NVIDIA H200".

  Returns:
    Bytes per second, or None where the table has none (a CPU, an unlisted
    accelerator).

  Raises:
    TypeError: `device_kind` is not a str.
  """
  if not isinstance(device_kind, str):
    raise TypeError(f"device_kind must be a str, got {device_kind!r}")
  return _HBM_BYTES_PER_S.get(device_kind)
