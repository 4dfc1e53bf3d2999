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
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kvpool"))
from _package_version import from_changelog  # noqa: E402

VERSION = from_changelog()


class BuildPyWithVersion(build_py):
    """Writes kvpool/_version.py into the build, so an installed package
    knows its version without the repository's changelog."""

    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, "kvpool", "_version.py"), "w") as f:
            f.write("# Written when kvpool was built: the version of packaging/changelog.\n"
                    "VERSION = \"%s\"\n" % VERSION)


setup(
    name="kvpool",
    version=VERSION,
    cmdclass={"build_py": BuildPyWithVersion},
    description="Python client of the kvpool KV cache, with SGLang, vLLM and LMCache connectors",
    packages=find_packages(include=["kvpool", "kvpool.*"]),
    python_requires=">=3.9",
    zip_safe=False,
)
