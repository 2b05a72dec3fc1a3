"""systemd-analyze for the unit tests: found (or installed, as on a fresh CI machine) once per session, and the
exposure `systemd-analyze security` rates a unit file at."""
import os
import re
import shutil
import subprocess

import pytest


@pytest.fixture(scope='session')
def systemd_analyze():
    """systemd-analyze, installed (Debian's systemd package) when missing and we are root, as on a fresh CI machine.

    `security --offline=true` needs systemd >= 252 (Debian 12).
    """
    if not shutil.which('systemd-analyze') and os.geteuid() == 0 and shutil.which('apt-get'):
        env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
        subprocess.run(['apt-get', 'update', '-qq'], check=True, env=env, capture_output=True)
        subprocess.run(['apt-get', 'install', '-y', '-qq', 'systemd'], check=True, env=env, capture_output=True)
    path = shutil.which('systemd-analyze')
    if not path:
        pytest.fail('systemd-analyze not found: install systemd (apt-get install systemd)')
    banner = subprocess.run([path, '--version'], capture_output=True, text=True, check=True).stdout
    version = int(re.match(r'systemd (\d+)', banner).group(1))
    if version < 252:
        pytest.fail('systemd-analyze security --offline=true needs systemd >= 252, found %d' % version)
    return path


@pytest.fixture(scope='session')
def prometheus_bin():
    """The directory of Debian's prometheus, promtool and prometheus-node-exporter (tools/prometheus/debian-prometheus.sh
    downloads and unpacks the packages once; nothing is installed)."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'tools',
                          'prometheus', 'debian-prometheus.sh')
    root = subprocess.run([script], capture_output=True, text=True, check=True).stdout.strip()
    return os.path.join(root, 'usr', 'bin')
