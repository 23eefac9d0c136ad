"""cuDNN's GRU called directly (``cudnnRNNForward``), every algorithm: the vendor at its best.

``torch.nn.GRU`` only ever runs ``CUDNN_RNN_ALGO_STANDARD`` for a float32 GRU, a bidirectional
one and any GRU on sm80+ (PyTorch's ``get_algo``), and STANDARD is 2-5x slower than the
persistent algorithms at small batch.  This module binds the libcudnn that torch loaded
through ctypes (cuDNN 9's ``cudnn_adv.h`` API), copies an ``nn.GRU``'s weights into cuDNN's
weight space, and runs the forward pass on torch's current stream, so the benchmarks' timers
(per call, back to back, CUDA graph) time it as they time torch.  Enum values are read from
the cuDNN headers where the ``nvidia-cudnn`` wheel ships them, else taken from cuDNN 9's.

    gru = CudnnGru(net, algo="PERSIST_STATIC", math="fma")   # net: a CUDA torch.nn.GRU
    out, h_n = gru(x)                                          # x: (T, B, I) on the GPU
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
from typing import Any, Sequence

ALGOS = ("STANDARD", "PERSIST_STATIC", "PERSIST_DYNAMIC", "PERSIST_STATIC_SMALL_H")
# cuDNN 9's values (cudnn_adv.h, cudnn_graph.h); replaced by the headers' where found
ENUMS = {
    "CUDNN_RNN_ALGO_STANDARD": 0, "CUDNN_RNN_ALGO_PERSIST_STATIC": 1, "CUDNN_RNN_ALGO_PERSIST_DYNAMIC": 2,
    "CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H": 3, "CUDNN_GRU": 3, "CUDNN_LSTM": 2, "CUDNN_RNN_DOUBLE_BIAS": 2,
    "CUDNN_RNN_NO_BIAS": 0,
    "CUDNN_UNIDIRECTIONAL": 0, "CUDNN_BIDIRECTIONAL": 1, "CUDNN_LINEAR_INPUT": 0,
    "CUDNN_DATA_FLOAT": 0, "CUDNN_DATA_HALF": 2, "CUDNN_DATA_BFLOAT16": 9,
    "CUDNN_DEFAULT_MATH": 0, "CUDNN_TENSOR_OP_MATH": 1, "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION": 2,
    "CUDNN_FMA_MATH": 3, "CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED": 0, "CUDNN_FWD_MODE_INFERENCE": 0,
    "CUDNN_RNN_PADDED_IO_DISABLED": 0, "CUDNN_RNN_PADDED_IO_ENABLED": 1,
}
_P = ctypes.c_void_p


class CudnnError(RuntimeError):
    """A cuDNN call failed; ``status`` is its name (``CUDNN_STATUS_NOT_SUPPORTED``: a refusal)."""

    def __init__(self, call: str, status: str):
        super().__init__(f"{call}: {status}")
        self.status = status


def _headers() -> tuple[dict[str, int], str]:
    """The enum values of the cuDNN headers next to the loaded library (the nvidia-cudnn
    wheel), and where they came from."""
    roots = []
    try:
        import nvidia.cudnn as pkg  # type: ignore[import-not-found]

        roots = list(pkg.__path__)
    except ImportError:
        pass
    values: dict[str, int] = {}
    found = []
    for root in roots + ["/usr/include", "/usr/local/cuda/include"]:
        for path in glob.glob(os.path.join(root, "include", "cudnn_*.h")) + glob.glob(os.path.join(root, "cudnn_*.h")):
            text = open(path, errors="replace").read()
            for name, value in re.findall(r"\b(CUDNN_[A-Z0-9_]+)\s*=\s*(\d+)\b", text):
                values.setdefault(name, int(value))
            found.append(path)
    if not all(name in values for name in ENUMS):
        return dict(ENUMS), "cuDNN 9 values (headers not found)"
    return {name: values[name] for name in ENUMS}, f"headers ({os.path.dirname(found[0])})"


def _libraries() -> list[ctypes.CDLL]:
    """The libcudnn libraries torch loaded (cuDNN 9: the libcudnn.so.9 shim, which exports the
    whole API, and its sub-libraries), the shim first."""
    import torch

    torch.backends.cudnn.version()  # loads it
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudnn" in line},
                       key=lambda p: (not os.path.basename(p).startswith("libcudnn.so"), p))
    libs = [ctypes.CDLL(path) for path in paths]
    if not any(hasattr(lib, "cudnnRNNForward") for lib in libs):
        for name in ("libcudnn.so.9", "libcudnn_adv.so.9"):
            try:
                libs.append(ctypes.CDLL(name))
            except OSError:
                continue
    if not any(hasattr(lib, "cudnnRNNForward") for lib in libs):
        raise CudnnError("dlopen", "no libcudnn with cudnnRNNForward in this process")
    return libs


class _Api:
    """Checked calls into cuDNN by name, each symbol taken from the first library exporting it."""

    def __init__(self) -> None:
        self.libs = _libraries()
        self.enums, self.enum_source = _headers()
        self.error_string = self._func("cudnnGetErrorString")
        self.error_string.restype = ctypes.c_char_p

    def _func(self, name: str) -> Any:
        for lib in self.libs:
            if hasattr(lib, name):
                return getattr(lib, name)
        raise CudnnError(name, "symbol not found in the loaded libcudnn")

    def __call__(self, name: str, *args: Any) -> None:
        status = self._func(name)(*args)
        if status:
            raise CudnnError(name, self.error_string(status).decode())


_API: _Api | None = None


def api() -> _Api:
    global _API
    if _API is None:
        _API = _Api()
    return _API


_DTYPES = {"float32": "CUDNN_DATA_FLOAT", "float16": "CUDNN_DATA_HALF", "bfloat16": "CUDNN_DATA_BFLOAT16"}


class CudnnGru:
    """An ``nn.GRU``'s (or an ``nn.LSTM``'s) forward through ``cudnnRNNForward`` with one algorithm.

    ``math``: "fma" (float32 without TF32: ``CUDNN_FMA_MATH``), "tf32" (float32 with TF32
    allowed: ``CUDNN_DEFAULT_MATH``), "tensor_op" (16-bit data, float32 math precision:
    ``CUDNN_TENSOR_OP_MATH``, what torch sets).  ``lengths``: each row's length (padded
    sequence-major I/O, outputs past a length zero), or None for all T.  A refusal raises
    ``CudnnError`` with its status."""

    def __init__(self, net: Any, batch: int, seq: int, algo: str = "STANDARD", math: str = "fma",
                 lengths: Sequence[int] | None = None):
        import torch

        self.a = a = api()
        e = a.enums
        self.net, self.batch, self.seq = net, batch, seq
        p = next(net.parameters())
        self.dtype = str(p.dtype).replace("torch.", "")
        self.device = p.device
        self.dirs = 2 if net.bidirectional else 1
        self.lstm = type(net).__name__ == "LSTM"  # cell mode CUDNN_LSTM: four gates, c beside h
        self.gates = 4 if self.lstm else 3
        self.layers, self.hidden, self.input = net.num_layers, net.hidden_size, net.input_size
        data = e[_DTYPES[self.dtype]]
        math_type = {"fma": "CUDNN_FMA_MATH", "tf32": "CUDNN_DEFAULT_MATH", "tensor_op": "CUDNN_TENSOR_OP_MATH"}[math]
        self.handle = _P()
        a("cudnnCreate", ctypes.byref(self.handle))
        self.rnn = _P()
        a("cudnnCreateRNNDescriptor", ctypes.byref(self.rnn))
        padded = lengths is not None
        a("cudnnSetRNNDescriptor_v8", self.rnn, ctypes.c_int(e["CUDNN_RNN_ALGO_" + algo]),
          ctypes.c_int(e["CUDNN_LSTM" if self.lstm else "CUDNN_GRU"]),
          ctypes.c_int(e["CUDNN_RNN_DOUBLE_BIAS"] if net.bias else e["CUDNN_RNN_NO_BIAS"]),
          ctypes.c_int(e["CUDNN_BIDIRECTIONAL"] if self.dirs == 2 else e["CUDNN_UNIDIRECTIONAL"]),
          ctypes.c_int(e["CUDNN_LINEAR_INPUT"]), ctypes.c_int(data), ctypes.c_int(e["CUDNN_DATA_FLOAT"]),
          ctypes.c_int(e[math_type]), ctypes.c_int32(self.input), ctypes.c_int32(self.hidden),
          ctypes.c_int32(self.hidden), ctypes.c_int32(self.layers), _P(None),
          ctypes.c_uint32(e["CUDNN_RNN_PADDED_IO_ENABLED"] if padded else e["CUDNN_RNN_PADDED_IO_DISABLED"]))
        if algo == "PERSIST_DYNAMIC":
            a("cudnnBuildRNNDynamic", self.handle, self.rnn, ctypes.c_int(batch))
        lens = list(lengths) if padded else [seq] * batch
        self.lengths_host = (ctypes.c_int * batch)(*lens)
        self.lengths_dev = torch.tensor(lens, dtype=torch.int32, device=self.device)
        self.fill = (ctypes.c_float * 1)(0.0) if self.dtype == "float32" else (ctypes.c_uint16 * 1)(0)
        self.x_desc = self._data_desc(data, self.input)
        self.y_desc = self._data_desc(data, self.dirs * self.hidden)
        self.h_desc = _P()
        a("cudnnCreateTensorDescriptor", ctypes.byref(self.h_desc))
        dims = (ctypes.c_int * 3)(self.layers * self.dirs, batch, self.hidden)
        strides = (ctypes.c_int * 3)(batch * self.hidden, self.hidden, 1)
        a("cudnnSetTensorNdDescriptor", self.h_desc, ctypes.c_int(data), ctypes.c_int(3), dims, strides)
        size, work, reserve = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        a("cudnnGetRNNWeightSpaceSize", self.handle, self.rnn, ctypes.byref(size))
        a("cudnnGetRNNTempSpaceSizes", self.handle, self.rnn, ctypes.c_int(e["CUDNN_FWD_MODE_INFERENCE"]),
          self.x_desc, ctypes.byref(work), ctypes.byref(reserve))
        self.weights = torch.zeros(max(1, size.value), dtype=torch.uint8, device=self.device)
        self.work = torch.empty(max(1, work.value), dtype=torch.uint8, device=self.device)
        self.reserve = torch.empty(max(1, reserve.value), dtype=torch.uint8, device=self.device)
        self.weight_bytes = size.value
        self._copy_weights()
        self.dtype_torch = p.dtype
        self.hx = torch.zeros(self.layers * self.dirs, batch, self.hidden, dtype=p.dtype, device=self.device)

    def _data_desc(self, data: int, width: int) -> _P:
        desc = _P()
        self.a("cudnnCreateRNNDataDescriptor", ctypes.byref(desc))
        self.a("cudnnSetRNNDataDescriptor", desc, ctypes.c_int(data),
               ctypes.c_int(self.a.enums["CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED"]), ctypes.c_int(self.seq),
               ctypes.c_int(self.batch), ctypes.c_int(width), self.lengths_host, ctypes.cast(self.fill, _P))
        return desc

    def _copy_weights(self) -> None:
        """Each gate's matrix and bias of ``net`` into cuDNN's weight space: ids 0-2 are W_ih's
        r, z, n rows (PyTorch's order), 3-5 W_hh's (an LSTM's 0-3 W_ih's i, f, g, o, 4-7 W_hh's:
        PyTorch's order too); pseudo-layer = layer x dirs + direction."""
        import torch

        params = dict(self.net.named_parameters())
        m_desc, b_desc = _P(), _P()
        self.a("cudnnCreateTensorDescriptor", ctypes.byref(m_desc))
        self.a("cudnnCreateTensorDescriptor", ctypes.byref(b_desc))
        base = self.weights.data_ptr()
        h = self.hidden
        with torch.no_grad():
            for layer in range(self.layers):
                for d in range(self.dirs):
                    sfx = f"l{layer}" + ("_reverse" if d else "")
                    for lin in range(2 * self.gates):
                        kind = "ih" if lin < self.gates else "hh"
                        gate = lin % self.gates
                        m_addr, b_addr = _P(), _P()
                        self.a("cudnnGetRNNWeightParams", self.handle, self.rnn, ctypes.c_int32(layer * self.dirs + d),
                               ctypes.c_size_t(self.weight_bytes), _P(base), ctypes.c_int32(lin), m_desc,
                               ctypes.byref(m_addr), b_desc, ctypes.byref(b_addr))
                        w = params[f"weight_{kind}_{sfx}"][gate * h:(gate + 1) * h].contiguous()
                        self._put(m_addr.value, w)
                        if self.net.bias and b_addr.value:
                            self._put(b_addr.value, params[f"bias_{kind}_{sfx}"][gate * h:(gate + 1) * h].contiguous())

    def _put(self, address: int, tensor: Any) -> None:
        offset = address - self.weights.data_ptr()
        nbytes = tensor.numel() * tensor.element_size()
        if offset < 0 or offset + nbytes > self.weight_bytes:
            raise CudnnError("cudnnGetRNNWeightParams", f"address outside the weight space ({offset}, {nbytes})")
        self.weights[offset:offset + nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))

    def __call__(self, x: Any, h0: Any = None) -> tuple[Any, ...]:
        """(output, h_n) of x (T, B, I) on torch's current stream, in new tensors (torch's
        caching allocator: a CUDA graph of several calls keeps each call's output); an LSTM's
        (output, h_n, c_n), from zero states."""
        import torch

        a = self.a
        y = torch.empty(self.seq, self.batch, self.dirs * self.hidden, dtype=self.dtype_torch, device=self.device)
        hy = torch.empty_like(self.hx)
        a("cudnnSetStream", self.handle, _P(torch.cuda.current_stream(self.device).cuda_stream))
        hx = self.hx if h0 is None else h0
        cy = torch.empty_like(self.hx) if self.lstm else None
        cx, c_out = (_P(self.hx.data_ptr()), _P(cy.data_ptr())) if self.lstm else (_P(None), _P(None))
        a("cudnnRNNForward", self.handle, self.rnn, ctypes.c_int(a.enums["CUDNN_FWD_MODE_INFERENCE"]),
          _P(self.lengths_dev.data_ptr()), self.x_desc, _P(x.data_ptr()), self.y_desc, _P(y.data_ptr()),
          self.h_desc, _P(hx.data_ptr()), _P(hy.data_ptr()), self.h_desc, cx, c_out,
          ctypes.c_size_t(self.weight_bytes), _P(self.weights.data_ptr()), ctypes.c_size_t(self.work.numel()),
          _P(self.work.data_ptr()), ctypes.c_size_t(self.reserve.numel()), _P(self.reserve.data_ptr()))
        return (y, hy, cy) if self.lstm else (y, hy)


def cudnn_version() -> str:
    import torch

    return str(torch.backends.cudnn.version())
