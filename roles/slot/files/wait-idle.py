# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until the vLLM server on 127.0.0.1:PORT has no request running or waiting, at most TIMEOUT_S seconds.

Reads vLLM's own gauges (vllm:num_requests_running, vllm:num_requests_waiting) from /metrics: the server knows
every stream it still generates, whichever HAProxy worker or client relays it. Idle means two readings of zero in
a row. A server that does not answer has nothing in flight. Prints one JSON line: idle, in_flight, waited_s.
"""
import json
import sys
import time
import urllib.request

GAUGES = ('vllm:num_requests_running', 'vllm:num_requests_waiting')


def in_flight(port):
    try:
        with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port, timeout=5) as resp:
            text = resp.read().decode('utf-8', 'replace')
    except OSError as exc:
        if isinstance(getattr(exc, 'reason', exc), ConnectionRefusedError):
            return 0  # nothing listens: nothing in flight
        return None  # a slow or failing answer says nothing: not idle
    total = 0.0
    for line in text.splitlines():
        if line.startswith(GAUGES):
            total += float(line.rsplit(' ', 1)[1])
    return int(total)


def main():
    port, timeout_s = int(sys.argv[1]), float(sys.argv[2])
    start = time.monotonic()
    zeros, count = 0, 0
    while True:
        count = in_flight(port)
        zeros = zeros + 1 if count == 0 else 0
        if zeros >= 2 or time.monotonic() - start >= timeout_s:
            break
        time.sleep(0.5)
    print(json.dumps({'idle': zeros >= 2 or count == 0, 'in_flight': count,
                      'waited_s': round(time.monotonic() - start, 3)}))


if __name__ == '__main__':
    main()
