"""Debian's Prometheus for the integration tests, started by the test on this machine: it reads the targets the
collection writes (file_sd) and the collection's alert rules, scrapes the test hosts every second, and answers
queries over its HTTP API (no client library: urllib)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(REPO, "roles", "observability", "files", "llmfleet-rules.yml")


def debian_prometheus_bin() -> str:
    """The directory of Debian's prometheus, promtool and prometheus-node-exporter (unpacked once, nothing installed)."""
    root = subprocess.run([os.path.join(REPO, "tools", "prometheus", "debian-prometheus.sh")], capture_output=True,
                          text=True, check=True).stdout.strip()
    return os.path.join(root, "usr", "bin")


class PrometheusServer:
    def __init__(self, workdir, port: int, targets_dir):
        self.workdir, self.port, self.targets_dir = str(workdir), port, str(targets_dir)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.credentials_file = None

    def _write_config(self):
        job = {"job_name": "llmfleet", "file_sd_configs": [{"files": [self.targets_dir + "/*.json"], "refresh_interval": "5s"}]}
        if self.credentials_file:
            job["authorization"] = {"type": "Bearer", "credentials_file": self.credentials_file}
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "rule_files": [RULES], "scrape_configs": [job]}
        with open(os.path.join(self.workdir, "prometheus.yml"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)  # JSON is YAML

    def start(self):
        self._write_config()
        log = open(os.path.join(self.workdir, "prometheus.log"), "w", encoding="utf-8")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [os.path.join(debian_prometheus_bin(), "prometheus"), "--config.file=" + os.path.join(self.workdir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(self.workdir, "data"), f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait(lambda: self._get("/-/ready", raw=True) is not None, 60, "Prometheus ready")
        return self

    def reload(self, credentials_file=None):
        """Scrape with this Bearer credentials file from now on (SIGHUP: Prometheus reads its configuration again)."""
        self.credentials_file = credentials_file
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def log(self) -> str:
        with open(os.path.join(self.workdir, "prometheus.log"), encoding="utf-8") as handle:
            return handle.read()[-4000:]

    def _get(self, path, raw=False):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                body = resp.read()
        except OSError:
            return None
        return body if raw else json.loads(body)

    def query(self, expr: str) -> list:
        """The instant vector (or scalar) of expr now: [(labels, value)]."""
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer and answer["status"] == "success", (expr, answer)
        data = answer["data"]
        if data["resultType"] == "vector":
            return [(r["metric"], float(r["value"][1])) for r in data["result"]]
        return [({}, float(data["result"][1]))]

    def targets(self) -> list:
        return self._get("/api/v1/targets")["data"]["activeTargets"]

    def wait(self, ready, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = ready()
            if value:
                return value
            time.sleep(0.5)
        log = self.log() if self.proc else ""
        raise AssertionError("waited %.0f s for %s; Prometheus' log:\n%s" % (timeout_s, what, log))

    def wait_query(self, expr: str, predicate, timeout_s: float = 30):
        """The result of expr once predicate(result) holds (an empty result too, when that is what it wants)."""
        def ready():
            result = self.query(expr)
            return (result,) if predicate(result) else None
        return self.wait(ready, timeout_s, expr)[0]
