"""build_info: the source revision a binary was built from, stamped at build time.

A stamped action reads the workspace status (tools/workspace_status.sh, set in
.bazelrc) and writes build_info.json (tools/zipapp/write_build_info.py), which
`maxtext.storage.build_info` reads at run time. Only stamped actions read the
status files, so only they rerun when the revision changes: tests and other
unstamped targets stay cached across commits.

`build_info(name, out, stamp)` follows the native rules' `stamp`: 1 always
stamps, 0 never, -1 (the default) only when the build runs with `--stamp`. An
unstamped build_info has no files at all, so a binary listing it as data runs
with the run-time fallback (asking git).
"""

STAMP_ATTRS = {
    "_build_info_writer": attr.label(
        default = "//tools/zipapp:write_build_info",
        executable = True,
        cfg = "exec",
    ),
}

def write_build_info(ctx, output):
    """Adds the action that writes `output` from this build's workspace status."""
    args = ctx.actions.args()
    args.add("--stable_status", ctx.info_file)
    args.add("--volatile_status", ctx.version_file)
    args.add("--output", output)
    ctx.actions.run(
        executable = ctx.executable._build_info_writer,
        arguments = [args],
        # The volatile file (the build time) never reruns an action by itself;
        # a change of the stable one (the revision) does.
        inputs = [ctx.info_file, ctx.version_file],
        outputs = [output],
        mnemonic = "BuildInfo",
        progress_message = "Stamping %s" % output.short_path,
    )

def _build_info_impl(ctx):
    stamp = ctx.attr.stamp == 1 or (ctx.attr.stamp == -1 and
                                     ctx.attr.stamp_requested)
    if not stamp:
        return [DefaultInfo()]
    output = ctx.actions.declare_file(ctx.attr.out)
    write_build_info(ctx, output)
    files = depset([output])
    return [DefaultInfo(files = files, runfiles = ctx.runfiles(files = [output]))]

_build_info = rule(
    implementation = _build_info_impl,
    attrs = dict(STAMP_ATTRS, **{
        "out": attr.string(mandatory = True),
        "stamp": attr.int(default = -1, values = [-1, 0, 1]),
        "stamp_requested": attr.bool(mandatory = True),
    }),
    doc = "build_info.json of a stamped build; nothing when unstamped.",
)

def build_info(name, out = "build_info.json", stamp = -1, **kwargs):
    """build_info.json under this package, stamped as `stamp` says.

    Args:
      name: the target's name.
      out: the file's name in this package.
      stamp: 1 always, 0 never, -1 only under `--stamp`.
      **kwargs: common attributes (visibility, tags, ...).
    """
    _build_info(
        name = name,
        out = out,
        stamp = stamp,
        # Bazel 4 gives Starlark rules no other view of --stamp.
        stamp_requested = select({
            "//tools/zipapp:stamp_requested": True,
            "//conditions:default": False,
        }),
        **kwargs
    )
