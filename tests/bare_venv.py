"""A venv laid out by hand over the system's python3 (as tools/testbed/testbed.sh lays out the stand-in's): what site.py
reads of a venv (pyvenv.cfg, bin/python, lib/pythonX.Y/site-packages), without the venv module, which Debian ships in
a package of its own (python3-venv). The system's interpreter, because the tests' own may sit where another user
cannot reach it (a home directory)."""
import pathlib
import subprocess

SYSTEM_PYTHON = '/usr/bin/python3'


def bare_venv(venv: pathlib.Path, python: str = SYSTEM_PYTHON) -> pathlib.Path:
    """Make the venv at ``venv``; returns its site-packages."""
    version = subprocess.run([python, '-c', 'import sys; print("%d.%d.%d" % sys.version_info[:3])'],
                             capture_output=True, text=True, check=True).stdout.strip()
    short = '.'.join(version.split('.')[:2])
    site = venv / 'lib' / ('python' + short) / 'site-packages'
    site.mkdir(parents=True)
    (venv / 'bin').mkdir()
    (venv / 'pyvenv.cfg').write_text('home = %s\ninclude-system-site-packages = false\nversion = %s\n'
                                     % (pathlib.Path(python).parent, version))
    (venv / 'bin' / 'python').symlink_to(pathlib.Path(python).resolve())
    for path in [venv, *venv.rglob('*')]:
        if path.is_dir():
            path.chmod(0o755)
    return site
