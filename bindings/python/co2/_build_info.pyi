# Types of the module meson generates from _build_info.py.in (the sources hold only the template).
UCX: bool
CUDA: bool
NCCL: bool
