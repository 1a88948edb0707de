"""Tests of the system description, judged by the official checker."""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

from tools.mlperf import system_desc

_CPU_RUN = {
    "jax_backend": "cpu",
    "device_count": 1,
    "process_count": 1,
    "devices": ["cpu"],
    "jax_version": "0.10.2",
    "git_revision": "abc123",
    "requirements_lock": "lock:sha256:00",
}
_GPU_RUN = dict(
    _CPU_RUN,
    jax_backend="gpu",
    device_count=16,
    process_count=2,
    devices=["NVIDIA H200"],
)

_CPUINFO = """processor\t: 0
model name\t: Test CPU 9000
physical id\t: 0
cpu cores\t: 2

processor\t: 1
model name\t: Test CPU 9000
physical id\t: 0
cpu cores\t: 2

processor\t: 2
model name\t: Test CPU 9000
physical id\t: 1
cpu cores\t: 2
"""


def _describe(**overrides):
  """`system_desc.describe` of an open-division on-premise CPU run on this
  host, with `overrides`."""
  arguments = dict(
      org="acme",
      system="box",
      division="open",
      log_status="onprem",
      provenance=_CPU_RUN,
      host=system_desc.detect_host(),
  )
  arguments.update(overrides)
  return system_desc.describe(**arguments)


def check_with_official_checker(path, ruleset="6.1.0"):
  """(passed, output) of mlperf_logging.system_desc_checker on `path`."""
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "mlperf_logging.system_desc_checker",
          path,
          "training",
          ruleset,
          "--log_output",
          os.path.join(os.path.dirname(path), "checker.log"),
      ],
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  output = proc.stdout + proc.stderr
  return "System description checker passed" in output, output


class SystemDescTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def write(self, desc, name="box.json"):
    path = os.path.join(self.tmp, name)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(desc, f)
    return path

  @parameterized.named_parameters(
      ("onprem", "onprem", "Available on-premise"),
      ("cloud", "cloud", "Available cloud"),
      ("research", "research", "Research, Development, or Internal (RDI)"),
  )
  def test_description_passes_the_official_checker(self, log_status, status):
    desc = _describe(log_status=log_status)
    self.assertEqual(len(desc), 33)
    self.assertEqual(tuple(desc), system_desc.FIELDS)
    self.assertTrue(all(isinstance(v, str) for v in desc.values()), desc)
    self.assertEqual(desc["status"], status)
    passed, output = check_with_official_checker(self.write(desc))
    self.assertTrue(passed, output)

  def test_checker_fails_a_description_missing_a_field(self):
    # The check above can fail: the official checker counts the fields.
    desc = _describe()
    del desc["cooling"]
    passed, output = check_with_official_checker(self.write(desc))
    self.assertFalse(passed, output)
    self.assertIn("Missing field cooling", output)

  def test_checker_fails_the_logs_status_string(self):
    desc = _describe()
    desc["status"] = "onprem"
    passed, output = check_with_official_checker(self.write(desc))
    self.assertFalse(passed, output)

  def test_fields_from_the_runs(self):
    desc = _describe(
        division="closed",
        log_status="cloud",
        provenance=_GPU_RUN,
        host={},
        accelerator_memory_bytes=141 * 2**30,
    )
    self.assertEqual(desc["submitter"], "acme")
    self.assertEqual(desc["system_name"], "box")
    self.assertEqual(desc["division"], "closed")
    self.assertEqual(desc["number_of_nodes"], "2")
    self.assertEqual(desc["accelerators_per_node"], "8")
    self.assertEqual(desc["accelerator_model_name"], "NVIDIA H200")
    self.assertEqual(desc["accelerator_memory_capacity"], "141.0 GiB")
    self.assertEqual(desc["framework"], "JAX 0.10.2")
    self.assertIn("abc123", desc["other_software_stack"])
    self.assertIn("lock:sha256:00", desc["sw_notes"])
    for field in system_desc.MANUAL_FIELDS:
      self.assertEqual(desc[field], "", field)

  def test_cpu_system_has_no_accelerators(self):
    desc = _describe(host={})
    self.assertEqual(desc["accelerators_per_node"], "0")
    self.assertEqual(desc["accelerator_model_name"], "N/A")
    # The summarizer reads it as an int.
    self.assertEqual(desc["host_processors_per_node"], "1")

  def test_unknown_status(self):
    with self.assertRaisesRegex(ValueError, "submission_status='preview'"):
      _describe(org="a", system="b", log_status="preview", host={})

  def test_provenance_without_device_counts(self):
    with self.assertRaisesRegex(ValueError, "process_count"):
      _describe(org="a", system="b", provenance={}, host={})

  def test_detect_host_reads_cpuinfo_meminfo_and_caches(self):
    proc = os.path.join(self.tmp, "proc")
    cache = os.path.join(self.tmp, "sys/devices/system/cpu/cpu0/cache")
    os.makedirs(proc)
    for index, (level, kind, size) in enumerate(
        [
            ("1", "Data", "48K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "2048K"),
        ]
    ):
      directory = os.path.join(cache, f"index{index}")
      os.makedirs(directory)
      for name, value in (("level", level), ("type", kind), ("size", size)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
          f.write(value + "\n")
    with open(os.path.join(proc, "cpuinfo"), "w", encoding="utf-8") as f:
      f.write(_CPUINFO)
    with open(os.path.join(proc, "meminfo"), "w", encoding="utf-8") as f:
      f.write("MemTotal:       16777216 kB\nMemFree: 1 kB\n")
    host = system_desc.detect_host(proc, os.path.join(self.tmp, "sys"))
    self.assertEqual(host["host_processor_model_name"], "Test CPU 9000")
    self.assertEqual(host["host_processors_per_node"], "2")
    self.assertEqual(host["host_processor_core_count"], "2")
    self.assertEqual(host["host_processor_vcpu_count"], "3")
    self.assertEqual(host["host_memory_capacity"], "16.0 GiB")
    self.assertEqual(
        host["host_processor_caches"], "L1d 48K, L1i 32K, L2 2048K"
    )


if __name__ == "__main__":
  absltest.main()
