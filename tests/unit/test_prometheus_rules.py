"""The alert rules the collection ships (roles/observability/files/llmfleet-rules.yml), checked and unit-tested by
Debian's promtool: every alert fires on the series it is written for and stays quiet on its look-alikes
(tests/unit/prometheus/llmfleet-rules.test.yml)."""
import os
import subprocess

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, 'roles', 'observability', 'files', 'llmfleet-rules.yml')
TESTS = os.path.join(REPO, 'tests', 'unit', 'prometheus', 'llmfleet-rules.test.yml')


def promtool(prometheus_bin, *args, cwd=None):
    return subprocess.run([os.path.join(prometheus_bin, 'promtool'), *args], capture_output=True, text=True, cwd=cwd,
                          check=False)


def test_the_rules_are_valid(prometheus_bin):
    result = promtool(prometheus_bin, 'check', 'rules', RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_where_it_should_and_only_there(prometheus_bin):
    result = promtool(prometheus_bin, 'test', 'rules', os.path.basename(TESTS), cwd=os.path.dirname(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    # Each alert of the rules has a test that expects it to fire.
    with open(RULES, encoding='utf-8') as handle:
        alerts = {rule['alert'] for group in yaml.safe_load(handle)['groups'] for rule in group['rules'] if 'alert' in rule}
    with open(TESTS, encoding='utf-8') as handle:
        tested = {case['alertname'] for test in yaml.safe_load(handle)['tests'] for case in test.get('alert_rule_test', [])
                  if case.get('exp_alerts')}
    assert alerts == tested, alerts ^ tested


def test_a_broken_expectation_fails(prometheus_bin, tmp_path):
    """The harness can fail: the same tests, with one alert expected on the wrong host, do not pass."""
    with open(TESTS, encoding='utf-8') as handle:
        text = handle.read().replace('../../../roles/', REPO + '/roles/')
    broken = tmp_path / 'broken.test.yml'
    broken.write_text(text.replace('exp_labels: {severity: warning, job: llmfleet_vllm, host: gpu-01, slot: default}',
                                   'exp_labels: {severity: warning, job: llmfleet_vllm, host: gpu-02, slot: default}', 1))
    assert broken.read_text() != text
    assert promtool(prometheus_bin, 'test', 'rules', str(broken)).returncode != 0
