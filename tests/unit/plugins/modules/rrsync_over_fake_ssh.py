"""TEST DOUBLE of ssh for llmfleet.vllm.peer_copy's unit tests: no sshd runs in a unit test, so this stands in for the
network hop only. It does what sshd does with the per-rollout key's forced command: runs rsync's own rrsync -ro on the
source's model directory with SSH_ORIGINAL_COMMAND set to what the client asked. The real ssh + sshd path is tested
on the systemd test hosts (tests/integration/test_rollout.py).

FAKE_SSH_SOURCES is a JSON object {address: model directory}; an address it lacks fails like an unreachable host.
test_peer_copy.py runs it through a small executable it writes into the test's temporary directory.
"""
import json
import os
import shlex
import sys

WITH_VALUE = {"-F", "-i", "-p", "-o", "-l"}


def main(argv):
    args, index = argv[1:], 0
    while index < len(args) and args[index].startswith("-"):
        index += 2 if args[index] in WITH_VALUE else 1
    host, command = args[index], args[index + 1:]
    sources = json.loads(os.environ["FAKE_SSH_SOURCES"])
    if host not in sources:
        sys.stderr.write("ssh: connect to host %s port 22: Connection refused\n" % host)
        return 255
    os.environ["SSH_ORIGINAL_COMMAND"] = " ".join(shlex.quote(part) for part in command)
    os.execvp("rrsync", ["rrsync", "-ro", sources[host]])
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
