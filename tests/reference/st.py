"""st.py - a minimal safetensors reader and writer on numpy alone.

The format: an 8-byte little-endian unsigned header length N, then N bytes of
JSON (padded with spaces to a multiple of 8), then the tensor data. The JSON
maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
(offsets relative to the start of the data), plus an optional
"__metadata__" object of string to string. Data are little-endian, row-major.

    tensors, metadata = load(path)          # {name: np.ndarray}, {str: str}
    save(path, tensors, metadata=None)

BF16 (and F16) tensors are read as float32, so that callers see one float
type; F32, F64, I32 and I64 are read as they are.
"""

import json
import struct

import numpy as np

# safetensors dtype -> numpy dtype as stored (little-endian).
_READ = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 below
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# numpy dtype -> safetensors dtype, for writing.
_WRITE = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("int16"): "I16",
    np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8",
    np.dtype("bool"): "BOOL",
}


class FormatError(Exception):
    pass


def _bf16_to_f32(raw):
    return (raw.astype(np.uint32) << 16).view(np.float32)


def load(path):
    """Read a safetensors file: ({name: ndarray}, {key: value})."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise FormatError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n :]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}: tensor '{name}': malformed entry {info!r}") from None
        if dtype not in _READ:
            raise FormatError(f"{path}: tensor '{name}': unsupported dtype {dtype}")
        np_dtype = _READ[dtype]
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= begin <= end <= len(data)) or end - begin != count * np_dtype.itemsize:
            raise FormatError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not fit "
                f"{dtype}{shape} in {len(data)} bytes of data"
            )
        arr = np.frombuffer(data[begin:end], dtype=np_dtype, count=count).reshape(shape)
        if dtype == "BF16":
            arr = _bf16_to_f32(arr).reshape(shape)
        elif dtype == "F16":
            arr = arr.astype(np.float32)
        else:
            arr = arr.astype(np_dtype.newbyteorder("="), copy=True)
        tensors[name] = arr
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def save(path, tensors, metadata=None):
    """Write {name: ndarray} (in the dict's order) and optional string metadata."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        arr = arr.astype(arr.dtype.newbyteorder("="), copy=False)
        if arr.dtype not in _WRITE:
            raise FormatError(f"tensor '{name}': cannot write numpy dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": _WRITE[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
