"""The host CPU as the schedule and the CPU target size for it: its vector unit.

The C is compiled with ``-march=native``, so the registers the generated code can keep
sums in are the host's. Three decisions depend on them: how many output channels the
conv layer's filter sums are blocked over (``loop_order.block_sums_in_registers``), how
many rows of per-point sums one pass computes (``block_sum_rows_in_registers``, and the
rows of a gather the CPU target's plan blocks) and how many lanes of partial sums a
vector loop keeps (the CPU target's plan, from ``ScheduledKernel.vector_unit``).
Sized for AVX-512's 32 registers of 512 bits, the conv gradient's 18 sums of 2 vectors
each spilled on an AVX2 machine (16 registers of 256 bits): sized for that machine's
unit it ran 10-14 % faster there, and its C compiled in half the time.

``host_vector_unit()`` reads ``$POLYAD_VECTOR_UNIT`` (``BITSxREGISTERS``, e.g.
``256x16``, or ``BITSxREGISTERS/HALF`` for a unit that computes each operation in halves
of ``HALF`` bits, ``512x32/256``; at every compile, as ``POLYAD_CACHE_DIR``), else the
host's CPU flags, vendor and family (Linux ``/proc/cpuinfo``). ``cpu_fingerprint()``
names what ``-march=native`` means on this host, for the cache keys: a library or a
schedule made on another CPU (a cache directory shared over a network file system) is
never reused here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from typing import Optional

from ..errors import ArgumentError

ENV = "POLYAD_VECTOR_UNIT"


@dataclass(frozen=True)
class VectorUnit:
    """A CPU's vector registers: ``registers`` of ``bits`` each, each operation computed
    on ``datapath`` bits at a time (0: all ``bits``; AMD's Zen 4 runs AVX-512 as two
    halves of 256 bits)."""

    bits: int
    registers: int
    datapath: int = 0

    @property
    def split(self) -> bool:
        """Does the unit compute an operation on a register in more than one part?"""
        return 0 < self.datapath < self.bits

    @property
    def sum_registers(self) -> int:
        """Registers the sums of one pass over a row may take: three quarters, the rest
        for the row's loads (24 of AVX-512's 32, 12 of AVX2's 16)."""
        return self.registers * 3 // 4

    @property
    def lane_bits(self) -> int:
        """Bits of per-lane partial sums for one sum: two vectors, enough independent
        adds to hide the add latency (as the hand-written baselines' LANES)."""
        return 2 * self.bits

    @property
    def two_vector_sums(self) -> int:
        """Sums past which a loop's sums get one vector each: their two-vector
        accumulators would take more than three eighths of the registers (12 on
        AVX-512, 6 on AVX2) and spill, the latency then hidden by the other sums."""
        return self.registers * 3 // 8

    @property
    def row_block(self) -> int:
        """Rows one pass over a row computes for a block of values of an outer loop (the
        conv layer's per-point sums, the rows of its ``d_x`` gather): a register per row
        and per tap weight of each. 4 on 32 registers (the conv forward 4.4-4.7 ms
        against 5.1-5.5 with 2, on AVX-512), 2 on 16 (on AVX2 the forward ran in
        0.80-0.94 of the time it took with 4, the gradient in 0.94-0.98). 2 on a unit
        that computes in halves (AVX-512 on Zen 4: with 2 the conv forward ran in
        0.95-1.0 of the time it took with 4, the gradient in 0.95-0.98). 4 rows take 40
        registers of 32: gcc keeps 31 tap weights, reloads the others every iteration
        and folds a load of the input into each of the pass's 36 multiply-adds, which
        the AVX-512 host of the first measurement absorbed and Zen 4 does not."""
        if self.split:
            return 2
        return max(2, self.registers // 8)

    @property
    def spec(self) -> str:
        """``BITSxREGISTERS`` (``BITSxREGISTERS/HALF`` for a unit computing in halves), as
        ``$POLYAD_VECTOR_UNIT`` writes it (``parse_vector_unit``)."""
        half = f"/{self.datapath}" if self.split else ""
        return f"{self.bits}x{self.registers}{half}"

    def __str__(self) -> str:
        half = f", computed in halves of {self.datapath}" if self.split else ""
        return f"{self.registers} vector registers of {self.bits} bits{half}"


# The units of the CPU flags /proc/cpuinfo lists, widest first.
AVX512 = VectorUnit(512, 32)
ZEN4 = VectorUnit(512, 32, 256)  # AMD family 19h with AVX-512: two 256-bit halves per operation
AVX = VectorUnit(256, 16)
SSE = VectorUnit(128, 16)
NEON = VectorUnit(128, 32)


def host_vector_unit() -> VectorUnit:
    """``$POLYAD_VECTOR_UNIT`` (``BITSxREGISTERS``) when set, else the host CPU's unit."""
    text = os.environ.get(ENV)
    if text:
        return parse_vector_unit(text)
    return _detected_unit()


def parse_vector_unit(text: str) -> VectorUnit:
    """``"256x16"`` -> VectorUnit(256, 16), ``"512x32/256"`` -> VectorUnit(512, 32, 256);
    ArgumentError naming the variable otherwise."""
    unit_text, slash, half = text.strip().lower().partition("/")
    bits, sep, registers = unit_text.partition("x")
    if sep and bits.isdigit() and registers.isdigit() and (not slash or half.isdigit()):
        unit = VectorUnit(int(bits), int(registers), int(half) if slash else 0)
        if (unit.bits >= 64 and unit.bits % 64 == 0 and unit.registers >= 4
                and (not slash or (unit.split and unit.datapath % 64 == 0
                                   and unit.bits % unit.datapath == 0))):
            return unit
    raise ArgumentError(f"${ENV} is {text!r}: write the bits of a vector register and how many "
                        f"there are, such as 256x16 (AVX2) or 512x32 (AVX-512), and after a "
                        f"slash the bits each operation is computed on where that is fewer, "
                        f"such as 512x32/256 (AVX-512 on AMD Zen 4), or unset it to use the "
                        f"host CPU's")


@functools.lru_cache(maxsize=None)
def _detected_unit() -> VectorUnit:
    return unit_of(_cpuinfo_field("flags", "features").split(), platform.machine(),
                   _cpuinfo_field("vendor_id"), _cpuinfo_field("cpu family"))


def unit_of(flags, machine: str, vendor: str = "", family: str = "") -> VectorUnit:
    """The vector unit of a CPU with the /proc/cpuinfo ``flags`` (x86) or ``features``
    (Arm), ``vendor_id`` ``vendor`` and ``cpu family`` ``family`` (decimal), and
    ``platform.machine()`` name ``machine``."""
    flags, machine = set(flags), machine.lower()
    if "avx512f" in flags:
        # AMD family 19h (25) with AVX-512 is Zen 4, which computes a 512-bit operation
        # in two 256-bit halves
        return ZEN4 if vendor == "AuthenticAMD" and family.strip() == "25" else AVX512
    if "avx" in flags:
        return AVX
    if machine in ("aarch64", "arm64"):
        return NEON
    if not flags and machine in ("x86_64", "amd64"):
        return AVX  # flags unknown (no /proc/cpuinfo): x86-64-v3's unit, the common one
    return SSE


@functools.lru_cache(maxsize=None)
def cpu_fingerprint() -> str:
    """A short hash of the host CPU's model and flags (what ``-march=native`` resolves to),
    or of ``platform``'s processor names where /proc/cpuinfo cannot be read."""
    text = "\0".join((_cpuinfo_field("model name", "cpu part"), _cpuinfo_field("flags", "features"),
                      platform.machine(), platform.processor()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cpuinfo_field(*names: str) -> str:
    """The first processor's value of the first of ``names`` /proc/cpuinfo has, or ''."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().split("\n\n")[0].splitlines()
    except OSError:
        return ""
    fields = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return next((fields[n] for n in names if n in fields), "")


def host_is_x86_64() -> bool:
    """Is the host an x86-64 machine (the instructions of its vector stores, the flags
    that size its vectors)?"""
    return platform.machine() in ("x86_64", "AMD64")


# Where Linux reports no cache sizes: a common last-level cache of a server core complex.
DEFAULT_LAST_LEVEL_CACHE = 32 << 20


@functools.lru_cache(maxsize=None)
def last_level_cache(base: str = "/sys/devices/system/cpu/cpu0/cache") -> Optional[tuple[int, int]]:
    """(level, bytes) of the last cache level Linux reports for cpu 0 in sysfs (``base``:
    its ``index*/level`` and ``index*/size`` files, ``32768K``), or None."""
    best = None
    try:
        indices = [d for d in os.listdir(base) if d.startswith("index")]
    except OSError:
        indices = []
    for index in indices:
        try:
            with open(os.path.join(base, index, "level")) as f:
                level = int(f.read())
            with open(os.path.join(base, index, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:])
        if scale and size[:-1].isdigit() and (best is None or level > best[0]):
            best = (level, int(size[:-1]) * scale)
    return best


def last_level_cache_bytes() -> int:
    """The size of the host's last cache level (``last_level_cache``), else
    ``DEFAULT_LAST_LEVEL_CACHE``."""
    found = last_level_cache()
    return found[1] if found else DEFAULT_LAST_LEVEL_CACHE


def host_key() -> str:
    """What a cached schedule or library made on this host depends on: the CPU and the
    vector unit the decisions were sized for."""
    return f"{cpu_fingerprint()}/{host_vector_unit().spec}"
