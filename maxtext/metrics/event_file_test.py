"""Tests for maxtext.metrics.event_file, against tensorboardX's own records."""

import glob
import os

from absl.testing import absltest
from tensorboardX import record_writer
from tensorboardX.proto import event_pb2

from maxtext.metrics import event_file


def _version_event() -> bytes:
  return event_pb2.Event(
      wall_time=1.0, file_version="brain.Event:2"
  ).SerializeToString()


class EventFileTest(absltest.TestCase):

  def test_records_match_tensorboardx_byte_for_byte(self):
    tmp = self.create_tempdir().full_path
    data = [b"", b"x", bytes(range(256)) * 5]
    reference = os.path.join(tmp, "reference")
    writer = record_writer.RecordWriter(reference)
    for item in data:
      writer.write(item)
    writer.close()
    with open(reference, "rb") as f:
      self.assertEqual(b"".join(map(event_file.encode_record, data)), f.read())

  def test_file_holds_the_version_then_the_events(self):
    tmp = self.create_tempdir().full_path
    events = event_file.EventFile(tmp, _version_event(), now=1234.5)
    step = event_pb2.Event(step=3, wall_time=2.0).SerializeToString()
    events.write(step)
    events.close()
    events.close()  # Idempotent.
    (path,) = glob.glob(os.path.join(tmp, "events.out.tfevents.1234.*"))
    self.assertEqual(path, events.path)
    with open(path, "rb") as f:
      self.assertEqual(
          f.read(),
          event_file.encode_record(_version_event())
          + event_file.encode_record(step),
      )

  def test_full_disk_is_raised_naming_the_file(self):
    tmp = self.create_tempdir().full_path
    events = event_file.EventFile(tmp, _version_event(), now=1.0)
    # The events go to /dev/full from here on: every write-out fails with
    # ENOSPC, as on a full disk.
    # EventFile has no public descriptor: the test reaches into its file.
    fileno = events._file.fileno()  # pylint: disable=protected-access
    os.dup2(os.open("/dev/full", os.O_WRONLY), fileno)
    events.write(b"x" * 100)  # Buffered: nothing reached the disk yet.
    with self.assertRaisesRegex(
        OSError, r"No space left on device: '" + events.path
    ):
      events.close()
    events.close()  # Closed despite the failure; nothing left to retry.


if __name__ == "__main__":
  absltest.main()
