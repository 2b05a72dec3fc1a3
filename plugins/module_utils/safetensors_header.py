# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stdlib-only reader and consistency check of a safetensors file header.

Layout: 8-byte little-endian unsigned header length N, N bytes of JSON
(``{"tensor": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data area. Offsets are relative to the start of the data area.
Only the header is read, so checking a shard costs two small reads.
"""

from __future__ import annotations

import json
import os
import struct

from ansible_collections.llmfleet.vllm.plugins.module_utils.shard_errors import ShardError

HEADER_LENGTH_BYTES = 8
# The safetensors library refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# Bits per element; sub-byte types (F4, F6_*) are packed.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}


class SafetensorsHeaderError(ShardError):
    """The header is unreadable or inconsistent; ``status`` is a shard_verify status."""


def read_header(path):
    """Return (header_length, header_dict, file_size) of the safetensors file at ``path``."""
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(HEADER_LENGTH_BYTES)
        if len(prefix) < HEADER_LENGTH_BYTES:
            raise SafetensorsHeaderError(
                "truncated", "file is %d bytes, shorter than the 8-byte header length" % file_size)
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > MAX_HEADER_BYTES:
            raise SafetensorsHeaderError(
                "header_invalid", "header length %d exceeds the %d byte limit" % (header_length, MAX_HEADER_BYTES))
        if HEADER_LENGTH_BYTES + header_length > file_size:
            raise SafetensorsHeaderError(
                "header_invalid",
                "header length %d points past end of file (file is %d bytes)" % (header_length, file_size))
        raw = handle.read(header_length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorsHeaderError("header_invalid", "header is not valid JSON: %s" % exc) from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError("header_invalid", "header JSON is not an object")
    return header_length, header, file_size


def tensor_nbytes(dtype, shape):
    """Bytes a tensor of ``dtype``/``shape`` occupies, or None for a dtype this table does not know."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    elements = 1
    for dim in shape:
        elements *= dim
    total_bits = elements * bits
    if total_bits % 8:
        raise SafetensorsHeaderError(
            "header_invalid", "%d elements of %s do not fill whole bytes" % (elements, dtype))
    return total_bits // 8


def check_tensor_layout(header, data_size):
    """Check every tensor's data_offsets against ``data_size`` (file size - 8 - header length).

    Tensors must tile the data area exactly: sorted by offset they start at 0, follow each
    other without gap or overlap, each span equals dtype x shape bytes, and the last one
    ends at ``data_size``. Returns the tensor names.
    """
    spans = []
    for name, info in header.items():
        if name == METADATA_KEY:
            if not isinstance(info, dict):
                raise SafetensorsHeaderError("header_invalid", "__metadata__ is not an object")
            continue
        spans.append(_tensor_span(name, info))
    spans.sort(key=lambda span: (span[0], span[1]))
    position = 0
    for begin, end, name in spans:
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else "leaves a gap before it"
            raise SafetensorsHeaderError(
                "header_invalid", "tensor %s starts at %d and %s (expected %d)" % (name, begin, kind, position))
        position = end
    if position > data_size:
        raise SafetensorsHeaderError(
            "truncated", "tensor data ends at %d but the file holds only %d data bytes (%d missing)"
            % (position, data_size, position - data_size))
    if position < data_size:
        raise SafetensorsHeaderError(
            "oversize", "tensor data ends at %d but the file holds %d data bytes (%d trailing)"
            % (position, data_size, data_size - position))
    return [name for _begin, _end, name in spans]


def _tensor_span(name, info):
    if not isinstance(info, dict):
        raise SafetensorsHeaderError("header_invalid", "tensor %s entry is not an object" % name)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise SafetensorsHeaderError("header_invalid", "tensor %s has no dtype" % name)
    if not isinstance(shape, list) or not all(_is_count(dim) for dim in shape):
        raise SafetensorsHeaderError("header_invalid", "tensor %s has an invalid shape %r" % (name, shape))
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise SafetensorsHeaderError("header_invalid", "tensor %s has invalid data_offsets %r" % (name, offsets))
    begin, end = offsets
    expected = tensor_nbytes(dtype, shape)
    # An unknown (newer) dtype still gets the tiling and end-of-file checks.
    if expected is not None and expected != end - begin:
        raise SafetensorsHeaderError(
            "header_invalid", "tensor %s: %s%r needs %d bytes but data_offsets span %d"
            % (name, dtype, shape, expected, end - begin))
    return begin, end, name


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def inspect_safetensors(path):
    """Read and check the header of ``path``; return its tensor names. Raises SafetensorsHeaderError."""
    header_length, header, file_size = read_header(path)
    data_size = file_size - HEADER_LENGTH_BYTES - header_length
    return check_tensor_layout(header, data_size)
