"""The page pool's book: allocation, shared holders, release, exhaustion."""

import tracemalloc

from absl.testing import absltest

from maxtext.generation import page_pool


class PagePoolTest(absltest.TestCase):

  def test_a_shared_page_is_free_after_its_last_holder_releases_it(self):
    pool = page_pool.PagePool(4)
    pages = pool.allocate(2)
    self.assertLen(set(pages), 2)
    self.assertEqual((pool.in_use, pool.free), (2, 2))
    pool.share(pages[:1])
    self.assertEqual(pool.holders(pages[0]), 2)
    pool.release(pages)
    self.assertEqual((pool.in_use, pool.holders(pages[0])), (1, 1))
    pool.release(pages[:1])
    self.assertEqual((pool.in_use, pool.free), (0, 4))
    self.assertEqual((pool.peak_in_use, pool.allocations), (2, 2))

  def test_a_book_takes_its_stated_bytes_per_page(self):
    pages = 200_000
    tracemalloc.start()
    try:
      before = tracemalloc.get_traced_memory()[0]
      pool = page_pool.PagePool(pages)
      taken = tracemalloc.get_traced_memory()[0] - before
    finally:
      tracemalloc.stop()
    self.assertEqual(pool.free, pages)
    # The figure the decoder's memory bound uses, to within a page in ten.
    self.assertBetween(
        taken / pages,
        0.9 * page_pool.BOOK_BYTES_PER_PAGE,
        page_pool.BOOK_BYTES_PER_PAGE,
    )

  def test_freed_pages_are_handed_out_again(self):
    pool = page_pool.PagePool(2)
    first = pool.allocate(2)
    pool.release(first)
    self.assertCountEqual(pool.allocate(2), first)
    self.assertEqual(pool.peak_in_use, 2)

  def test_asking_for_more_than_is_free_raises(self):
    pool = page_pool.PagePool(3)
    pool.allocate(2)
    with self.assertRaisesRegex(
        page_pool.PoolExhaustedError, "asked for 2 pages, 1 of 3 free"
    ):
      pool.allocate(2)

  def test_releasing_or_sharing_a_free_page_raises(self):
    pool = page_pool.PagePool(2)
    (page,) = pool.allocate(1)
    pool.release([page])
    with self.assertRaisesRegex(ValueError, f"page {page} is already free"):
      pool.release([page])
    with self.assertRaisesRegex(ValueError, f"page {page} is free"):
      pool.share([page])

  def test_an_empty_pool_is_refused(self):
    with self.assertRaisesRegex(ValueError, "num_pages=0"):
      page_pool.PagePool(0)


if __name__ == "__main__":
  absltest.main()
