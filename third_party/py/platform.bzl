"""The build setting that picks the Python package set: cpu, tpu or gpu.

Set it with `--config=tpu` / `--config=gpu` (see .bazelrc), or through a transition
(//tools/zipapp), never by editing targets: every `@pypi//:<pkg>` alias selects on it.
"""

PLATFORMS = ["cpu", "tpu", "gpu"]

def _platform_flag_impl(ctx):
    value = ctx.build_setting_value
    if value not in PLATFORMS:
        fail("//third_party/py:platform must be one of %s, got '%s'" % (PLATFORMS, value))
    return []

platform_flag = rule(
    implementation = _platform_flag_impl,
    build_setting = config.string(flag = True),
    doc = "A string flag naming the package platform.",
)
