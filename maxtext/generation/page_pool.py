"""The pages of a paged key/value cache: which are free, who holds each.

A paged cache keeps every sequence's keys and values in fixed-size pages of
one pool (`paged_model.init_pool`); a sequence's page table lists its pages
in position order, so position p lies in page table[p // page_size] at
offset p % page_size. `PagePool` is the host's book of that pool: it hands
out free page ids, counts the holders of each page (a prompt's pages are
held by the prompt and by each completion continuing it) and takes a page
back when its last holder releases it. It also keeps the figures a run
reports: pages in use now, the most ever in use, pages handed out.

Only ids live here; the pages' contents are device arrays the engine owns.
"""

from typing import Sequence

# Host bytes a `PagePool` holds per page: a free list entry (8 bytes) and
# the int object it names (28 bytes, 32 as allocated), and a holder count
# entry (8; counts share the small ints' objects).
BOOK_BYTES_PER_PAGE = 48


class PoolExhaustedError(RuntimeError):
  """More pages were asked for than the pool has free."""


class PagePool:
  """Reference-counted page ids 0..num_pages-1.

  Args:
    num_pages: the pool's pages (>= 1).
  """

  def __init__(self, num_pages: int):
    if num_pages < 1:
      raise ValueError(f"num_pages={num_pages}: the pool needs a page")
    self.num_pages = num_pages
    # Lowest ids first: a small run touches the start of the pool.
    self._free = list(range(num_pages - 1, -1, -1))
    self._holders = [0] * num_pages
    self.peak_in_use = 0
    self.allocations = 0

  @property
  def free(self) -> int:
    """Pages nobody holds."""
    return len(self._free)

  @property
  def in_use(self) -> int:
    """Pages somebody holds."""
    return self.num_pages - len(self._free)

  def holders(self, page: int) -> int:
    """How many holders `page` has (0 = free)."""
    return self._holders[page]

  def allocate(self, count: int) -> list[int]:
    """`count` free pages, each now with one holder.

    Raises:
      PoolExhaustedError: fewer than `count` pages are free.
    """
    if count > len(self._free):
      raise PoolExhaustedError(
          f"asked for {count} pages, {len(self._free)} of {self.num_pages} "
          "free"
      )
    pages = [self._free.pop() for _ in range(count)]
    for page in pages:
      self._holders[page] = 1
    self.allocations += count
    self.peak_in_use = max(self.peak_in_use, self.in_use)
    return pages

  def share(self, pages: Sequence[int]) -> None:
    """Adds a holder to each of `pages` (each must be held already)."""
    for page in pages:
      if self._holders[page] < 1:
        raise ValueError(f"page {page} is free: nothing to share")
      self._holders[page] += 1

  def release(self, pages: Sequence[int]) -> None:
    """Drops one holder of each of `pages`; a page left with none is free."""
    for page in pages:
      if self._holders[page] < 1:
        raise ValueError(f"page {page} is already free")
      self._holders[page] -= 1
      if not self._holders[page]:
        self._free.append(page)
