"""The paged decoder's least pool and book, and the settings refused."""

import re

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.generation import kv_cache
from maxtext.generation import page_pool
from maxtext.grpo.rollout import decode_footprint
from maxtext.grpo.rollout import rollout_config
from testing import tiny_configs

# A page's bytes in the host's book: the pool's entries and the sequence's.
_HELD = page_pool.BOOK_BYTES_PER_PAGE + 8


def _config(**overrides):
  """The tiny GRPO run: 16 positions, completions of 4 new tokens."""
  config = tiny_configs.tiny_config(
      absltest.get_default_test_tmpdir(), **tiny_configs.TINY_GRPO
  )
  for key, value in overrides.items():
    config[key] = value
  config_lib.validate(config)
  config_lib.validate_grpo(config)
  return config


def _settings(config) -> rollout_config.RolloutConfig:
  """The generation settings of `config` as it is now."""
  return rollout_config.RolloutConfig.from_config(config)


def _most(message: str) -> int:
  return int(re.search(r"at most (\d+) slots fit", message).group(1))


class DecodeFootprintTest(absltest.TestCase):

  def test_least_is_one_replicas_pool_and_book(self):
    config = _config(grpo_decode_page_size=4)
    # One key and one value head of 16 float32 entries, one layer.
    per_token = kv_cache.bytes_per_token(config)
    self.assertEqual(per_token, 2 * 16 * 4)
    rows = config_lib.decoded_rows(config)
    least = decode_footprint.least(_settings(config), 0, 4)
    # A context of one id and 4 new tokens: the 16-position bucket, 4 pages.
    self.assertEqual((least.slots, least.width), (rows, 4))
    self.assertEqual(least.pages, (rows + 1) * 4)
    self.assertEqual(least.pool_bytes, least.pages * 4 * per_token)
    self.assertEqual(least.book_bytes, least.pages * _HELD + rows * 4 * 4)
    # A text task's first turn may ask for fewer new tokens.
    config.grpo_max_turn_tokens = 2
    self.assertEqual(decode_footprint.fewest_new_tokens(_settings(config)), 2)

  def test_a_pool_over_the_devices_names_the_most_slots_that_fit(self):
    config = _config(grpo_decode_page_size=4, grpo_decode_slots=8)
    table = decode_footprint.least(_settings(config), 1, 4).pool_bytes // 2
    # Two devices of 3 tables each: 6 tables, 5 slots and the spare one.
    limit = 3 * table
    with self.assertRaises(ValueError) as caught:
      decode_footprint.check(
          _settings(config), devices=2, device_bytes=limit, host_bytes=None
      )
    message = str(caught.exception)
    self.assertRegex(
        message,
        r"^config.grpo_decode_slots=8: the paged decoder's page pool for 8 "
        r"slots of 4 pages of 4 positions takes at least .* GiB on each of 2 "
        r"device\(s\), more than one's .* GiB: at most 5 slots fit",
    )
    config.grpo_decode_slots = _most(message)
    decode_footprint.check(
        _settings(config), devices=2, device_bytes=limit, host_bytes=None
    )
    config.grpo_decode_slots += 1
    with self.assertRaisesRegex(ValueError, "at most 5 slots fit"):
      decode_footprint.check(
          _settings(config), devices=2, device_bytes=limit, host_bytes=None
      )
    # Less than one slot's pages: none fits.
    with self.assertRaisesRegex(ValueError, "not one slot fits"):
      decode_footprint.check(
          _settings(config), devices=1, device_bytes=table, host_bytes=None
      )

  def test_on_the_cpu_the_pool_lies_in_each_process_host(self):
    config = _config(grpo_decode_page_size=4, grpo_decode_slots=8)
    pool = decode_footprint.least(_settings(config), 8, 4).pool_bytes
    host = pool // 2 + 1  # Room for the book, not for the whole pool.

    def check(processes):
      decode_footprint.check(
          _settings(config),
          devices=64,
          device_bytes=None,
          host_bytes=host,
          pool_on_host=True,
          processes=processes,
      )

    with self.assertRaisesRegex(ValueError, r"each of 1 host\(s\)"):
      check(1)
    check(2)  # Each process holds half the pool.

  def test_a_book_over_the_host_names_a_larger_page_or_fewer_slots(self):
    config = _config(grpo_decode_page_size=1, grpo_decode_slots=8)
    # 9 tables of 16, 8 and 4 pages for pages of 1, 2 and 4 positions.
    books = {
        size: 9 * (16 // size) * _HELD + 8 * (16 // size) * 4
        for size in (1, 2, 4)
    }
    for size, book in books.items():
      self.assertEqual(
          decode_footprint.least(_settings(config), 8, size).book_bytes, book
      )
    host = books[2]
    with self.assertRaisesRegex(
        ValueError,
        r"^config.grpo_decode_page_size=1: the paged decoder's page book of "
        r"144 pages \(8 slots of 16 pages\) takes at least .* more than the "
        r"host's .* GiB: pages of 2 positions or more fit$",
    ):
      decode_footprint.check(
          _settings(config), devices=1, device_bytes=None, host_bytes=host
      )
    config.grpo_decode_page_size = 2
    decode_footprint.check(
        _settings(config), devices=1, device_bytes=None, host_bytes=host
    )
    # Too small for the largest page (16 positions, one page a table).
    host = 9 * _HELD + 8 * 4 - 1
    with self.assertRaises(ValueError) as caught:
      decode_footprint.check(
          _settings(config), devices=1, device_bytes=None, host_bytes=host
      )
    message = str(caught.exception)
    self.assertRegex(message, r"^config.grpo_decode_slots=8: .* positions$")
    config.grpo_decode_page_size = 16
    config.grpo_decode_slots = _most(message)
    self.assertEqual(config.grpo_decode_slots, 7)
    decode_footprint.check(
        _settings(config), devices=1, device_bytes=None, host_bytes=host
    )

  def test_the_static_decoder_is_not_checked(self):
    config = _config(grpo_decoder="static", grpo_decode_slots=8)
    decode_footprint.check(
        _settings(config), devices=1, device_bytes=1, host_bytes=1
    )


if __name__ == "__main__":
  absltest.main()
