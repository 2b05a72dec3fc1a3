"""The stdlib safetensors and GGUF header readers against the reference libraries on the same files."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from ansible_collections.llmfleet.vllm.plugins.module_utils.gguf import (
    GGUFError, inspect_gguf, missing_split_parts, parse_split_name)
from ansible_collections.llmfleet.vllm.plugins.module_utils.safetensors_header import (
    SafetensorsHeaderError, check_tensor_layout, inspect_safetensors, read_header)
from model_builders import build_gguf_model

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
          np.uint32, np.int64, np.uint64, np.bool_, np.complex64]


def test_safetensors_header_matches_safe_open(tmp_path):
    path = str(tmp_path / "all.safetensors")
    rng = np.random.default_rng(1)
    tensors = {"t_%s" % np.dtype(dt).name: (rng.standard_normal((3, 5, 2)) * 10).astype(dt) for dt in DTYPES}
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    save_file(tensors, path, metadata={"format": "pt", "note": "x"})

    names = inspect_safetensors(path)
    _length, header, _size = read_header(path)
    with safe_open(path, framework="numpy") as reference:
        assert sorted(names) == sorted(reference.keys())
        assert header["__metadata__"] == reference.metadata()
        for name in reference.keys():
            info = reference.get_slice(name)
            assert header[name]["dtype"] == info.get_dtype()
            assert header[name]["shape"] == info.get_shape()


def _header_only_file(path, header, data_size):
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + b"\0" * data_size)


@pytest.mark.parametrize("offsets, reason", [
    ([[0, 16], [8, 24]], "overlaps"),
    ([[0, 16], [20, 36]], "gap"),
    ([[4, 20], [20, 36]], "gap"),
])
def test_layout_faults_rejected_like_safetensors(tmp_path, offsets, reason):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": offsets[0]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": offsets[1]}}
    path = str(tmp_path / "bad.safetensors")
    _header_only_file(path, header, max(end for _b, end in offsets))
    with pytest.raises(SafetensorsHeaderError, match=reason):
        inspect_safetensors(path)
    with pytest.raises(Exception):  # the reference library refuses the same file
        with safe_open(path, framework="numpy") as reference:
            for name in reference.keys():
                reference.get_tensor(name)


def test_span_must_match_dtype_times_shape():
    header = {"a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 30]}}
    with pytest.raises(SafetensorsHeaderError, match="needs 32 bytes"):
        check_tensor_layout(header, 30)


def test_sub_byte_and_unknown_dtypes():
    assert check_tensor_layout({"a": {"dtype": "F4", "shape": [10], "data_offsets": [0, 5]}}, 5) == ["a"]
    # A dtype newer than this table still gets the tiling and end checks.
    assert check_tensor_layout({"a": {"dtype": "F2_FUTURE", "shape": [7], "data_offsets": [0, 3]}}, 3) == ["a"]
    with pytest.raises(SafetensorsHeaderError) as caught:
        check_tensor_layout({"a": {"dtype": "F2_FUTURE", "shape": [7], "data_offsets": [0, 3]}}, 2)
    assert caught.value.status == "truncated"


def test_tiny_file_is_truncated(tmp_path):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsHeaderError) as caught:
        inspect_safetensors(str(path))
    assert caught.value.status == "truncated"


def test_gguf_reader_matches_gguf_py(tmp_path):
    gguf = pytest.importorskip("gguf")
    model = build_gguf_model(str(tmp_path / "g"), manifest=False)
    for name in sorted(os.listdir(model)):
        path = os.path.join(model, name)
        info = inspect_gguf(path, os.path.getsize(path))
        reference = gguf.GGUFReader(path)
        assert info["tensor_count"] == len(reference.tensors)
        assert info["data_end"] == max(t.data_offset + t.n_bytes for t in reference.tensors)
        assert info["split_count"] == int(reference.fields["split.count"].contents())
        assert info["split_no"] + 1 == parse_split_name(name)[1]


def test_gguf_header_faults(tmp_path):
    model = build_gguf_model(str(tmp_path / "g"), manifest=False)
    path = os.path.join(model, "tiny-Q8_0-00001-of-00003.gguf")
    with open(path, "r+b") as handle:
        handle.seek(4)
        handle.write(struct.pack("<I", 99))
    with pytest.raises(GGUFError, match="unsupported GGUF version 99"):
        inspect_gguf(path, os.path.getsize(path))
    os.truncate(path, 40)
    with pytest.raises(GGUFError):
        inspect_gguf(path, 40)


def test_missing_split_parts():
    present = ["a-00001-of-00003.gguf", "a-00003-of-00003.gguf", "sub/b-00002-of-00002.safetensors", "c.gguf"]
    assert missing_split_parts(present) == ["a-00002-of-00003.gguf", "sub/b-00001-of-00002.safetensors"]
    assert missing_split_parts(["a-00001-of-00001.gguf"]) == []
