r"""Benchmark: what checkpoint checksums cost at save and at restore.

Runbook:

  tools/bazel run //tools/benchmarks:checksum_bench
  tools/bazel run //tools/benchmarks:checksum_bench -- --mib=1024 --dir=/data

Saves a train state of `--mib` MiB of random float32 (incompressible, as
trained weights nearly are: orbax's zstd saves little) with
`maxtext.storage.checkpointing.Checkpointer` into `--dir` (a temp dir by
default), then times, each `--repeats` times, best of:

  crc32c      `checksums.file_crc32c` over every file of the step (the
              pure checksum cost, page cache warm);
  write       `checksums.write` (what the save adds: every file read and
              checksummed once, checksums.json written and synced);
  verify      `checksums.verify` of the state and metadata items (what
              every restore adds before orbax reads);
  save        a whole save (`save` + `wait`: orbax's write and the
              checksums) of a new step;
  restore     `restore_newest` (verification and orbax's read).

The last line is:

  checksum_bench: bytes=B crc32c_gbps=G write_s=W verify_s=V save_s=S
      restore_s=R verify_share=V/R
"""

import os
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

from maxtext.storage import checkpointing
from maxtext.storage import checksums

_MIB = flags.DEFINE_integer("mib", 256, "Size of the state's arrays, MiB.")
_DIR = flags.DEFINE_string("dir", None, "Where to write (default: temp).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timings per figure (best).")


def _best(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    began = time.perf_counter()
    fn()
    times.append(time.perf_counter() - began)
  return min(times)


def _state(mib: int, seed: int):
  rng = np.random.default_rng(seed)
  # Four arrays, as params and optimizer moments are several.
  per = mib * 2**20 // 4 // 4
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return {
      "params": {
          f"w{i}": jax.device_put(
              rng.standard_normal(per, dtype=np.float32), sharding
          )
          for i in range(4)
      }
  }


def main(argv):
  del argv
  directory = os.path.join(
      _DIR.value or tempfile.mkdtemp(prefix="checksum_bench_"), "checkpoints"
  )
  repeats = _REPEATS.value
  state = _state(_MIB.value, 0)
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state,
  )
  with checkpointing.Checkpointer(
      directory, save_period=1, max_to_keep=0
  ) as ckpt:
    ckpt.save(0, state, {})
    ckpt.wait()
    step = os.path.join(directory, "0")
    items = (checkpointing.STATE_ITEM, checkpointing.METADATA_ITEM)
    files = [
        os.path.join(root, name)
        for item in items
        for root, _, names in os.walk(os.path.join(step, item))
        for name in names
    ]
    size = sum(os.path.getsize(f) for f in files)
    crc_s = _best(lambda: [checksums.file_crc32c(f) for f in files], repeats)
    write_s = _best(lambda: checksums.write(step, items), repeats)
    verify_s = _best(lambda: checksums.verify(step, items, "bench"), repeats)
    steps = iter(range(1, repeats + 1))

    def save():
      ckpt.save(next(steps), state, {})
      ckpt.wait()

    save_s = _best(save, repeats)
    restore_s = _best(lambda: ckpt.restore_newest(abstract), repeats)
  print(
      f"checksum_bench: bytes={size} crc32c_gbps={size / crc_s / 1e9:.2f} "
      f"write_s={write_s:.3f} verify_s={verify_s:.3f} save_s={save_s:.3f} "
      f"restore_s={restore_s:.3f} verify_share={verify_s / restore_s:.2f}"
  )


if __name__ == "__main__":
  app.run(main)
