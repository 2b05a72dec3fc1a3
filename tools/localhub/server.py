"""TEST FIXTURE: a local stand-in for the Hugging Face Hub, serving model repos from folders.

Not a Hub implementation. It answers exactly the endpoints that huggingface_hub 2.4.0 calls for
model_info / repo_info, list_repo_tree, snapshot_download and hf_hub_download, so that tests can
run the real client with HF_ENDPOINT=http://127.0.0.1:PORT where no Hub is reachable:

    GET       /api/models/ORG/NAME[/revision/REV]?blobs=true   model info with siblings
    GET       /api/models/ORG/NAME/tree/REV[/PATH]?recursive=   file listing (one page)
    HEAD/GET  /ORG/NAME/resolve/REV/PATH                        file, with Range (206) support
    GET|POST  /_fixture/faults         read / replace the fault plan (see hub_faults.py)
    GET|DELETE /_fixture/requests      read / clear the log of requests served

Repos are ROOT/ORG/NAME/ folders; REV is "main", the repo's commit sha, or an earlier commit kept in ROOT/.history
(see hub_repos.py).

    python tools/localhub/server.py --root DIR [--host 127.0.0.1] [--port 0] [--faults FILE]
"""
import argparse
import json
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hub_faults import FaultPlan, Uplink  # noqa: E402
from hub_repos import RepoStore  # noqa: E402

CHUNK_SIZE = 64 * 1024
# Fixed dates: the Hub returns them, the client parses them, nothing here depends on them.
FIXED_DATE = "2026-01-01T00:00:00.000Z"
RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


class HubError(Exception):
    """An error answer in the Hub's shape: the client maps X-Error-Code to its exception classes."""

    def __init__(self, status, code, message, headers=None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class RequestLog:
    def __init__(self):
        self._entries = []
        self._lock = threading.Lock()

    def add(self, entry):
        with self._lock:
            self._entries.append(entry)
        return entry

    def entries(self):
        with self._lock:
            return [dict(e) for e in self._entries]

    def clear(self):
        with self._lock:
            self._entries.clear()


def parse_range(header, size):
    """(start, end_exclusive) for a single-range "bytes=" header, None without one.

    Raises HubError 416 when the range cannot be satisfied.
    """
    if not header:
        return None
    match = RANGE_RE.match(header.strip())
    if not match or match.groups() == ("", ""):
        raise HubError(416, None, f"unsupported Range {header!r}", {"Content-Range": f"bytes */{size}"})
    first, last = match.groups()
    if first == "":  # suffix range: the last N bytes
        start, end = max(size - int(last), 0), size
    else:
        start = int(first)
        end = size if last == "" else min(int(last) + 1, size)
    if start >= size or start >= end:
        raise HubError(416, None, f"Range {header!r} not satisfiable", {"Content-Range": f"bytes */{size}"})
    return start, end


def sibling(repo_file):
    entry = {"rfilename": repo_file.path, "size": repo_file.size, "blobId": repo_file.blob_id}
    if repo_file.is_lfs:
        entry["lfs"] = {"sha256": repo_file.sha256, "size": repo_file.size, "pointerSize": repo_file.lfs_pointer_size}
    return entry


def tree_entry(repo_file):
    entry = {"type": "file", "path": repo_file.path, "size": repo_file.size, "oid": repo_file.blob_id}
    if repo_file.is_lfs:
        entry["lfs"] = {"oid": repo_file.sha256, "size": repo_file.size, "pointerSize": repo_file.lfs_pointer_size}
    return entry


def model_config(snapshot):
    config_file = snapshot.files.get("config.json")
    if config_file is None:
        return None
    try:
        with open(config_file.abspath, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    return {k: config[k] for k in ("architectures", "model_type") if k in config}


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmfleet-localhub-fixture"

    # -- dispatch -----------------------------------------------------------------------------
    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method):
        url = urlsplit(self.path)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        entry = self.server.request_log.add({
            "method": method, "path": unquote(url.path), "range": self.headers.get("Range"),
            "authorization": self.headers.get("Authorization") is not None,
            "status": None, "bytes_sent": 0, "faults": [], "done": False,
        })
        self._log_entry = entry
        try:
            self._route(method, segments, query, entry)
        except HubError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:  # a fixture bug must show up as a 500, not a hung client
            self._send_error(HubError(500, None, f"fixture error: {error!r}"))
            raise
        finally:
            entry["done"] = True

    def _route(self, method, segments, query, entry):
        if segments[:1] == ["_fixture"]:
            return self._fixture(method, segments[1:])
        if segments[:2] == ["api", "models"] and len(segments) >= 4 and method == "GET":
            repo_id = "/".join(segments[2:4])
            entry["repo"] = repo_id
            rest = segments[4:]
            if not rest:
                return self._model_info(repo_id, "main", query)
            if rest[0] == "revision" and len(rest) == 2:
                return self._model_info(repo_id, rest[1], query)
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo_id, rest[1], "/".join(rest[2:]).strip("/"), query)
        if len(segments) >= 5 and segments[2] == "resolve" and method in ("HEAD", "GET"):
            repo_id, revision, path = "/".join(segments[:2]), segments[3], "/".join(segments[4:])
            entry.update(repo=repo_id, file=path)
            return self._resolve(method, repo_id, revision, path, entry)
        raise HubError(404, None, f"no route for {method} {self.path}")

    # -- Hub API --------------------------------------------------------------------------------
    def _snapshot(self, repo_id, revision):
        snapshot = self.server.store.snapshot(repo_id, revision)
        if snapshot is None:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        if not snapshot.revision_matches(revision):
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return snapshot

    def _api_faults(self, repo_id):
        status = self.server.faults.repo_faults(repo_id).get("api_status")
        if status:
            self._log_entry["faults"].append("api_status")
            raise HubError(status, None, f"injected fault: status {status}")

    def _model_info(self, repo_id, revision, query):
        self._api_faults(repo_id)
        snapshot = self._snapshot(repo_id, revision)
        with_blobs = query.get("blobs", ["false"])[0].lower() == "true"
        files = snapshot.files.values()
        org = repo_id.split("/")[0]
        info = {
            "_id": snapshot.commit[:24], "id": repo_id, "modelId": repo_id, "author": org,
            "sha": snapshot.commit, "lastModified": FIXED_DATE, "createdAt": FIXED_DATE,
            "private": False, "disabled": False,
            "gated": "manual" if self.server.faults.repo_faults(repo_id).get("token") else False,
            "downloads": 0, "likes": 0, "tags": [], "library_name": "transformers",
            "siblings": [sibling(f) if with_blobs else {"rfilename": f.path} for f in files],
            "usedStorage": sum(f.size for f in files),
        }
        config = model_config(snapshot)
        if config:
            info["config"] = config
        self._send_json(200, info)

    def _tree(self, repo_id, revision, prefix, query):
        self._api_faults(repo_id)
        snapshot = self._snapshot(repo_id, revision)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        base = f"{prefix}/" if prefix else ""
        if prefix and not any(p.startswith(base) for p in snapshot.files):
            raise HubError(404, "EntryNotFound", f"{prefix} does not exist on {revision}",
                           {"X-Repo-Commit": snapshot.commit})
        entries, folders = [], set()
        for path, repo_file in snapshot.files.items():
            if not path.startswith(base):
                continue
            parts = path[len(base):].split("/")
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folders.add(base + "/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                entries.append(tree_entry(repo_file))
        entries += [{"type": "directory", "path": d, "oid": "0" * 40} for d in sorted(folders)]
        self._send_json(200, entries)

    def _resolve(self, method, repo_id, revision, path, entry):
        snapshot = self._snapshot(repo_id, revision)
        repo_file = snapshot.files.get(path)
        if repo_file is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {revision}",
                           {"X-Repo-Commit": snapshot.commit})
        self._check_token(repo_id)
        faults = self.server.faults.file_faults(repo_id, path)
        if self.server.faults.take(repo_id, path, faults, "status"):
            entry["faults"].append("status")
            status = faults["status"][1]
            raise HubError(status, None, f"injected fault: status {status}")
        byte_range = parse_range(self.headers.get("Range"), repo_file.size)
        start, end = byte_range or (0, repo_file.size)
        headers = {
            "ETag": f'"{repo_file.etag}"', "X-Repo-Commit": snapshot.commit,
            "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start),
        }
        if repo_file.is_lfs:
            headers.update({"X-Linked-Etag": f'"{repo_file.sha256}"', "X-Linked-Size": str(repo_file.size)})
        if byte_range:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{repo_file.size}"
        self._send_head(206 if byte_range else 200, headers)
        if method == "GET":
            drop = self.server.faults.take(repo_id, path, faults, "drop")
            entry["faults"] += [k for k, on in (("corrupt", faults.get("corrupt", (0, False))[1]), ("drop", drop),
                                                ("rate", "rate" in faults)) if on]
            self._stream(repo_file, start, end, faults, drop, entry)

    def _check_token(self, repo_id):
        token = self.server.faults.repo_faults(repo_id).get("token")
        if not token:
            return
        sent = self.headers.get("Authorization")
        if sent is None:
            raise HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                           "and be authenticated to access it. Please log in.")
        if sent != f"Bearer {token}":
            raise HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                           "authorized list.")

    def _stream(self, repo_file, start, end, faults, drop, entry):
        """Send file bytes [start, end), applying corruption, rate limit and connection drop."""
        corrupt_at = None
        if faults.get("corrupt", (None, False))[1] and repo_file.size:
            corrupt_at = faults.get("corrupt_offset", (None, repo_file.size // 2))[1]
        stop = min(end, max(start, faults["drop_at"][1])) if drop else end
        rate = faults.get("rate", (None, None))[1]
        uplink_rate = self.server.faults.uplink_rate()
        slowest = min(r for r in (rate, uplink_rate, CHUNK_SIZE * 20) if r)
        chunk_size = max(1, min(CHUNK_SIZE, slowest // 20))
        began = time.monotonic()
        with open(repo_file.abspath, "rb") as handle:
            handle.seek(start)
            pos = start
            while pos < stop:
                data = bytearray(handle.read(min(chunk_size, stop - pos)))
                if not data:
                    break  # the file shrank under us
                if corrupt_at is not None and pos <= corrupt_at < pos + len(data):
                    data[corrupt_at - pos] ^= 0xFF
                self.wfile.write(data)
                pos += len(data)
                entry["bytes_sent"] += len(data)
                if rate:
                    time.sleep(max(0.0, began + (pos - start) / rate - time.monotonic()))
                if uplink_rate:
                    self.server.uplink.wait_for(len(data), uplink_rate, time.monotonic, time.sleep)
        if stop < end:  # a killed transfer: the client sees a body shorter than Content-Length
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    # -- fixture control ------------------------------------------------------------------------
    def _fixture(self, method, rest):
        if rest == ["faults"] and method == "GET":
            return self._send_json(200, self.server.faults.current())
        if rest == ["faults"] and method == "POST":
            try:
                self.server.faults.replace(json.loads(self._read_body() or b"{}"))
            except ValueError as error:
                raise HubError(400, None, str(error)) from error
            return self._send_json(200, self.server.faults.current())
        if rest == ["requests"] and method == "GET":
            return self._send_json(200, self.server.request_log.entries())
        if rest == ["requests"] and method == "DELETE":
            self.server.request_log.clear()
            return self._send_json(200, [])
        raise HubError(404, None, f"no fixture route {method} {self.path}")

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- responses ------------------------------------------------------------------------------
    def _send_head(self, status, headers):
        if self._log_entry["status"] is not None:
            raise RuntimeError("response already started")
        self._log_entry["status"] = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, status, payload, headers=None):
        body = json.dumps(payload).encode()
        self._send_head(status, {"Content-Type": "application/json", "Content-Length": str(len(body)),
                                 **(headers or {})})
        if self.command != "HEAD":
            self.wfile.write(body)
            self._log_entry["bytes_sent"] += len(body)

    def _send_error(self, error):
        if self._log_entry["status"] is not None:  # failed mid-body: the client must see a broken transfer
            self.close_connection = True
            return
        if self.command in ("POST", "DELETE"):
            self.close_connection = True  # an unread request body would desync keep-alive
        headers = dict(error.headers)
        if error.code:
            headers["X-Error-Code"] = error.code
        headers["X-Error-Message"] = error.message
        self._send_json(error.status, {"error": error.message}, headers)

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        if self.server.verbose:
            super().log_message(format, *args)


class LocalHubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, root, faults_file=None, verbose=False):
        super().__init__(address, HubRequestHandler)
        self.store = RepoStore(root)
        self.faults = FaultPlan(faults_file)
        self.uplink = Uplink()
        self.request_log = RequestLog()
        self.verbose = verbose


class LocalHub:
    """In-process handle for tests: `with LocalHub(root) as hub:` serves on hub.url (ephemeral port)."""

    def __init__(self, root, host="127.0.0.1", port=0, faults_file=None):
        self._args = ((host, port), root, faults_file)
        self.server = None
        self._thread = None

    def start(self):
        self.server = LocalHubServer(*self._args)
        self._thread = threading.Thread(target=self.server.serve_forever, name="localhub", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self._thread.join()
            self.server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self):
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def set_faults(self, plan):
        self.server.faults.replace(plan)

    def requests(self):
        return self.server.request_log.entries()

    def clear_requests(self):
        self.server.request_log.clear()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="folder holding ORG/NAME/ repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: pick a free port (printed on start)")
    parser.add_argument("--faults", help="JSON fault plan, re-read whenever it changes")
    parser.add_argument("--quiet", action="store_true", help="no access log on stderr")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root} is not a directory")
    server = LocalHubServer((args.host, args.port), args.root, args.faults, verbose=not args.quiet)
    host, port = server.server_address[:2]
    print(f"localhub fixture serving {os.path.abspath(args.root)} on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
