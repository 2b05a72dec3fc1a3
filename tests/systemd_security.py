"""The exposure `systemd-analyze security` rates a unit file at, and the most the collection's vLLM units may have."""
import re
import subprocess


MAX_EXPOSURE = 4.0


def exposure(systemd_analyze, unit):
    """`systemd-analyze security --offline=true` of a unit file: (overall exposure, the report)."""
    out = subprocess.run([systemd_analyze, 'security', '--offline=true', '--no-pager', str(unit)],
                         capture_output=True, text=True, check=False)
    found = re.search(r'Overall exposure level for \S+: (\d+\.\d+)', out.stdout)
    assert out.returncode == 0 and found, (unit, out.stdout, out.stderr)
    return float(found.group(1)), out.stdout
