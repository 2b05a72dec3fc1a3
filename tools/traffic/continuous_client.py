"""Continuous client traffic against an OpenAI-compatible endpoint, counting every failed request.

The tests and benches of pivots and rollouts run it beside the change they make: a client that keeps sending short
completions with the `openai` package (what agents call vLLM with), one at a time per worker, bounded in count and
time, and records each request's start, end, outcome and error. Loopback / test-host addresses only.

    with ContinuousClient("http://127.0.0.1:8401/v1", "tiny-llama-a") as client:
        ...  # pivot something else
    assert client.summary()["failed"] == 0

    python tools/traffic/continuous_client.py --base-url URL --model NAME --seconds 60   # prints the summary as JSON
    python tools/traffic/continuous_client.py ... --seconds 900 --stop-file F --output OUT.json &   # until F exists
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

import openai


class ContinuousClient:
    def __init__(self, base_url, model, api_key="none", workers=1, max_requests=20000, max_seconds=1800,
                 max_tokens=4, timeout_s=60, prompt="The capital of France is", interval_s=0.5, stream=False,
                 failure_interval_s=None):
        self.base_url, self.model = base_url, model
        # stream: each request is a stream of max_tokens (EOS ignored); one cut before its finish_reason is a failure
        # (status 200, error "cut after N chunks"): what a server stopped under its streams does to a client.
        self.stream = stream
        self.workers, self.max_requests, self.max_seconds = workers, max_requests, max_seconds
        # A steady client, not a saturating one: each worker waits interval_s between requests.
        self.max_tokens, self.prompt, self.interval_s = max_tokens, prompt, interval_s
        # After a failed request (default: interval_s): back to back streams need no pause, a closed gateway's 503s do.
        self.failure_interval_s = interval_s if failure_interval_s is None else failure_interval_s
        # No retries: every failure the server or the network gives is counted, not hidden by the client.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = []
        self.requests = []  # {start, end, ok, status, error}
        self.started_at = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self.started_at = time.time()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _worker in range(self.workers)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self.summary()

    def _run(self):
        while not self._stop.is_set() and time.time() - self.started_at < self.max_seconds:
            with self._lock:
                if len(self.requests) >= self.max_requests:
                    return
            self._one()

    def _one(self):
        start = time.time()
        entry = {"start": start, "ok": False, "status": None, "error": None}
        try:
            if self.stream:
                self._one_stream(entry)
            else:
                answer = self._client.completions.create(model=self.model, prompt=self.prompt, max_tokens=self.max_tokens)
                entry["ok"] = bool(answer.choices) and (answer.usage is None or answer.usage.completion_tokens >= 1)
                entry["status"] = 200
                if not entry["ok"]:
                    entry["error"] = "empty answer"
        except openai.APIStatusError as exc:
            entry.update(status=exc.status_code, error="HTTP %d: %s" % (exc.status_code, str(exc)[:200]),
                         retry_after=exc.response.headers.get("retry-after"))
        except openai.APIError as exc:  # connection refused or reset, timeout
            entry["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
        entry["end"] = time.time()
        with self._lock:
            self.requests.append(entry)
        self._stop.wait(self.interval_s if entry["ok"] else self.failure_interval_s)

    def _one_stream(self, entry):
        entry.update(status=200, chunks=0, finish_reason=None)
        try:
            for chunk in self._client.completions.create(model=self.model, prompt=self.prompt, max_tokens=self.max_tokens,
                                                         stream=True, extra_body={"ignore_eos": True}):
                entry["chunks"] += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    entry["finish_reason"] = chunk.choices[0].finish_reason
        except openai.APIStatusError:
            raise
        except Exception as exc:  # pylint: disable=broad-except  # closed under the stream: openai's or httpx's error
            entry["error"] = "cut after %d chunks: %s: %s" % (entry["chunks"], type(exc).__name__, str(exc)[:160])
        entry["ok"] = entry["finish_reason"] is not None and entry["error"] is None
        if entry["error"] is None and not entry["ok"]:
            entry["error"] = "cut after %d chunks: no finish_reason" % entry["chunks"]

    def summary(self):
        with self._lock:
            done = list(self.requests)
        failed = [r for r in done if not r["ok"]]
        return {"base_url": self.base_url, "model": self.model, "requests": len(done), "ok": len(done) - len(failed),
                "failed": len(failed), "seconds": round((max((r["end"] for r in done), default=time.time())
                                                        - (self.started_at or time.time())), 1),
                "errors": sorted({r["error"] for r in failed})[:10],
                "first_failure_at": min((r["start"] for r in failed), default=None),
                "last_failure_at": max((r["end"] for r in failed), default=None)}


def log_summary(summary, name=None, path=None):
    """Append {name, summary} as a JSON line to tests/output/logs/traffic.jsonl (the figures a test asserted on);
    the name defaults to the pytest test running."""
    name = name or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    path = path or os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "output", "logs", "traffic.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({"name": name, **summary}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--max-requests", type=int, default=20000)
    parser.add_argument("--timeout-s", type=float, default=60,
                        help="a request's own timeout (above the gateway's gateway_hold_s to see held requests answered)")
    parser.add_argument("--stop-file", help="stop once this file exists")
    parser.add_argument("--output", help="write the summary and every request here (JSON) instead of stdout")
    args = parser.parse_args()
    client = ContinuousClient(args.base_url, args.model, api_key=args.api_key, workers=args.workers,
                              max_requests=args.max_requests, max_seconds=args.seconds, timeout_s=args.timeout_s).start()
    try:
        while any(t.is_alive() for t in client._threads):  # pylint: disable=protected-access
            if args.stop_file and os.path.exists(args.stop_file):
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    summary = client.stop()
    if args.output:
        with open(args.output + ".tmp", "w") as handle:
            json.dump(dict(summary, requests_log=client.requests), handle, indent=1)
        os.replace(args.output + ".tmp", args.output)
    else:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
