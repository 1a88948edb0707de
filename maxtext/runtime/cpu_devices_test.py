"""Tests of setting the CPU backend's device count."""

from absl.testing import absltest

from maxtext.runtime import cpu_devices
from testing import runfiles


class WithDeviceCountTest(absltest.TestCase):

  def test_adds_replaces_and_removes_keeping_other_flags(self):
    self.assertEqual(
        cpu_devices.with_device_count("", 4),
        "--xla_force_host_platform_device_count=4",
    )
    flags = "--xla_dump_to=/d --xla_force_host_platform_device_count=8 --x=1"
    self.assertEqual(
        cpu_devices.with_device_count(flags, 2),
        "--xla_dump_to=/d --x=1 --xla_force_host_platform_device_count=2",
    )
    self.assertEqual(
        cpu_devices.with_device_count(flags, None), "--xla_dump_to=/d --x=1"
    )

  def test_bad_count_is_named(self):
    with self.assertRaisesRegex(ValueError, "count"):
      cpu_devices.with_device_count("", 0)
    with self.assertRaisesRegex(TypeError, "count"):
      cpu_devices.with_device_count("", True)

  def test_request_sets_the_environment(self):
    environ = {"XLA_FLAGS": "--x=1"}
    cpu_devices.request(3, environ)
    self.assertEqual(
        environ["XLA_FLAGS"], "--x=1 --xla_force_host_platform_device_count=3"
    )

  def test_a_fresh_jax_process_gets_the_devices(self):
    # The real effect: JAX, started after request(), has that many devices.
    script = (
        "from maxtext.runtime import cpu_devices; cpu_devices.request(3); "
        "import jax; print(jax.device_count())"
    )
    proc = runfiles.run_python(
        script,
        timeout_s=300,
        extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertEqual(proc.stdout.strip(), "3")


if __name__ == "__main__":
  absltest.main()
