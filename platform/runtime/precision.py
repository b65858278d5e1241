"""The one place where precision "auto" becomes "bf16" or "fp32": bf16 on a GPU and on CPUs where bf16 trains faster,
fp32 elsewhere. A model's id names the resolved precision, so the model store, the training and `alignlab plan` must
all resolve it by this one rule. Plain Python: no torch.
"""
from __future__ import annotations


def bf16_is_faster(vendor: str, flags: set[str]) -> bool:
    """Does bf16 autocast train faster than fp32 on a CPU of this vendor ("GenuineIntel", "AuthenticAMD", ...) and
    these /proc/cpuinfo flags? As measured with the mini step (benchmarks/throughput/cpu_precision.py, docs/pretrain.md#precision):
    - Intel with AMX: bf16 (1.4x the fp32 step);
    - AMD with AVX512-BF16 (Zen 4 on): bf16 (README command 1 in 17 minutes against 22 in fp32);
    - Intel with AVX512-BF16 but no AMX (measured on a VM that hides a Xeon's AMX): fp32. oneDNN's AVX512-BF16
      matmuls are no faster than MKL's fp32 ones at these shapes, and autocast's casts made the step 1.2-1.4x slower;
    - no bf16 instructions: fp32 (bf16 would be emulated)."""
    if "amx_bf16" in flags:
        return True
    return vendor == "AuthenticAMD" and "avx512_bf16" in flags


def cpu_vendor_and_flags() -> tuple[str, set[str]]:
    """This CPU's vendor_id and flags from /proc/cpuinfo (Linux; "" and none where it cannot be read)."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return "", set()
    fields = dict((k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines))  # the last CPU's
    return fields.get("vendor_id", ""), set(fields.get("flags", "").split())


def cpu_prefers_bf16() -> bool:
    """`bf16_is_faster` for the CPU this runs on."""
    return bf16_is_faster(*cpu_vendor_and_flags())


def resolve_precision(precision: str, *, gpu: bool) -> str:
    """`precision` ("auto", "bf16" or "fp32") as it trains on a GPU (`gpu`) or on this machine's CPU: "auto" is bf16
    on a GPU and on a CPU where bf16 trains faster (`bf16_is_faster`), fp32 elsewhere; the others are themselves."""
    if precision != "auto":
        return precision
    return "bf16" if gpu or cpu_prefers_bf16() else "fp32"
