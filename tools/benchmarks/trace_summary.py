r"""Where a profiled run's device time went: a profiler trace summed by name.

Runbook:

  python3 tools/benchmarks/trace_summary.py --trace_dir=RUN/tensorboard \
      [--plane=/device:TPU:0] [--top=25]

Reads the newest `*.xplane.pb` under `--trace_dir` (what
`jax.profiler.start_trace` writes; the trainer's `profiler_steps` window,
`decode_bench --profile_dir`) and prints, for each line of the chosen plane
(on a TPU: "XLA Modules", the programs; "XLA Ops", the operations inside
them), the events' self time (an event's duration less the events nested in
it on the same line: a while loop's own time, without its body's operations)
summed by name, largest first, with their share of the line's busy time and
the line's span, so a truncated trace
(the device buffer keeps the first events only) shows as a span far below
the traced window. The summary is made where the trace is, so only text
needs to travel.
"""

import collections
import dataclasses
import glob
import os
import re

from absl import app
from absl import flags
from jax._src.lib import _profile_data

_TRACE_DIR = flags.DEFINE_string(
    "trace_dir", None, "Directory holding the trace (searched recursively)."
)
_PLANE = flags.DEFINE_string(
    "plane",
    "/device:",
    "Planes whose name starts with this are summarised (the host's: "
    "/host:CPU).",
)
_TOP = flags.DEFINE_integer("top", 25, "Rows per table.")
_DEPTH = flags.DEFINE_integer(
    "depth", 6, "Name-stack components kept when grouping by source."
)


@dataclasses.dataclass
class LineSummary:
  """One line's events: count and nanoseconds by name and by name stack."""

  plane: str
  line: str
  events: int = 0
  busy_ns: float = 0.0
  first_ns: float = float("inf")
  last_ns: float = 0.0
  by_name: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )
  by_source: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )
  by_category: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )
  counts: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )

  @property
  def span_ns(self) -> float:
    return max(self.last_ns - self.first_ns, 0.0)


def newest_trace(trace_dir: str) -> str:
  """The newest `*.xplane.pb` under `trace_dir`; ValueError if none."""
  found = glob.glob(
      os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True
  )
  if not found:
    raise ValueError(f"no *.xplane.pb under {trace_dir}")
  return max(found, key=os.path.getmtime)


def _source(stats: dict, depth: int) -> str:
  """The event's JAX name stack cut to `depth` components, without the
  numeric suffixes that differ between otherwise equal operations."""
  op = str(stats.get("tf_op", "") or "")
  if not op:
    return ""
  parts = [re.sub(r"\.\d+$", "", p) for p in op.split("/") if p]
  return "/".join(parts[:depth])


def short_name(name: str) -> str:
  """An event's name without numeric suffixes; for an HLO instruction's
  text (`%fusion.12 = bf16[8,2048]{1,0:T(8,128)} fusion(...)`, a TPU's op
  names) its name and result shape without layouts."""
  match = re.match(r"%?([\w.\-]+) = (\S+)", name)
  if not match:
    return re.sub(r"\.\d+$", "", name)
  shape = match.group(2)
  shape = "(tuple)" if shape.startswith("(") else re.sub(r"\{.*", "", shape)
  if len(shape) > 80:
    shape = shape[:77] + "..."
  base = re.sub(r"\.\d+$", "", match.group(1))
  return f"{base} {shape}"


def self_times(events: list) -> list[float]:
  """Each event's duration less the durations of the events nested
  directly inside it (same line, within its interval)."""
  order = sorted(
      range(len(events)),
      key=lambda i: (events[i].start_ns, -events[i].duration_ns),
  )
  own = [float(e.duration_ns) for e in events]
  open_stack: list[int] = []
  for i in order:
    start = events[i].start_ns
    while open_stack and (
        events[open_stack[-1]].start_ns + events[open_stack[-1]].duration_ns
        <= start
    ):
      open_stack.pop()
    if open_stack:
      own[open_stack[-1]] -= events[i].duration_ns
    open_stack.append(i)
  return [max(t, 0.0) for t in own]


def summarise(path: str, plane_prefix: str, depth: int) -> list[LineSummary]:
  """Every line of every plane whose name starts with `plane_prefix`."""
  data = _profile_data.ProfileData.from_file(path)
  lines = []
  for plane in data.planes:
    if not plane.name.startswith(plane_prefix):
      continue
    for line in plane.lines:
      summary = LineSummary(plane=plane.name, line=line.name)
      events = list(line.events)
      for event, own in zip(events, self_times(events)):
        stats = dict(event.stats)
        name = short_name(event.name)
        summary.events += 1
        summary.busy_ns += own
        summary.first_ns = min(summary.first_ns, event.start_ns)
        summary.last_ns = max(
            summary.last_ns, event.start_ns + event.duration_ns
        )
        summary.by_name[name] += own
        summary.counts[name] += 1
        source = _source(stats, depth)
        if source:
          summary.by_source[source] += own
        category = stats.get("hlo_category")
        if category:
          summary.by_category[str(category)] += own
      if summary.events:
        lines.append(summary)
  return lines


def _table(title: str, counter, total: float, top: int, counts=None) -> str:
  rows = [f"  {title}:"]
  for key, ns in counter.most_common(top):
    count = f" x{counts[key]}" if counts is not None else ""
    rows.append(
        f"    {ns / 1e6:10.3f} ms {100.0 * ns / max(total, 1.0):5.1f}%  "
        f"{key}{count}"
    )
  return "\n".join(rows)


def render(lines: list[LineSummary], top: int) -> str:
  """The tables of `summarise`'s lines as text."""
  out = []
  for s in lines:
    out.append(
        f"{s.plane} | {s.line}: {s.events} events, busy "
        f"{s.busy_ns / 1e6:.3f} ms over a span of {s.span_ns / 1e6:.3f} ms"
    )
    out.append(_table("by name", s.by_name, s.busy_ns, top, s.counts))
    if s.by_category:
      out.append(_table("by category", s.by_category, s.busy_ns, top))
    if s.by_source:
      out.append(_table("by source", s.by_source, s.busy_ns, top))
  return "\n".join(out)


def main(argv: list[str]) -> None:
  """Prints the summary of the newest trace under --trace_dir."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _TRACE_DIR.value:
    raise app.UsageError("--trace_dir is required")
  try:
    path = newest_trace(_TRACE_DIR.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  lines = summarise(path, _PLANE.value, _DEPTH.value)
  print(f"trace_summary: {path}")
  if not lines:
    names = [p.name for p in _profile_data.ProfileData.from_file(path).planes]
    print(
        f"no events on planes starting with {_PLANE.value!r}; planes: {names}"
    )
    return
  print(render(lines, _TOP.value))


if __name__ == "__main__":
  app.run(main)
