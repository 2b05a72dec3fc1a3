# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stdlib-only GGUF header reader and split-file completeness check.

GGUF (v2/v3): magic ``GGUF``, uint32 version, uint64 tensor count, uint64 metadata count,
the metadata key/values, one info record per tensor (name, dims, ggml type, offset), then
the tensor data starting at the next multiple of ``general.alignment`` (default 32).
llama.cpp splits big models into ``<name>-00001-of-00003.gguf`` parts whose headers carry
``split.no`` (0-based) and ``split.count``.
"""

from __future__ import annotations

import re
import struct

from ansible_collections.llmfleet.vllm.plugins.module_utils.shard_errors import ShardError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Numbered part names, shared by llama.cpp GGUF splits and Hugging Face safetensors shards.
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})(?P<suffix>\.gguf|\.safetensors)$")

# ggml type id -> (elements per block, bytes per block), as in gguf-py GGML_QUANT_SIZES.
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
    40: (64, 36), 41: (128, 18),
}

# Metadata value type id -> struct format of a scalar; 8 = string, 9 = array.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_WANTED_KEYS = ("general.alignment", "split.no", "split.count")


class GGUFError(ShardError):
    """The file is not a readable GGUF; ``status`` is a shard_verify status."""


def parse_split_name(path):
    """Return (stem, number, count, suffix) for a part name like ``x-00002-of-00003.gguf``, else None."""
    match = SPLIT_NAME.match(path)
    if match is None:
        return None
    return match.group("stem"), int(match.group("number")), int(match.group("count")), match.group("suffix")


def split_part_name(stem, number, count, suffix=".gguf"):
    return "%s-%05d-of-%05d%s" % (stem, number, count, suffix)


def missing_split_parts(paths):
    """Names of the parts absent from ``paths`` for every numbered set that has at least one part."""
    present = {}
    for path in paths:
        parsed = parse_split_name(path)
        if parsed is not None:
            stem, number, count, suffix = parsed
            present.setdefault((stem, count, suffix), set()).add(number)
    missing = []
    for (stem, count, suffix), numbers in sorted(present.items()):
        missing.extend(split_part_name(stem, n, count, suffix) for n in range(1, count + 1) if n not in numbers)
    return missing


class _Reader:
    def __init__(self, handle, file_size):
        self.handle = handle
        self.file_size = file_size

    def read(self, size):
        data = self.handle.read(size)
        if len(data) != size:
            raise GGUFError("truncated", "GGUF header runs past end of file (%d bytes)" % self.file_size)
        return data

    def unpack(self, fmt):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def skip(self, size):
        if self.handle.tell() + size > self.file_size:
            raise GGUFError("truncated", "GGUF header runs past end of file (%d bytes)" % self.file_size)
        self.handle.seek(size, 1)

    def string_length(self):
        length = self.unpack("<Q")
        if length > self.file_size:
            raise GGUFError("header_invalid", "GGUF string length %d exceeds the file size" % length)
        return length

    def string(self):
        return self.read(self.string_length()).decode("utf-8", errors="replace")

    def value(self, value_type, keep):
        """Read (keep=True) or skip one metadata value."""
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type]) if keep else self.skip(struct.calcsize(_SCALAR_FORMATS[value_type]))
        if value_type == _STRING:
            return self.string() if keep else self.skip(self.string_length())
        if value_type == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALAR_FORMATS:
                return self.skip(count * struct.calcsize(_SCALAR_FORMATS[item_type]))
            if count > self.file_size:
                raise GGUFError("header_invalid", "GGUF array length %d exceeds the file size" % count)
            for _index in range(count):
                self.value(item_type, keep=False)
            return None
        raise GGUFError("header_invalid", "unknown GGUF metadata value type %d" % value_type)


def inspect_gguf(path, file_size):
    """Read the GGUF header of ``path`` and check that the tensor data fits the file.

    Returns a dict: version, tensor_count, split_no, split_count, data_end (None where a
    tensor has a ggml type this table does not know). Raises GGUFError.
    """
    with open(path, "rb") as handle:
        reader = _Reader(handle, file_size)
        magic = handle.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFError("header_invalid", "bad GGUF magic %r" % magic)
        version = reader.unpack("<I")
        if version not in SUPPORTED_VERSIONS:
            raise GGUFError("header_invalid", "unsupported GGUF version %d" % version)
        tensor_count, kv_count = reader.unpack("<Q"), reader.unpack("<Q")
        if tensor_count > file_size or kv_count > file_size:
            raise GGUFError("header_invalid", "GGUF counts (%d tensors, %d keys) exceed the file size"
                            % (tensor_count, kv_count))
        metadata = {}
        for _index in range(kv_count):
            key = reader.string()
            value_type = reader.unpack("<I")
            value = reader.value(value_type, keep=key in _WANTED_KEYS)
            if key in _WANTED_KEYS:
                metadata[key] = value
        data_end = 0
        for _index in range(tensor_count):
            reader.skip(reader.string_length())
            n_dims = reader.unpack("<I")
            if n_dims > 8:
                raise GGUFError("header_invalid", "GGUF tensor with %d dimensions" % n_dims)
            elements = 1
            for _dim in range(n_dims):
                elements *= reader.unpack("<Q")
            ggml_type, offset = reader.unpack("<I"), reader.unpack("<Q")
            block = GGML_BLOCK_SIZES.get(ggml_type)
            if block is None or data_end is None:
                data_end = None
                continue
            data_end = max(data_end, offset + elements // block[0] * block[1])
        header_end = handle.tell()
    alignment = metadata.get("general.alignment") or DEFAULT_ALIGNMENT
    data_start = _align(header_end, alignment)
    if data_end is not None:
        _check_data_end(data_start + data_end, file_size, alignment)
    return {
        "version": version,
        "tensor_count": tensor_count,
        "split_no": metadata.get("split.no"),
        "split_count": metadata.get("split.count"),
        "data_end": None if data_end is None else data_start + data_end,
    }


def _check_data_end(end, file_size, alignment):
    # Writers pad the last tensor up to the alignment, so either end is fine.
    if file_size < end:
        raise GGUFError("truncated", "tensor data ends at %d but the file is %d bytes (%d missing)"
                        % (end, file_size, end - file_size))
    if file_size > _align(end, alignment):
        raise GGUFError("oversize", "tensor data ends at %d but the file is %d bytes (%d trailing)"
                        % (end, file_size, file_size - end))


def _align(offset, alignment):
    return offset + (-offset % alignment)


def check_split_metadata(path, info):
    """Compare split.no/split.count in the header with the part's file name."""
    parsed = parse_split_name(path.rsplit("/", 1)[-1])
    if parsed is None or info["split_count"] is None:
        return
    _stem, number, count, _suffix = parsed
    if info["split_count"] != count or (info["split_no"] is not None and info["split_no"] + 1 != number):
        raise GGUFError("header_invalid", "header says part %s of %d but the file name says %d of %d"
                        % (None if info["split_no"] is None else info["split_no"] + 1,
                           info["split_count"], number, count))
