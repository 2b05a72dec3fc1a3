# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test bed only: every AnsiballZ payload of the test suite's runs carries its Python files' bytecode beside them.

A module run on a test host imports ansible-core's and the collection's module_utils from the payload's zip, whose
files are source: Python compiles about 60 of them at every run, 60 ms of a trivial module's 160 ms of CPU on this
box (docs/testbed.md), for each of the suite's ~5,000 module runs. Beside each `X.py` of the zip this callback writes
`X.pyc`: the same file compiled by the controller's Python, as a checked hash-based pyc (PEP 552), which zipimport
uses only when the source's hash in the pyc matches the `X.py` beside it and the Python's magic number matches;
otherwise it compiles the source as before. The code that runs is compiled from the same source; what differs is the
file name its code objects carry (`ansible/module_utils/basic.py`, not the payload's path on the host): tracebacks of
module runs name that, and ansible-core cannot tell which plugin a deprecation warning raised in such code came from.
Enabled by tools/run-tests.sh (`make test`, CI) through ANSIBLE_CALLBACK_PLUGINS and LLMFLEET_ANSIBALLZ_BYTECODE=1,
never by anything in roles/ or playbooks/; its payloads are cached apart (shared_ansiballz_cache's key names it)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: ansiballz_bytecode
type: aggregate
short_description: add checked hash-based bytecode to AnsiballZ payloads (test bed only)
description:
  - Beside every Python file an AnsiballZ payload holds, writes its bytecode compiled by the controller's Python as a
    checked hash-based pyc, which zipimport uses in place of compiling the source when hash and magic number match.
  - Does nothing unless LLMFLEET_ANSIBALLZ_BYTECODE=1.
"""

import importlib.util
import marshal
import os
import types
import zipfile

from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase

# PEP 552 flags: hash-based (bit 0) and checked against the source (bit 1).
CHECKED_HASH = 0b11


def bytecode_of(source: bytes, filename: str) -> bytes:
    """A checked hash-based pyc of source, as importlib writes one."""
    code = compile(source, filename, "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + CHECKED_HASH.to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(code))


class BytecodeZipFile(zipfile.ZipFile):
    """A ZipFile that writes X.pyc beside every X.py given to writestr."""

    def writestr(self, zinfo_or_arcname, data, *args, **kwargs):
        super().writestr(zinfo_or_arcname, data, *args, **kwargs)
        name = getattr(zinfo_or_arcname, "filename", zinfo_or_arcname)
        if not name.endswith(".py"):
            return
        source = data.encode() if isinstance(data, str) else bytes(data)
        try:
            pyc = bytecode_of(source, name)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # zipimport compiles it, and reports the error, as without this callback
        info = zipfile.ZipInfo(name + "c", getattr(zinfo_or_arcname, "date_time", (1980, 1, 1, 0, 0, 0)))
        info.compress_type = getattr(zinfo_or_arcname, "compress_type", self.compression)
        super().writestr(info, pyc)


def enabled() -> bool:
    return os.environ.get("LLMFLEET_ANSIBALLZ_BYTECODE") == "1"


def install() -> None:
    """Payloads built from now on (in this process and the workers it forks) carry bytecode."""
    shim = types.ModuleType("zipfile")
    shim.__dict__.update(zipfile.__dict__)
    shim.ZipFile = BytecodeZipFile
    module_common.zipfile = shim


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_bytecode"
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_start(self, playbook):
        if enabled():
            install()
