"""Every external repository of the workspace, declared without network access."""

load("//third_party/py:pip_repository.bzl", "pip_alias_repository", "pip_repository", "python_venv")

def maxtext_repositories():
    """Declares the offline Bazel stubs, the private interpreter and the Python packages."""

    # Bazel's built-in rules refer to these repositories; local stand-ins keep every
    # build offline.
    native.local_repository(name = "rules_cc", path = "third_party/bazel/rules_cc")
    native.local_repository(name = "rules_java", path = "third_party/bazel/rules_java")
    native.local_repository(name = "remote_coverage_tools", path = "third_party/bazel/remote_coverage_tools")

    python_venv(name = "python_venv")
    pip_repository(name = "pypi_cpu", lock = "//third_party/py:requirements_lock.txt")
    pip_alias_repository(
        name = "pypi",
        lock = "//third_party/py:requirements_lock.txt",
        target = "@pypi_cpu",
    )
