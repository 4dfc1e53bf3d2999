"""kvpool Python package: pure Python over libkvpool.so (ctypes).

Installs offline with Debian's pip and setuptools (no pyproject.toml, so pip
builds it in place without fetching a build backend):
    pip install ./python
libkvpool.so itself is not bundled: it is found through KVPOOL_LIBRARY, the
source checkout's build tree, or the system loader (ldconfig).
"""

import os
import sys

from setuptools import find_packages, setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kvpool"))
from _package_version import from_changelog  # noqa: E402

setup(
    name="kvpool",
    version=from_changelog(),
    description="Python client of the kvpool KV cache, with SGLang, vLLM and LMCache connectors",
    packages=find_packages(include=["kvpool", "kvpool.*"]),
    python_requires=">=3.9",
    zip_safe=False,
)
