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

    # One package repository per platform; a build installs only the one its
    # //third_party/py:platform selects (--config=tpu, --config=gpu).
    locks = {
        "cpu": "//third_party/py:requirements_lock.txt",
        "tpu": "//third_party/py:requirements_tpu_lock.txt",
        "gpu": "//third_party/py:requirements_gpu_lock.txt",
    }
    # The accelerator extras jax was locked with also become deps of the jax target,
    # so the TPU set's jax pulls in libtpu and the GPU set's the CUDA plugin wheels.
    extras = {
        "cpu": {},
        "tpu": {"jax": ["tpu"]},
        "gpu": {"jax": ["cuda12"], "jax_cuda12_plugin": ["with-cuda"]},
    }
    for platform, lock in locks.items():
        pip_repository(name = "pypi_" + platform, lock = lock, extras = extras[platform])
    # Test and tool-only packages (torch, transformers): a hub of their own that only
    # the targets needing them name (through //third_party/py:torch_transformers), so
    # the default set-up and train_main never fetch it. Its lock holds only what the
    # CPU lock lacks; the shared packages come from @pypi.
    pip_repository(name = "pypi_torch", lock = "//third_party/py:requirements_torch_lock.txt")
    # The GRPO ray tool executor's Ray, likewise a hub of its own that only
    # //third_party/py:ray names (maxtext/env/ray_executor.py, its tests, its benchmark).
    pip_repository(name = "pypi_ray", lock = "//third_party/py:requirements_ray_lock.txt")
    pip_alias_repository(
        name = "pypi",
        locks = {lock: platform for platform, lock in locks.items()},
        repositories = {platform: "pypi_" + platform for platform in locks},
    )
