"""python_zipapp: one self-contained, executable file from a py_binary.

The file is `#!/usr/bin/env python3` followed by a zip of the binary's whole
runfiles tree (our code, data files and every Python package of the build's
platform) and launcher.py as `__main__.py`. It runs with a plain Python 3.11 from
PATH: no Bazel, no checkout, no path of the build machine. The launcher unpacks the
runfiles once into a cache directory keyed by the file's content and runs the
program in its own process, so signals such as SIGTERM reach the program directly.

`platform` ("cpu", "tpu", "gpu") builds the binary for that package set through a
transition; empty keeps the build's own --//third_party/py:platform.

A zipapp is a release file, so it is always stamped: `build_info` names the
workspace path (e.g. "maxtext/build_info.json") where the build's revision goes
(see build_info.bzl), replacing any unstamped or older one in the runfiles.
Stamping reruns only this packing action when the revision changes.
"""

load(":build_info.bzl", "STAMP_ATTRS", "write_build_info")

_PLATFORM_FLAG = "//third_party/py:platform"

def _platform_transition_impl(settings, attr):
    return {_PLATFORM_FLAG: attr.platform or settings[_PLATFORM_FLAG]}

_platform_transition = transition(
    implementation = _platform_transition_impl,
    inputs = [_PLATFORM_FLAG],
    outputs = [_PLATFORM_FLAG],
)

def _manifest_line(file):
    return "%s\t%s" % (file.short_path, file.path)

def _python_zipapp_impl(ctx):
    binary = ctx.attr.binary[0]
    runfiles = binary[DefaultInfo].default_runfiles.files
    python_paths = [ctx.workspace_name] + [
        path
        for path in binary[PyInfo].imports.to_list()
    ]
    main = ctx.workspace_name + "/" + ctx.file.main.short_path
    output = ctx.actions.declare_file(ctx.attr.out or ctx.label.name)

    args = ctx.actions.args()
    args.add("--output", output)
    args.add("--launcher", ctx.file._launcher)
    args.add("--workspace", ctx.workspace_name)
    args.add("--main", main)
    args.add_all(python_paths, before_each = "--python_path")
    inputs = [ctx.file._launcher]
    if ctx.attr.build_info:
        stamp = ctx.actions.declare_file(ctx.label.name + ".build_info.json")
        write_build_info(ctx, stamp)
        inputs.append(stamp)
        args.add("--file", "%s/%s=%s" % (
            ctx.workspace_name,
            ctx.attr.build_info,
            stamp.path,
        ))
    manifest = ctx.actions.args()
    manifest.add_all(runfiles, map_each = _manifest_line)
    manifest.use_param_file("--manifest=%s", use_always = True)
    manifest.set_param_file_format("multiline")
    ctx.actions.run(
        executable = ctx.executable._builder,
        arguments = [args, manifest],
        inputs = depset(inputs, transitive = [runfiles]),
        outputs = [output],
        mnemonic = "PythonZipapp",
        progress_message = "Packing %s" % output.short_path,
    )
    return [DefaultInfo(files = depset([output]), executable = output)]

python_zipapp = rule(
    implementation = _python_zipapp_impl,
    executable = True,
    attrs = dict(STAMP_ATTRS, **{
        "binary": attr.label(
            mandatory = True,
            cfg = _platform_transition,
            providers = [PyInfo],
            doc = "The py_binary to pack.",
        ),
        "main": attr.label(
            mandatory = True,
            allow_single_file = [".py"],
            doc = "The binary's main source file.",
        ),
        "platform": attr.string(
            default = "",
            values = ["", "cpu", "tpu", "gpu"],
            doc = "Package platform to build for; empty = the build's own.",
        ),
        "out": attr.string(doc = "Output file name; defaults to the target name."),
        "build_info": attr.string(
            default = "",
            doc = "Workspace path of the stamped build_info.json; empty: none.",
        ),
        "_builder": attr.label(
            default = "//tools/zipapp:build_zipapp",
            executable = True,
            cfg = "exec",
        ),
        "_launcher": attr.label(
            default = "//tools/zipapp:launcher.py",
            allow_single_file = True,
        ),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    }),
    doc = "A self-contained executable zip of a py_binary and its runfiles.",
)
