"""Tests for device_memory."""

from absl.testing import absltest
import jax

from maxtext.runtime import device_memory


class _Device:
  """A device as JAX's backends describe one: a platform and stats."""

  def __init__(self, platform, stats):
    self.platform = platform
    self._stats = stats

  def memory_stats(self):
    if isinstance(self._stats, Exception):
      raise self._stats
    return self._stats


class DeviceMemoryTest(absltest.TestCase):

  def test_the_cpu_says_nothing(self):
    self.assertIsNone(device_memory.bytes_limit(jax.devices("cpu")[0]))

  def test_an_accelerator_reports_its_limit_or_nothing(self):
    self.assertEqual(
        device_memory.bytes_limit(_Device("tpu", {"bytes_limit": 16e9})),
        16_000_000_000,
    )
    self.assertIsNone(device_memory.bytes_limit(_Device("gpu", None)))
    self.assertIsNone(
        device_memory.bytes_limit(_Device("gpu", RuntimeError("no stats")))
    )

  def test_the_host_memory_is_what_proc_meminfo_says(self):
    with open("/proc/meminfo", encoding="ascii") as f:
      total = next(int(line.split()[1]) for line in f if "MemTotal" in line)
    self.assertEqual(device_memory.host_bytes(), total << 10)


if __name__ == "__main__":
  absltest.main()
