"""The bandwidth table: the device kinds JAX reports find their figures."""

from absl.testing import absltest

from maxtext.metrics import hbm_bandwidth
from maxtext.metrics import throughput


class HbmBandwidthTest(absltest.TestCase):

  def test_the_kinds_jax_reports_find_the_published_figures(self):
    # (device_kind as JAX reports it, GB/s as the vendor publishes it).
    for kind, gb_per_s in (
        ("TPU v5 lite", 819),  # v5e
        ("TPU v5", 2765),  # v5p
        ("TPU v6 lite", 1640),  # v6e
        ("NVIDIA H100 80GB HBM3", 3350),  # H100 SXM
        ("NVIDIA H200", 4800),
    ):
      self.assertEqual(
          hbm_bandwidth.hbm_bytes_per_s(kind), gb_per_s * 10**9, kind
      )

  def test_a_cpu_or_an_unlisted_kind_has_no_figure(self):
    for kind in ("cpu", "TPU v4", "TPU v5 Lite", ""):
      self.assertIsNone(hbm_bandwidth.hbm_bytes_per_s(kind), kind)

  def test_every_kind_with_a_bandwidth_has_a_peak_flops_figure(self):
    # Both tables key on the same strings: a kind spelled differently in
    # one would silently lose its figure there.
    for kind in hbm_bandwidth.known_device_kinds():
      self.assertIsNotNone(throughput.peak_flops_per_device(kind), kind)

  def test_a_kind_that_is_not_a_str_is_a_type_error(self):
    with self.assertRaisesRegex(TypeError, "device_kind"):
      hbm_bandwidth.hbm_bytes_per_s(5)


if __name__ == "__main__":
  absltest.main()
