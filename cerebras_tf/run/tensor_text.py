"""TensorFlow's text form of a tensor, in numpy: what tf.Assert's message and tf.print show.

The host formats the values a step streams off the wafer exactly as TF's C++
kernels would (`Tensor::SummarizeValue`), so a failing assertion's message and
a tf.print line read the same on the simulated WSE as on CPU:

- style "v1" (Assert, tf.compat.v1.Print): elements in row-major order up to
  `summarize`, rows in brackets with no separators ("[[6 5][4...]...]");
- style "v2" (tf.print / StringFormat): numpy-like nesting with the first and
  last `summarize` entries of each dimension ("[[1 2]\\n [3 4]]", "[0 1 2 ... 7 8 9]").

Elements: float32/float16/bfloat16 as C's "%.6g", or "%.9g" when six digits do
not read back as the same float (0.333333343); float64 "%.15g" / "%.17g";
bools 1/0; strings C-escaped (and quoted in v2). A negative `summarize` shows
every element. (TF flushes float32 denormals to zero before printing some
values; the host prints them as they are.)
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np

Style = Literal["v1", "v2"]
_ESCAPES = {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord('"'): '\\"', ord("'"): "\\'",
            ord("\\"): "\\\\"}


def summarize_value(value: Any, summarize: int, style: Style) -> str:
    """TF's Tensor::SummarizeValue(summarize, print_v2=(style == "v2")) of a numpy array (or scalar/bytes)."""
    array = np.asarray(value)
    count = array.size
    limit = count if summarize < 0 else min(summarize, count)
    flat = array.reshape(-1)
    if limit == 0 and array.dtype.kind == "b":
        return ""  # TF's bool case reads no data when nothing is shown, and writes nothing

    def element(index: int) -> str:
        return format_element(flat[index], array.dtype, style)

    if array.ndim == 0:
        text = " ".join(element(i) for i in range(limit))
        return text + ("..." if count > limit else "")
    if style == "v2":
        return _one_dim_v2(list(array.shape), 0, limit, 0, element)
    parts: list[str] = []
    _one_dim_v1(list(array.shape), 0, limit, [0], element, parts)
    return "".join(parts) + ("..." if count > limit else "")


def format_element(item: Any, dtype: np.dtype, style: Style) -> str:
    """One element as TF's PrintOneElement writes it."""
    if dtype.kind in "SUO":
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogateescape")
        text = c_escape(raw)
        return f'"{text}"' if style == "v2" else text
    if dtype.kind == "b":
        return "1" if item else "0"
    if dtype.kind in "iu":
        return str(int(item))
    if dtype.kind == "f" or "float" in dtype.name:  # bfloat16 (ml_dtypes) too
        if dtype == np.float64:
            return _float_text(float(item), 15, 17, np.float64)
        return _float_text(float(item), 6, 9, np.float32)  # float16 and bfloat16 print as float
    return str(item)


def c_escape(raw: bytes) -> str:
    """absl::Utf8SafeCEscape: \\n \\r \\t \\" \\' \\\\ escaped, other control bytes as octal, UTF-8 kept."""
    out = bytearray()
    for byte in raw:
        if byte in _ESCAPES:
            out += _ESCAPES[byte].encode()
        elif byte < 0x20 or byte == 0x7F:
            out += f"\\{byte:03o}".encode()
        else:
            out.append(byte)
    return out.decode("utf-8", "replace")


def _float_text(value: float, digits: int, more_digits: int, kind: Any) -> str:
    """FloatToBuffer / DoubleToBuffer: "%.{digits}g", or more digits when that does not read back exactly."""
    if np.isnan(value):
        return "-nan" if np.signbit(value) else "nan"
    if np.isinf(value):
        return "-inf" if value < 0 else "inf"
    text = f"%.{digits}g" % value
    if kind(float(text)) != kind(value):
        text = f"%.{more_digits}g" % value
    return text


def _one_dim_v1(shape: list[int], dim: int, limit: int, index: list[int], element: Any, out: list[str]) -> None:
    """PrintOneDim: row-major elements up to `limit`; `index` is the running element index."""
    if index[0] >= limit:
        return
    count = shape[dim]
    if dim == len(shape) - 1:
        for i in range(count):
            if index[0] >= limit:
                if dim != 0:
                    out.append("...")
                return
            if i > 0:
                out.append(" ")
            out.append(element(index[0]))
            index[0] += 1
        return
    for _ in range(count):
        opened = index[0] < limit
        if opened:
            out.append("[")
        _one_dim_v1(shape, dim + 1, limit, index, element, out)
        if index[0] < limit or opened:
            out.append("]")


def _one_dim_v2(shape: list[int], dim: int, at_ends: int, start: int, element: Any) -> str:
    """PrintOneDimV2: the first and last `at_ends` entries of each dimension, numpy-style spacing."""
    if dim == len(shape):
        return element(start)
    count = shape[dim]
    per_entry = int(np.prod(shape[dim + 1:], dtype=np.int64))
    spacing = " " if dim == len(shape) - 1 else "\n" * (len(shape) - dim - 1) + " " * (dim + 1)
    text = "["
    for i in range(min(at_ends, count)):
        text += (spacing if i > 0 else "") + _one_dim_v2(shape, dim + 1, at_ends, start + per_entry * i, element)
    if count > 2 * at_ends:
        text += spacing + "..."
    for i in range(max(at_ends, count - at_ends), count):
        text += spacing + _one_dim_v2(shape, dim + 1, at_ends, start + per_entry * i, element)
    return text + "]"
