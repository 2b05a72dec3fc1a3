# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seeding a model over the LAN: which host copies from which, and what host-to-host access that needs.

One owner for the rules of ``roles/model_seed`` and the ``peer_copy`` module:

- rounds: every host holding a verified copy serves at most ``fanout`` hosts per round, so copies grow
  (fanout + 1)-fold a round (doubling with the default 1); a host never copies from a source named bad for it;
- the per-rollout access: one ``authorized_keys`` line per pulling host on each source, forced to a read-only
  rsync of the source's model directory (rsync's own ``rrsync``), ``restrict``, limited to the puller's address
  when that is an IP and expiring with the rollout; a known_hosts line per source;
- the rsync command line (ssh with that key only, the source's host key only, a bandwidth cap and an I/O
  timeout) and the figures of its ``--stats``.
"""
from __future__ import annotations

import copy
import ipaddress
import re
import shlex

from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import ORIGINALS_RELDIR

SEED_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
PUBLIC_KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) [A-Za-z0-9+/=]+\Z")
# Paths end up inside a forced command between double quotes: no quotes, no whitespace, no shell syntax.
SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+-]*\Z")
# A host name as known_hosts and from= take it: one word, no pattern characters (* ? !), no spaces or newlines.
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\.?\Z")
PARTIAL_DIR = ".cache/llmfleet/rsync-partial"
DONE_PREFIX = "llmfleet-done "
_STATS = {"literal": "Literal data", "matched": "Matched data", "received": "Total bytes received",
          "transferred_files": "Number of regular files transferred"}


# rsync's exit statuses when its remote shell failed (ssh could not connect, or was refused): 255, or 12 when rsync saw
# its stream close before ssh's status.
SSH_REFUSED = (255, 12)
MAX_FAILED_ROUNDS = 3


class SeedError(ValueError):
    pass


def plan_round(holders, targets, fanout=1, avoid=None):
    """{target: [source, fallback sources...]} for one round.

    holders -- hosts holding a verified copy, in order of preference; targets -- hosts still without one, in order;
    avoid -- {target: [sources named bad for it]}. Each holder is the first source of at most ``fanout`` targets; a
    target's other sources are the holders with room left under ``fanout`` (least loaded first), tried only when the
    first fails, so that no host ever serves more than ``fanout`` at once. A target without a free holder waits for
    the next round.
    """
    fanout = int(fanout)
    if fanout < 1:
        raise SeedError("fanout must be at least 1, got %r" % fanout)
    avoid = avoid or {}
    load = dict((holder, 0) for holder in holders)
    order = dict((holder, index) for index, holder in enumerate(holders))
    plan = {}
    for target in targets:
        usable = [h for h in holders if h != target and h not in (avoid.get(target) or ())]
        free = [h for h in usable if load[h] < fanout]
        if not free:
            continue
        first = min(free, key=lambda h: (load[h], order[h]))
        load[first] += 1
        plan[target] = [first]
    for target, sources in plan.items():
        spare = [h for h in holders if h != target and h not in (avoid.get(target) or ()) and h != sources[0]
                 and load[h] < fanout]
        sources.extend(sorted(spare, key=lambda h: (load[h], order[h])))
    return plan


def new_state(holders, targets):
    """The seeding state the rounds carry: who holds a verified copy, who still needs one, which sources a target
    must not use again, which holders were named bad (to be checked again), which targets no peer could serve."""
    return {"holders": list(holders), "pending": [t for t in targets if t not in holders], "avoid": {},
            "suspects": [], "no_peer": {}, "bad_named": {}, "failed_rounds": {}}


def after_copies(state, copies, plan):
    """The state after one round's copies.

    copies -- {target: peer_copy's result} of the targets planned this round (others may be absent or skipped).
    A verified target becomes a holder. A source that sent a bad file, or a copy lacking files, leaves the holders
    until a full check of its own copy clears it, and is never again a source for that target. A target whose every
    attempt failed tries again in the next round (a source whose sender died is still up, and the partial files are
    kept), unless no source could be reached at all (ssh failed before any byte came: rsync's exit 255 or 12) and no other
    holder is left, or it is the target's ``MAX_FAILED_ROUNDS``-th such round: then it falls back to the hub.
    """
    state = copy.deepcopy(dict(state))
    state.setdefault("failed_rounds", {})
    gave_nothing = []
    for target in plan:
        result = copies.get(target) or {}
        if result.get("skipped"):
            continue
        if "verified" not in result:  # the copy task itself failed or timed out: a failed round
            gave_nothing.append((target, [{"source": "-", "rc": None, "bytes": 0,
                                           "error": str(result.get("msg") or "the copy ended without a result")}]))
            continue
        for source, files in (result.get("bad_sources") or {}).items():
            _suspect(state, target, source, ["%s (to %s)" % (f, target) for f in files])
        for attempt in result.get("attempts") or []:
            if attempt.get("result") == "incomplete":
                _suspect(state, target, attempt["source"], ["files missing (to %s)" % target])
        if result["verified"]:
            state["pending"].remove(target)
            state["holders"].append(target)
            continue
        attempts = result.get("attempts") or []
        failed = [a for a in attempts if a.get("result") == "failed"]
        if attempts and len(failed) == len(attempts):
            gave_nothing.append((target, failed))
    for target, failed in gave_nothing:
        state["failed_rounds"][target] = state["failed_rounds"].get(target, 0) + 1
        tried = [a["source"] for a in failed]
        others = [h for h in state["holders"] if h not in tried and h != target
                  and h not in state["avoid"].get(target, [])]
        # ssh refused or unreachable: rsync exits 255, or 12 when it noticed the closed stream first; no byte came.
        unreachable = all(a.get("rc") in SSH_REFUSED and not a.get("bytes") for a in failed)
        if (unreachable and not others and not state["suspects"]) \
                or state["failed_rounds"][target] >= MAX_FAILED_ROUNDS:
            state["pending"].remove(target)
            state["no_peer"][target] = "; ".join("%s: %s" % (a["source"], a.get("error", "")) for a in failed)
    return state


def _suspect(state, target, source, what):
    state["avoid"].setdefault(target, [])
    if source not in state["avoid"][target]:
        state["avoid"][target].append(source)
    state["bad_named"].setdefault(source, [])
    state["bad_named"][source].extend(what)
    if source in state["holders"]:
        state["holders"].remove(source)
    if source not in state["suspects"]:
        state["suspects"].append(source)


def after_checks(state, checks):
    """The state after hosts checked their own copy, {host: passed}: a target's copy left by an earlier run, or a
    holder named bad. One whose copy passed holds a verified copy; a suspect whose copy failed (its bad files moved
    aside, the rest kept) needs the model again."""
    state = copy.deepcopy(dict(state))
    for host, passed in checks.items():
        was_suspect = host in state["suspects"]
        if was_suspect:
            state["suspects"].remove(host)
        if passed:
            if host in state["pending"]:
                state["pending"].remove(host)
            if host not in state["holders"]:
                state["holders"].append(host)
        elif was_suspect and host not in state["pending"]:
            state["pending"].append(host)
    return state


def rounds_needed(holders, targets, fanout=1):
    """Rounds that ``targets`` hosts need from ``holders`` verified copies when every copy succeeds."""
    holders, targets, fanout = int(holders), int(targets), int(fanout)
    if holders < 1 and targets > 0:
        raise SeedError("seeding needs at least one host holding a verified copy")
    rounds = 0
    while targets > 0:
        served = min(targets, holders * fanout)
        holders, targets, rounds = holders + served, targets - served, rounds + 1
    return rounds


def _is_ip(address):
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def check_seed_path(path, what):
    if not isinstance(path, str) or not SAFE_PATH_RE.match(path) or "/../" in path + "/":
        raise SeedError("%s must be an absolute path of letters, digits and ._/@+- only (it goes into a forced "
                        "ssh command), got %r" % (what, path))
    if not path.strip("/.") or "/./" in path + "/":
        raise SeedError("%s must name a directory below /, got %r: the whole file system would be readable" % (what, path))
    return path


def check_host_address(address, what="the address"):
    """An IP address or a host name (letters, digits, _ . and -): what known_hosts and from= may hold."""
    address = str(address)
    if _is_ip(address) or HOST_NAME_RE.match(address):
        return address
    raise SeedError("%s must be an IP address or a host name (letters, digits, _ . and -), got %r" % (what, address))


def authorized_key_line(public_key, source_dir, from_address=None, expiry=None, comment="",
                        rrsync="/usr/bin/rrsync"):
    """One authorized_keys line: this key may only rsync ``source_dir`` read-only, from ``from_address`` when it is
    an IP (a name is checked but not bound: sshd matches names only with UseDNS, and the controller's answer for a
    name need not be what the source sees), until ``expiry`` (OpenSSH's ``YYYYMMDDHHMM``, the source's local time; a
    trailing ``Z`` means UTC, which sshd understands from OpenSSH 8.7 on)."""
    key = " ".join(str(public_key).split()[:2])
    if not PUBLIC_KEY_RE.match(key):
        raise SeedError("not an OpenSSH public key: %r" % str(public_key)[:60])
    check_seed_path(source_dir, "the model directory")
    check_seed_path(rrsync, "the rrsync path")
    options = ['command="%s -ro %s"' % (rrsync, source_dir.rstrip("/") + "/"), "restrict"]
    if from_address and _is_ip(check_host_address(from_address, "a puller's address")):
        options.append('from="%s"' % ipaddress.ip_address(from_address))
    if expiry:
        if not re.match(r"^\d{12}Z?\Z", expiry):
            raise SeedError("expiry must be YYYYMMDDHHMM (local time of the source) or YYYYMMDDHHMMZ, got %r" % expiry)
        options.append('expiry-time="%s"' % expiry)
    safe_comment = re.sub(r"[^A-Za-z0-9._@:+-]", "_", comment)
    return ("%s %s %s" % (",".join(options), key, safe_comment)).rstrip()


def host_address(address, port):
    """How ssh's known_hosts names ``address`` at ``port``."""
    address, port = check_host_address(address, "a source's address"), int(port)
    return address if port == 22 else "[%s]:%d" % (address, port)


def known_hosts_line(address, port, host_public_key):
    key = " ".join(str(host_public_key).split()[:2])
    if not PUBLIC_KEY_RE.match(key):
        raise SeedError("not an OpenSSH host key of %s: %r" % (address, str(host_public_key)[:60]))
    return "%s %s" % (host_address(address, port), key)


def ssh_command(identity_file, known_hosts_file, port, connect_timeout_s=10, ssh="ssh"):
    """The remote shell rsync uses: only the per-rollout key, only the source's known host key, no prompts."""
    return " ".join(shlex.quote(part) for part in [
        ssh, "-F", "/dev/null", "-i", identity_file, "-p", str(int(port)), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=%s" % known_hosts_file,
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=%d" % int(connect_timeout_s),
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"])


def copy_list(manifest):
    """What a copy asks a source for: the manifest's files, and the hub original of each, which a source that patched
    the file keeps under ``ORIGINALS_RELDIR`` (absent ones are skipped). Nothing else: no patch record, no manifest,
    no file the commit lacks, no symlink."""
    paths = [entry["path"] for entry in manifest["files"]]
    return paths + ["%s/%s" % (ORIGINALS_RELDIR, path) for path in paths]


def rsync_argv(user, address, port, dest, identity_file, known_hosts_file, bwlimit_kbps=0, io_timeout_s=60,
               connect_timeout_s=10, rsync="rsync", ssh="ssh", files_from=None):
    """rsync pulling the files listed in ``files_from`` (copy_list) from the source's model directory into ``dest``:
    files already there are left (they are verified after), a partial file is kept and resumed from the next source,
    and each finished file is named on stdout with the bytes it took (``%b`` makes rsync print the line after the
    transfer, not before)."""
    if not SEED_USER_RE.match(str(user)):
        raise SeedError("the seed user must be a plain user name, got %r" % user)
    host = "[%s]" % address if ":" in str(address) else str(address)
    argv = [rsync, "--times", "--chmod=D0755,F0644", "--ignore-existing", "--ignore-missing-args",
            "--partial-dir=%s" % PARTIAL_DIR, "--out-format=%s%%b %%n" % DONE_PREFIX, "--stats",
            "--timeout=%d" % int(io_timeout_s)]
    if files_from:
        argv.append("--files-from=%s" % files_from)
    if int(bwlimit_kbps) > 0:
        argv.append("--bwlimit=%d" % int(bwlimit_kbps))
    argv += ["--rsh", ssh_command(identity_file, known_hosts_file, port, connect_timeout_s, ssh),
             "%s@%s:/" % (user, host), dest.rstrip("/") + "/"]
    return argv


def parse_stats(text):
    """Byte and file counts of rsync's ``--stats`` (numbers with thousands separators); absent ones are 0."""
    figures = {}
    for key, label in _STATS.items():
        match = re.search(r"^%s: ([\d,.]+)" % re.escape(label), text, re.M)
        figures[key] = int(re.sub(r"[,.]", "", match.group(1))) if match else 0
    return figures


def finished_files(text):
    """{path: bytes sent for it} of the files rsync finished (its ``--out-format`` lines), directories left out."""
    files = {}
    for line in text.splitlines():
        if not line.startswith(DONE_PREFIX):
            continue
        sent, _space, name = line[len(DONE_PREFIX):].partition(" ")
        if name and not name.endswith("/") and sent.isdigit():
            files[name] = int(sent)
    return files


def _mb(nbytes):
    return "%.1f MB" % (nbytes / 1e6) if nbytes >= 100000 else "%d kB" % round(nbytes / 1e3) if nbytes >= 1000 \
        else "%d B" % nbytes


def host_record(host, part, copies=None, fetched=None, fallback=None, bad_named=None):
    """Where ``host``'s copy came from, for the rollout report.

    part -- its part in the seeding (target, holder, none); copies -- its rounds ({round, verified, attempts,
    seconds}); fetched -- model_fetch's result when it downloaded from the hub; fallback -- why it did;
    bad_named -- what it sent that failed verification elsewhere (when it was a bad source).
    """
    copies, bad_named = copies or [], bad_named or []
    if part == "none":
        return {"host": host, "how": "takes no part (shares storage, or off)", "bytes_by_source": {}, "seconds": 0.0,
                "sources_text": "-", "detail": "-"}
    if fetched and str(fetched.get("check_mode")).lower() == "true":
        missing = int(fetched.get("bytes_to_download") or 0)
        return {"host": host, "how": "check mode: nothing fetched", "bytes_by_source": {}, "seconds": 0.0,
                "sources_text": "-", "detail": "would fetch %s (from the hub or a peer)" % _mb(missing)}
    bytes_by_source, seconds, parts = {}, 0.0, []
    for copy in copies:
        seconds += float(copy.get("seconds") or 0)
        for attempt in copy.get("attempts") or []:
            sent = int(attempt.get("bytes") or 0)
            bytes_by_source[attempt["source"]] = bytes_by_source.get(attempt["source"], 0) + sent
            parts.append("%s from %s in %.1f s (round %d, %s)" % (
                _mb(sent), attempt["source"], float(attempt.get("seconds") or 0), copy["round"], attempt["result"]))
    if fetched:
        hub_bytes = int(fetched.get("bytes_downloaded") or 0)
        bytes_by_source["hub"] = bytes_by_source.get("hub", 0) + hub_bytes
        hub_seconds = float(fetched.get("seconds") or 0) + float(fetched.get("verify_seconds") or 0)
        seconds += hub_seconds
        parts.append("%s from the hub in %.1f s%s" % (_mb(hub_bytes), hub_seconds,
                                                      " (fallback: %s)" % fallback if fallback else ""))
    if copies and copies[-1].get("verified") or fetched:
        how = "hub" if fetched and not fallback else ("hub fallback" if fetched else "peers")
    elif part == "holder":
        how, parts = "held a verified copy", parts or ["nothing copied"]
    elif part == "target" and not copies:
        how, parts = "its copy was already there and verified", ["nothing copied"]
    else:
        how = "not verified"
    if bad_named:
        parts.append("sent bad data: %s" % ", ".join(bad_named))
    return {"host": host, "how": how, "bytes_by_source": bytes_by_source, "seconds": round(seconds, 1),
            "sources_text": ", ".join("%s: %s" % (source, _mb(sent)) for source, sent in bytes_by_source.items()) or "-",
            "detail": "; ".join(parts) or "-"}
