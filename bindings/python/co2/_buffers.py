"""What co2 accepts as memory: numpy arrays (passed to the SWIG module, which checks them with
numpy's C API; float16 arrays by address after the same checks here) and torch tensors (passed
by data pointer after the checks below). Nothing is ever copied or converted: a wrong dtype, a
non-contiguous or read-only array raises TypeError, a wrong length ValueError."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, TypeGuard

import numpy as np
import numpy.typing as npt

from . import capi

if TYPE_CHECKING:
    import torch

_NUMPY_DTYPES = {
    np.dtype(np.float32): capi.CO2_DTYPE_FP32,
    np.dtype(np.float16): capi.CO2_DTYPE_FP16,
    np.dtype(np.float64): capi.CO2_DTYPE_FP64,
    np.dtype(np.int32): capi.CO2_DTYPE_INT32,
    np.dtype(np.int64): capi.CO2_DTYPE_INT64,
}


def is_torch_tensor(obj: object) -> TypeGuard[torch.Tensor]:
    module = type(obj).__module__
    return module.startswith("torch") and hasattr(obj, "data_ptr")


def _torch_dtypes() -> dict[torch.dtype, int]:
    import torch
    return {
        torch.float32: capi.CO2_DTYPE_FP32,
        torch.bfloat16: capi.CO2_DTYPE_BF16,
        torch.float16: capi.CO2_DTYPE_FP16,
        torch.float64: capi.CO2_DTYPE_FP64,
        torch.int32: capi.CO2_DTYPE_INT32,
        torch.int64: capi.CO2_DTYPE_INT64,
    }


class TensorMemory:
    """A torch tensor's memory as the C API sees it: address, element count, dtype, device."""

    __slots__ = ("tensor", "address", "count", "dtype", "device", "device_index")

    def __init__(self, tensor: torch.Tensor, what: str) -> None:
        dtypes = _torch_dtypes()
        if tensor.dtype not in dtypes:
            raise TypeError(f"{what}: torch dtype {tensor.dtype} is not supported "
                            f"(float32, bfloat16, float16 for parameters; raw collectives take "
                            f"float32, float64, int32, int64)")
        if tensor.layout != __import__("torch").strided:
            raise TypeError(f"{what}: only dense (strided) tensors are supported, got "
                            f"{tensor.layout}")
        if not tensor.is_contiguous():
            raise TypeError(f"{what}: the tensor is not contiguous (co2 never copies: pass "
                            f"t.contiguous() and keep that tensor)")
        if tensor.numel() < 1:
            raise ValueError(f"{what}: the tensor is empty")
        self.tensor = tensor
        self.address = tensor.data_ptr()
        self.count = tensor.numel()
        self.dtype = dtypes[tensor.dtype]
        if tensor.device.type == "cpu":
            self.device, self.device_index = capi.CO2_DEVICE_HOST, 0
        elif tensor.device.type == "cuda":
            self.device, self.device_index = capi.CO2_DEVICE_CUDA, tensor.device.index or 0
        else:
            raise TypeError(f"{what}: device {tensor.device} is not supported (cpu, cuda)")


def numpy_dtype_code(array: npt.NDArray[Any], what: str) -> int:
    try:
        return _NUMPY_DTYPES[array.dtype]
    except KeyError:
        raise TypeError(f"{what}: numpy dtype {array.dtype} is not supported "
                        f"(float32, float16, float64, int32, int64)") from None


# Parameter dtypes (docs/capi.md, "Parameter dtypes"): the parameters may be 16-bit, the
# engine's outer state (anchor, momentum, comm buffer) is fp32 for all of them.
PARAMETER_DTYPES = ("float32", "bfloat16", "float16")
FP64_PARAMETERS = ("fp64 parameters are not supported: train in float32 (model.float()) or in "
                   "bf16 (model.bfloat16()), whose outer state co2 keeps in fp32")
_DTYPE_NAMES: dict[Optional[int], str] = {
    capi.CO2_DTYPE_FP32: "float32", capi.CO2_DTYPE_BF16: "bfloat16",
    capi.CO2_DTYPE_FP16: "float16"}


def dtype_name(code: Optional[int]) -> str:
    return _DTYPE_NAMES.get(code, str(code))


def parameter_dtype(buffer: object, what: str) -> int:
    """The co2 dtype of parameter memory (a numpy array or torch tensor of float32, bfloat16 or
    float16); TypeError that says what to do for float64 and anything else."""
    if isinstance(buffer, np.ndarray):
        code = _NUMPY_DTYPES.get(buffer.dtype)
        name = str(buffer.dtype)
    elif is_torch_tensor(buffer):
        code = _torch_dtypes().get(buffer.dtype)
        name = str(buffer.dtype).replace("torch.", "")
    else:
        raise TypeError(f"{what}: expected a numpy array or a torch tensor, got "
                        f"{type(buffer).__name__}")
    if code == capi.CO2_DTYPE_FP64:
        raise TypeError(f"{what}: {FP64_PARAMETERS}")
    if code is None or code not in _DTYPE_NAMES:
        raise TypeError(f"{what}: {name} is not a parameter dtype "
                        f"({', '.join(PARAMETER_DTYPES)})")
    return code


def numpy_address(array: npt.NDArray[Any], what: str) -> tuple[int, int]:
    """Address and element count of a numpy array the engine reads and writes in place (the
    checks the SWIG module makes for the arrays it takes itself)."""
    if not array.flags.c_contiguous:
        raise TypeError(f"{what}: the array is not C-contiguous (co2 never copies: pass "
                        f"numpy.ascontiguousarray(a) and keep that array)")
    if not array.flags.aligned or not array.dtype.isnative:
        raise TypeError(f"{what}: the array must be aligned and in native byte order")
    if not array.flags.writeable:
        raise TypeError(f"{what}: the array is read-only; co2 writes into it")
    if array.size < 1:
        raise ValueError(f"{what}: the array is empty")
    return array.ctypes.data, array.size


def element_count(buffer: object, what: str) -> int:
    """Element count of a numpy array or torch tensor; TypeError for anything else."""
    if isinstance(buffer, np.ndarray):
        return buffer.size
    if is_torch_tensor(buffer):
        return buffer.numel()
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got "
                    f"{type(buffer).__name__}")


def check_count(buffer: object, expected: int, what: str) -> None:
    count = element_count(buffer, what)
    if count != expected:
        raise ValueError(f"{what}: expected {expected} elements, got {count}")


def current_stream(memory: Optional[TensorMemory]) -> Optional[int]:
    """The caller's CUDA stream for device memory (as an address), None on the host."""
    if memory is None or memory.device != capi.CO2_DEVICE_CUDA:
        return None
    import torch
    return torch.cuda.current_stream(memory.tensor.device).cuda_stream
