"""Load checkpoint tensors from a ckptfs mount straight into GPU (or host) memory.

    import ckptfs_gpu
    sd = ckptfs_gpu.load("/mnt/ckpt/model.pt")                  # every tensor, on 'cuda' if it can
    part = ckptfs_gpu.load(path, names=["model.layers.0.weight"], device="cuda:1")
    ckptfs_gpu.index(path)    # [{"name", "dtype", "shape"[, "stride"], "offset", "length"}, ...]

The mount says where each tensor's bytes are (the user.ckptfs.tensors attribute); libckptfs_gpu.so
reads them with io_uring into memory torch allocated: straight into host tensors, or through pinned
staging buffers and asynchronous copies into device tensors (a build with HIP). No pickle runs.
The result is a flat dict keyed by state-dict path ("model.layers.0.weight"), not the nested
object torch.load returns; non-tensor values (step counts, configs) are not in it.

The library is found through $CKPTFS_GPU_LIB, else next to this file or in a build directory of
the repository (build*/gpu/), else by the system loader (libckptfs_gpu.so). Errors raise
CkptfsGpuError with the library's message.
"""
import ctypes
import glob
import json
import os

import torch

__all__ = ["CkptfsGpuError", "index", "load", "has_hip", "library_path"]


class CkptfsGpuError(RuntimeError):
    """A load failed: the message names the file and what is wrong. errno is the library's
    (ENODATA: not a checkpoint, EIO: damaged, ENOENT: no such file or tensor, ...)."""

    def __init__(self, message, errno_value=None):
        super().__init__(message)
        self.errno = errno_value


class _Extent(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("length", ctypes.c_uint64),
                ("dst", ctypes.c_void_p), ("name", ctypes.c_char_p)]


class _Options(ctypes.Structure):
    _fields_ = [("queue_depth", ctypes.c_uint32), ("staging_buffers", ctypes.c_uint32),
                ("piece_bytes", ctypes.c_uint64), ("staging_bytes", ctypes.c_uint64),
                ("max_op_bytes", ctypes.c_uint64), ("use_pread", ctypes.c_int32),
                ("no_huge_pages", ctypes.c_int32)]


# torch's dtype names, as the index spells them; those this torch lacks are left out.
_DTYPE_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "qint8", "quint8", "qint32",
]
DTYPES = {n: getattr(torch, n) for n in _DTYPE_NAMES
          if isinstance(getattr(torch, n, None), torch.dtype)}
# Quantized tensors need their scale and zero point, which the index does not carry.
for _q in ("qint8", "quint8", "qint32"):
    DTYPES.pop(_q, None)

_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("CKPTFS_GPU_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    found = [os.path.join(here, "libckptfs_gpu.so")]
    found += sorted(glob.glob(os.path.join(root, "build*", "gpu", "libckptfs_gpu.so")),
                    key=lambda p: (os.path.basename(os.path.dirname(os.path.dirname(p))) != "build",
                                   p))
    return [p for p in found if os.path.exists(p)] + ["libckptfs_gpu.so"]


def _library():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        lib.ckptfs_gpu_abi_version.restype = ctypes.c_int
        lib.ckptfs_gpu_has_hip.restype = ctypes.c_int
        lib.ckptfs_gpu_device_count.restype = ctypes.c_int
        lib.ckptfs_gpu_last_error.restype = ctypes.c_char_p
        lib.ckptfs_gpu_index.restype = ctypes.c_int
        lib.ckptfs_gpu_index.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_size_t)]
        lib.ckptfs_gpu_read.restype = ctypes.c_int
        lib.ckptfs_gpu_read.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Extent), ctypes.c_size_t,
                                        ctypes.c_int, ctypes.POINTER(_Options)]
        lib.ckptfs_gpu_free.restype = None
        lib.ckptfs_gpu_free.argtypes = [ctypes.c_void_p]
        if lib.ckptfs_gpu_abi_version() != 1:
            errors.append(f"{path}: ABI version {lib.ckptfs_gpu_abi_version()}, expected 1")
            continue
        _lib, _lib_path = lib, path
        return lib
    raise CkptfsGpuError("cannot load libckptfs_gpu.so (set CKPTFS_GPU_LIB): " + "; ".join(errors))


def library_path():
    """The path of the library in use."""
    _library()
    return _lib_path


def has_hip():
    """Whether the library was built with HIP (device reads)."""
    return bool(_library().ckptfs_gpu_has_hip())


def _fail(rc):
    msg = _library().ckptfs_gpu_last_error().decode("utf-8", "replace")
    raise CkptfsGpuError(msg or f"ckptfs_gpu failed ({rc})", -rc)


def index(path, names=None):
    """The tensors of the checkpoint at path, as the mount lists them: a list of dicts with
    name, dtype, shape, offset, length (and stride for non-contiguous tensors). With names, only
    those, in that order; an unknown name raises CkptfsGpuError listing every one."""
    lib = _library()
    if names is not None:
        names = list(names)
        if not names:
            return []
    else:
        names = []
    arr = (ctypes.c_char_p * max(len(names), 1))(*[n.encode() for n in names])
    out = ctypes.c_void_p()
    size = ctypes.c_size_t()
    rc = lib.ckptfs_gpu_index(os.fsencode(path), arr, len(names), ctypes.byref(out),
                              ctypes.byref(size))
    if rc != 0:
        _fail(rc)
    try:
        return json.loads(ctypes.string_at(out.value, size.value).decode("utf-8"))
    finally:
        lib.ckptfs_gpu_free(out)


def _resolve_device(device):
    if device is None:
        if torch.cuda.is_available() and has_hip():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _span(shape, stride):
    """Elements of storage a (shape, stride) tensor reaches."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _allocate(t, device, path):
    name = t["name"]
    dtype = DTYPES.get(t["dtype"])
    if dtype is None:
        raise CkptfsGpuError(f"{path}: tensor '{name}' has dtype '{t['dtype']}', which this "
                             f"torch ({torch.__version__}) cannot hold")
    shape = list(t["shape"])
    stride = t.get("stride")
    contiguous = []
    acc = 1
    for s in reversed(shape):
        contiguous.insert(0, acc)
        acc *= s
    elems = _span(shape, stride if stride else contiguous)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if elems * itemsize != t["length"]:
        raise CkptfsGpuError(f"{path}: tensor '{name}': the index gives {t['length']} bytes for "
                             f"shape {shape}, stride {stride or contiguous} of {t['dtype']} "
                             f"({elems * itemsize} bytes)")
    flat = torch.empty(elems, dtype=dtype, device=device)
    out = flat.as_strided(shape, stride) if stride else flat.view(shape)
    return flat, out


def load(path, names=None, device=None, *, options=None):
    """Reads the tensors of the checkpoint at path into new tensors on device and returns
    {name: tensor} in the file's order (or the order of names).

    names: only these tensors (a rank loading its part); an unknown name raises.
    device: None means 'cuda' when torch sees a GPU and the library has HIP, else 'cpu'. A CUDA
    device with a library built without HIP reads into host memory and copies with .to(device).
    options: a dict of the library's tuning fields (queue_depth, piece_bytes, staging_buffers,
    staging_bytes, use_pread, max_op_bytes, no_huge_pages); None for the defaults.
    Bytes are loaded as stored: the tensors are bitwise what torch.load returns."""
    device = _resolve_device(device)
    tensors = index(path, names)
    direct = device.type == "cpu" or (device.type == "cuda" and has_hip())
    target = device if direct else torch.device("cpu")
    result = {}
    flats = []
    for t in tensors:
        flat, out = _allocate(t, target, path)
        result[t["name"]] = out
        flats.append((t, flat))
    keep = []  # the name bytes stay alive during the call
    extents = (_Extent * max(len(flats), 1))()
    n = 0
    for t, flat in flats:
        if t["length"] == 0:
            continue
        name = t["name"].encode("utf-8", "replace")
        keep.append(name)
        extents[n] = _Extent(t["offset"], t["length"], flat.data_ptr(), name)
        n += 1
    opts = None
    if options:
        opts = _Options()
        for k, v in options.items():
            setattr(opts, k, int(v))
        opts = ctypes.byref(opts)
    dev_index = -1
    if target.type == "cuda":
        dev_index = target.index
        # torch's allocator may hand out memory a kernel on the current stream still uses; the
        # library copies on its own streams.
        torch.cuda.current_stream(target).synchronize()
    if n:
        rc = _library().ckptfs_gpu_read(os.fsencode(path), extents, n, dev_index, opts)
        if rc != 0:
            _fail(rc)
    if target != device:
        result = {k: v.to(device) for k, v in result.items()}
    return result
