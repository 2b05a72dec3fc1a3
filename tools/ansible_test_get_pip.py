"""Offline stand-in for ansible-test's pip bootstrap script (get-pip.py).

ansible-test downloads get-pip.py from ci-files.testing.ansible.com, which this
project's CI cannot reach (only package registries are reachable). This script
does the same job from parts that are available: `ensurepip` seeds the venv with
the interpreter's bundled pip, which then installs the requested pip version
from the package index. tools/sanity.sh places it in ansible-test's cache.
"""
import ensurepip
import os
import subprocess
import sys

IGNORED = {"--no-setuptools", "--no-wheel"}

config_file = os.environ.get("PIP_CONFIG_FILE")
ensurepip.bootstrap(upgrade=True)
# ensurepip points PIP_CONFIG_FILE at /dev/null; restore the site's pip config (index, CA bundle).
os.environ.pop("PIP_CONFIG_FILE", None)
if config_file is not None:
    os.environ["PIP_CONFIG_FILE"] = config_file
args = [arg for arg in sys.argv[1:] if arg not in IGNORED]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *args]))
