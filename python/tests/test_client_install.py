"""`pip install ./python` works offline with Debian's pip and setuptools,
and the installed package finds the library through KVPOOL_LIBRARY."""

import os
import shutil
import subprocess
import sys

from conftest import PYTHON_DIR


def test_pip_install_offline_into_a_target_dir(tmp_path, kvpool_node):
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__"))
    # The version comes from the repository's packaging/changelog, beside python/.
    changelog = os.path.join(os.path.dirname(PYTHON_DIR), "packaging", "changelog")
    (tmp_path / "packaging").mkdir()
    shutil.copy(changelog, tmp_path / "packaging" / "changelog")
    with open(changelog) as f:
        version = f.readline().split("(")[1].split(")")[0]
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONPATH="")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--target", str(target), str(src)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "kvpool" / "integrations" / "sglang.py").is_file()
    code = ("import kvpool, sys; assert kvpool.__file__.startswith(sys.argv[1]), kvpool.__file__; "
            "assert kvpool.__version__ == sys.argv[3], kvpool.__version__; "
            "c = kvpool.Client(sys.argv[2]); print(c.put(['k'], [b'v']), c.get(['k'])); c.close()")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code, str(target), kvpool_node.socket, version],
                       env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[<StatusCode.OK: 0>] [b'v']"
