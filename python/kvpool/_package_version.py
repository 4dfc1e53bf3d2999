"""The package's version: the top entry of the source tree's
packaging/changelog, the one place kvpool's version is kept. An installed
package carries the version it was built with in _version.py instead."""

import os
import re


def from_changelog(path=None):
    if path is None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, os.pardir, os.pardir, "packaging", "changelog")
    with open(path, encoding="utf-8") as f:
        m = re.match(r"kvpool \((\d+\.\d+\.\d+)\)", f.readline())
    if m is None:
        raise ValueError("%s does not start with 'kvpool (X.Y.Z)'" % path)
    return m.group(1)


def package_version():
    try:
        from ._version import VERSION  # written when the package is installed

        return VERSION
    except ImportError:
        return from_changelog()
