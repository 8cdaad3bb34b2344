"""What co2 accepts as memory: numpy arrays (passed to the SWIG module, which checks them with
numpy's C API) and torch tensors (passed by data pointer after the checks below). Nothing is
ever copied or converted: a wrong dtype, a non-contiguous or read-only array raises TypeError,
a wrong length ValueError."""
import numpy as np

from . import capi

_NUMPY_DTYPES = {
    np.dtype(np.float32): capi.CO2_DTYPE_FP32,
    np.dtype(np.float64): capi.CO2_DTYPE_FP64,
    np.dtype(np.int32): capi.CO2_DTYPE_INT32,
    np.dtype(np.int64): capi.CO2_DTYPE_INT64,
}


def is_torch_tensor(obj):
    module = type(obj).__module__
    return module.startswith("torch") and hasattr(obj, "data_ptr")


def _torch_dtypes():
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

    def __init__(self, tensor, what):
        dtypes = _torch_dtypes()
        if tensor.dtype not in dtypes:
            raise TypeError(f"{what}: torch dtype {tensor.dtype} is not supported "
                            f"(float32 for parameters; raw collectives also take float64, "
                            f"int32, int64)")
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


def numpy_dtype_code(array, what):
    try:
        return _NUMPY_DTYPES[array.dtype]
    except KeyError:
        raise TypeError(f"{what}: numpy dtype {array.dtype} is not supported "
                        f"(float32, float64, int32, int64)") from None


def element_count(buffer, what):
    """Element count of a numpy array or torch tensor; TypeError for anything else."""
    if isinstance(buffer, np.ndarray):
        return buffer.size
    if is_torch_tensor(buffer):
        return buffer.numel()
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got "
                    f"{type(buffer).__name__}")


def check_count(buffer, expected, what):
    count = element_count(buffer, what)
    if count != expected:
        raise ValueError(f"{what}: expected {expected} elements, got {count}")


def current_stream(memory):
    """The caller's CUDA stream for device memory (as an address), None on the host."""
    if memory is None or memory.device != capi.CO2_DEVICE_CUDA:
        return None
    import torch
    return torch.cuda.current_stream(memory.tensor.device).cuda_stream
