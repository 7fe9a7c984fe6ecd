"""The machine the encoder runs on, in the terms that decide its speed: the CPU's instruction sets (AVX2, AVX-512,
VNNI, AMX, BF16), which int8 dot-product kernels ONNX Runtime can use on it, and the GPU's name. Read, not measured:
`esqbe check speed` (esqbe.index.speed) measures, this says why the figures are what they are."""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field

#: /proc/cpuinfo flags reported, in this order (x86-64; other CPUs report none of them)
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
             "amx_bf16")


@dataclass
class Machine:
    cpu: str  # the CPU's model name, as the OS reports it
    arch: str  # x86_64, aarch64, arm64, ...
    cores: int  # the CPUs this process may run on
    flags: dict[str, bool] = field(default_factory=dict)  # CPU_FLAGS -> present (empty where unknown)
    int8_kernels: str = "unknown"  # what ONNX Runtime's int8 matrix products run on here (`int8_kernel_class`)
    gpu: str | None = None  # the first CUDA GPU's name, where torch sees one

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def vnni(self) -> bool:
        """Whether int8 products accumulate in 32 bits without saturating (VNNI or AMX), by the flags."""
        return any(self.flags.get(f) for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def int8_kernel_class(flags: dict[str, bool], arch: str) -> str:
    """The int8 dot products ONNX Runtime's MLAS uses for the int8 encoder (uint8 activations x int8 weights) on a CPU
    with these flags. Without VNNI or AMX, x86-64 multiplies u8 x s8 pairs into 16-bit sums that saturate
    (`vpmaddubsw`), where VNNI and AMX accumulate in 32 bits: the same int8 model gives slightly different vectors."""
    if arch not in ("x86_64", "AMD64", "amd64"):
        return f"{arch}: not x86-64 (ONNX Runtime's own kernels for it)"
    if flags.get("amx_tile") and flags.get("amx_int8"):
        return "AMX (int8 tiles; 32-bit sums)"
    if flags.get("avx512_vnni"):
        return "AVX-512 VNNI (32-bit sums)"
    if flags.get("avx_vnni"):
        return "AVX-VNNI (32-bit sums)"
    if flags.get("avx512bw"):
        return "AVX-512 without VNNI (16-bit saturating pair sums)"
    if flags.get("avx2"):
        return "AVX2 without VNNI (16-bit saturating pair sums)"
    return "SSE (no AVX2)" if flags else "unknown (CPU flags not readable here)"


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU listed in /proc/cpuinfo; ("", empty) where there is none."""
    name, flags = "", set[str]()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if name and flags:
                    break
    except OSError:
        pass
    return name, flags


def _gpu() -> str | None:
    try:
        import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001  # a broken CUDA set-up is "no GPU" here; `check speed` reports the rest
        return None


def machine(*, cpuinfo: str = "/proc/cpuinfo", gpu: bool = True) -> Machine:
    """This machine: the CPU (model, the cores this process may use, CPU_FLAGS), its int8 kernel class, the GPU."""
    name, flags = _cpuinfo(cpuinfo)
    arch = platform.machine() or "unknown"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    present = {f: f in flags for f in CPU_FLAGS} if flags else {}
    return Machine(cpu=name or platform.processor() or arch, arch=arch, cores=cores, flags=present,
                   int8_kernels=int8_kernel_class(present, arch), gpu=_gpu() if gpu else None)
