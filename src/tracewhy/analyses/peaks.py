"""Peak throughput of the GPUs tracewhy knows, each figure with its public source.

Compute peaks are dense (no 2:4 sparsity), in FLOP/s at the boost clock; memory bandwidth is
the DRAM/HBM figure in bytes/s. Datasheets quote sparse tensor figures with a footnote; the
dense value is half of it. Where a vendor publishes no figure (A10G, some GeForce parts) the
value is derived from the architecture and says so. Reports from ncu carry their own peaks
(``analyses.roofline`` prefers those); this table is for CSV exports without them and for
Kineto traces, which name the GPU but carry no peaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Final

import msgspec

T: Final = 1e12  # TFLOP/s
TB: Final = 1e12  # TB/s (decimal, as datasheets use)
GB: Final = 1e9

#: Precision keys. "_tensor" is the matrix unit (Tensor Core / AMD Matrix Core); fp16 covers
#: bf16, which every listed part runs at the same rate.
PRECISIONS: Final = ("fp64", "fp64_tensor", "fp32", "tf32_tensor", "fp16_tensor", "fp8_tensor")


@dataclass(frozen=True)
class DevicePeaks:
    """Peaks of one device model; ``flop_per_s`` maps precision keys to dense FLOP/s."""

    name: str
    sm_count: int  # SMs (NVIDIA) or CUs (AMD)
    boost_clock_hz: float
    dram_bytes_per_s: float
    flop_per_s: dict[str, float] = field(default_factory=dict)
    source: str = ""
    scaled_note: str | None = None  # set when peaks were scaled to a partition of the device

    def flops(self, precision: str) -> float | None:
        return self.flop_per_s.get(precision)


def _p(name: str, sms: int, mhz: float, bw: float, source: str, **flops: float) -> DevicePeaks:
    return DevicePeaks(name, sms, mhz * 1e6, bw, {k: v * T for k, v in flops.items()}, source)


# (pattern on the lower-cased device name, peaks). First match wins, so specific names
# (A100 80GB PCIe) come before general ones (A100).
_TABLE: Final[tuple[tuple[str, DevicePeaks], ...]] = (
    # NVIDIA Tesla V100 datasheet (2020), SXM2 and PCIe columns: FP64 7.8/7, FP32 15.7/14,
    # Tensor 125/112 TFLOPS, HBM2 900 GB/s.
    (r"v100s\b", _p("Tesla V100S PCIe", 80, 1597, 1134 * GB, "NVIDIA V100S datasheet",
                  fp64=8.2, fp32=16.4, fp16_tensor=130)),
    (r"v100.*pcie", _p("Tesla V100 PCIe", 80, 1380, 900 * GB, "NVIDIA V100 datasheet",
                       fp64=7.0, fp32=14.0, fp16_tensor=112)),
    (r"v100", _p("Tesla V100 SXM2", 80, 1530, 900 * GB, "NVIDIA V100 datasheet",
                 fp64=7.8, fp32=15.7, fp16_tensor=125)),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): FP64 9.7, FP64 Tensor 19.5, FP32 19.5,
    # TF32 156, BF16/FP16 312 TFLOPS dense; HBM 1,555 GB/s (40GB), 1,935 (80GB PCIe),
    # 2,039 (80GB SXM).
    (r"a100.*80gb.*pcie|a100.*pcie.*80gb", _p(
        "A100 80GB PCIe", 108, 1410, 1935 * GB, "NVIDIA A100 datasheet",
        fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32_tensor=156, fp16_tensor=312)),
    (r"a100.*80gb", _p("A100 80GB SXM", 108, 1410, 2039 * GB, "NVIDIA A100 datasheet",
                       fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32_tensor=156, fp16_tensor=312)),
    (r"a100", _p("A100 40GB", 108, 1410, 1555 * GB, "NVIDIA A100 datasheet",
                 fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32_tensor=156, fp16_tensor=312)),
    # NVIDIA H100 Tensor Core GPU datasheet (2023), SXM / PCIe / NVL columns; tensor figures
    # there are with sparsity, halved here: SXM TF32 989 -> 494.5, BF16 1979 -> 989.5,
    # FP8 3958 -> 1979; PCIe 756/1513/3026; NVL 835/1671/3341. HBM 3.35 / 2.0 / 3.9 TB/s.
    (r"h100.*nvl", _p("H100 NVL", 132, 1785, 3.9 * TB, "NVIDIA H100 datasheet",
                      fp64=30, fp64_tensor=60, fp32=60, tf32_tensor=417.5, fp16_tensor=835.5,
                      fp8_tensor=1670.5)),
    (r"h100.*pcie", _p("H100 PCIe", 114, 1755, 2.0 * TB, "NVIDIA H100 datasheet",
                       fp64=26, fp64_tensor=51, fp32=51, tf32_tensor=378, fp16_tensor=756.5,
                       fp8_tensor=1513)),
    (r"h100", _p("H100 SXM", 132, 1980, 3.35 * TB, "NVIDIA H100 datasheet",
                 fp64=34, fp64_tensor=67, fp32=67, tf32_tensor=494.5, fp16_tensor=989.5,
                 fp8_tensor=1979)),
    # NVIDIA GH200 Grace Hopper Superchip datasheet (2024), GPU side: compute as H100 SXM;
    # HBM3 96 GB at 4 TB/s, or HBM3e 144 GB at 4.9 TB/s. Before "h200", which "gh200" contains.
    (r"gh200.*(hbm3e|144 ?g|624 ?g)", _p("GH200 (HBM3e)", 132, 1980, 4.9 * TB, "NVIDIA GH200 datasheet",
                                 fp64=34, fp64_tensor=67, fp32=67, tf32_tensor=494.5,
                                 fp16_tensor=989.5, fp8_tensor=1979)),
    (r"gh200", _p("GH200 (HBM3)", 132, 1980, 4.0 * TB, "NVIDIA GH200 datasheet",
                  fp64=34, fp64_tensor=67, fp32=67, tf32_tensor=494.5, fp16_tensor=989.5,
                  fp8_tensor=1979)),
    # NVIDIA H200 datasheet (2024), NVL column: FP64 30, FP64 Tensor 60, FP32 60 TF; TF32 835,
    # BF16 1671, FP8 3341 with sparsity -> 417.5 / 835.5 / 1670.5; HBM3e 4.8 TB/s; the NVL
    # runs at the H100 NVL's 1785 MHz.
    (r"h200.*nvl", _p("H200 NVL", 132, 1785, 4.8 * TB, "NVIDIA H200 datasheet",
                      fp64=30, fp64_tensor=60, fp32=60, tf32_tensor=417.5, fp16_tensor=835.5,
                      fp8_tensor=1670.5)),
    # NVIDIA H200 datasheet (2024), SXM column: compute as H100 SXM, HBM3e 4.8 TB/s.
    (r"h200", _p("H200 SXM", 132, 1980, 4.8 * TB, "NVIDIA H200 datasheet",
                 fp64=34, fp64_tensor=67, fp32=67, tf32_tensor=494.5, fp16_tensor=989.5,
                 fp8_tensor=1979)),
    # H800 (export variant of H100 SXM): same SMs, clocks and HBM3; its FP64 is restricted,
    # so no FP64 figure is given here.
    (r"h800", _p("H800 SXM", 132, 1980, 3.35 * TB, "NVIDIA H800 datasheet",
                 fp32=67, tf32_tensor=494.5, fp16_tensor=989.5, fp8_tensor=1979)),
    # NVIDIA HGX B200 specifications (8 GPUs: FP8 72 PF, BF16 36 PF, TF32 18 PF sparse;
    # FP64 296 TF; HBM3e 64 TB/s) divided by 8 and halved for density. FP32 is derived:
    # 148 SMs x 128 FP32 lanes x 2 FLOP x 1.965 GHz (NVIDIA publishes no CUDA-core figure).
    (r"b200", _p("B200", 148, 1965, 8.0 * TB, "NVIDIA HGX B200 specifications (per GPU)",
                 fp64=37, fp64_tensor=37, fp32=74.4, tf32_tensor=1125, fp16_tensor=2250,
                 fp8_tensor=4500)),
    # NVIDIA L40S datasheet (2023): FP32 91.6 TF; dense (sparse) TF32 183 (366), BF16/FP16
    # 362.05 (733), FP8 733 (1466); GDDR6 864 GB/s; 142 SMs (18,176 CUDA cores), 2520 MHz
    # boost. No FP64 figure is published.
    (r"l40s", _p("L40S", 142, 2520, 864 * GB, "NVIDIA L40S datasheet",
                 fp32=91.6, tf32_tensor=183, fp16_tensor=362.05, fp8_tensor=733)),
    # NVIDIA L40 datasheet (2022): FP32 90.5 TF; TF32 181, FP16 (FP32 accumulate) 362.1,
    # FP8 724 with sparsity -> 90.5 / 181.05 / 362 dense; 864 GB/s; 142 SMs, 2490 MHz.
    (r"\bl40\b", _p("L40", 142, 2490, 864 * GB, "NVIDIA L40 datasheet",
                    fp32=90.5, tf32_tensor=90.5, fp16_tensor=181.05, fp8_tensor=362)),
    # NVIDIA T4 datasheet (2019): FP32 8.1 TF, FP16 (mixed precision) Tensor 65 TF (Turing
    # has no sparsity), GDDR6 320 GB/s; 40 SMs (2,560 CUDA cores), 1590 MHz boost (its base
    # is 585 MHz, where ncu's default --clock-control base puts it). No FP64 figure.
    (r"\bt4\b", _p("T4", 40, 1590, 320 * GB, "NVIDIA T4 datasheet",
                   fp32=8.1, fp16_tensor=65)),
    # NVIDIA L4 datasheet (2023): FP32 30.3 TF; TF32 120, BF16/FP16 242, FP8 485 with
    # sparsity -> 60 / 121 / 242.5 dense; 300 GB/s.
    (r"\bl4\b", _p("L4", 58, 2040, 300 * GB, "NVIDIA L4 datasheet",
                   fp64=0.49, fp32=30.3, tf32_tensor=60, fp16_tensor=121, fp8_tensor=242.5)),
    # A10G (AWS G5): 80 SMs, 1710 MHz, 600 GB/s; AWS publishes no FLOPS, so FP32 is
    # 80 x 128 x 2 x 1.71 GHz and tensor uses the A10's per-SM rate (125 TF / 72 SMs /
    # 1.695 GHz = 1024 FLOP/clk/SM) at the A10G's SM count and clock.
    (r"a10g", _p("A10G", 80, 1710, 600 * GB, "derived from A10 datasheet rates (AWS G5)",
                 fp32=35.0, tf32_tensor=70.0, fp16_tensor=140.1)),
    # NVIDIA A10 datasheet (2021): FP32 31.2, TF32 62.5, BF16/FP16 125 TF dense; 600 GB/s.
    (r"\ba10\b", _p("A10", 72, 1695, 600 * GB, "NVIDIA A10 datasheet",
                    fp32=31.2, tf32_tensor=62.5, fp16_tensor=125)),
    # NVIDIA A40 datasheet (2021): FP32 37.4, TF32 74.8, BF16/FP16 149.7 TF dense; 696 GB/s.
    (r"\ba40\b", _p("A40", 84, 1740, 696 * GB, "NVIDIA A40 datasheet",
                    fp32=37.4, tf32_tensor=74.8, fp16_tensor=149.7)),
    # NVIDIA Ampere GA102 whitepaper, GeForce column: FP32 35.6 / 29.8 TF; FP16 Tensor with
    # FP32 accumulate (what PyTorch uses) 71 / 59.5 TF dense; 936 / 760 GB/s.
    (r"rtx ?3090", _p("GeForce RTX 3090", 82, 1695, 936 * GB, "NVIDIA GA102 whitepaper",
                     fp32=35.6, fp16_tensor=71)),
    (r"rtx ?3080", _p("GeForce RTX 3080", 68, 1710, 760 * GB, "NVIDIA GA102 whitepaper",
                     fp32=29.8, fp16_tensor=59.5)),
    # RTX 3060 Ti (GA104): 38 SMs, 1665 MHz boost, 14 Gbps x 256-bit = 448 GB/s (NVIDIA
    # product specifications); FP32 38 x 128 x 2 x 1.665 GHz; tensor at the GA102 GeForce
    # per-SM rate (512 FLOP/clk/SM with FP32 accumulate). Derived.
    (r"rtx ?3060 ?ti", _p("GeForce RTX 3060 Ti", 38, 1665, 448 * GB,
                        "derived from NVIDIA specifications and GA102 whitepaper rates",
                        fp32=16.2, fp16_tensor=32.4)),
    # NVIDIA Ada Lovelace architecture whitepaper, appendix: FP32 82.6 / 48.7 TF; FP16 Tensor
    # with FP32 accumulate 165.2 / 97.5 TF dense, FP8 330.3 / 194.9; 1008 / 716.8 GB/s.
    (r"rtx ?4090", _p("GeForce RTX 4090", 128, 2520, 1008 * GB, "NVIDIA Ada whitepaper",
                     fp32=82.6, fp16_tensor=165.2, fp8_tensor=330.3)),
    (r"rtx ?4080\b", _p("GeForce RTX 4080", 76, 2505, 716.8 * GB, "NVIDIA Ada whitepaper",
                     fp32=48.7, fp16_tensor=97.5, fp8_tensor=194.9)),
    # RTX 50 (Blackwell GeForce), NVIDIA product specifications: 5090 170 SMs, 2407 MHz,
    # 28 Gbps x 512-bit = 1792 GB/s; 5070 48 SMs, 2512 MHz, 28 Gbps x 192-bit = 672 GB/s.
    # FP32 derived as SMs x 128 x 2 x clock; no tensor figure is assumed.
    (r"rtx ?5090", _p("GeForce RTX 5090", 170, 2407, 1792 * GB, "NVIDIA specifications (derived FP32)",
                     fp32=104.8)),
    (r"rtx ?5070\b", _p("GeForce RTX 5070", 48, 2512, 672 * GB, "NVIDIA specifications (derived FP32)",
                     fp32=30.9)),
    # AMD Instinct MI300X datasheet (2023): FP64 vector 81.7, matrix 163.4; FP32 163.4;
    # TF32 653.7, BF16/FP16 1307.4, FP8 2614.9 TF dense; HBM3 5.3 TB/s; 304 CUs, 2100 MHz.
    (r"mi300x", _p("Instinct MI300X", 304, 2100, 5.3 * TB, "AMD MI300X datasheet",
                   fp64=81.7, fp64_tensor=163.4, fp32=163.4, tf32_tensor=653.7,
                   fp16_tensor=1307.4, fp8_tensor=2614.9)),
    # AMD Instinct MI250X / MI250 / MI210 datasheets: FP64 vector 47.9 / 45.3 / 22.6, matrix
    # 95.7 / 90.5 / 45.3; FP32 vector 47.9 / 45.3 / 22.6; FP16/BF16 383 / 362.1 / 181 TF;
    # HBM2e 3.2768 / 3.2768 / 1.6384 TB/s. MI250(X) are two dies (GCDs) per package; a trace
    # shows one GCD per device, with half the CUs, and the peaks are scaled to it.
    (r"mi250x", _p("Instinct MI250X", 220, 1700, 3.2768 * TB, "AMD MI250X datasheet",
                   fp64=47.9, fp64_tensor=95.7, fp32=47.9, fp16_tensor=383)),
    (r"mi250", _p("Instinct MI250", 208, 1700, 3.2768 * TB, "AMD MI250 datasheet",
                  fp64=45.3, fp64_tensor=90.5, fp32=45.3, fp16_tensor=362.1)),
    (r"mi210", _p("Instinct MI210", 104, 1700, 1.6384 * TB, "AMD MI210 datasheet",
                  fp64=22.6, fp64_tensor=45.3, fp32=22.6, fp16_tensor=181)),
)
_COMPILED: Final = tuple((re.compile(p), peaks) for p, peaks in _TABLE)

#: A device reporting fewer SMs than its model has is a partition (MIG slice, one MI250
#: GCD); below this fraction, peaks are scaled to the SMs it has.
PARTITION_SM_FRACTION: Final = 0.9


def lookup_peaks(device_name: str | None, sm_count: int | None = None) -> DevicePeaks | None:
    """The table's peaks for a device name as profilers write it, scaled to a partition."""
    if not device_name:
        return None
    low = " ".join(device_name.lower().replace("-", " ").replace("_", " ").split())
    for pattern, peaks in _COMPILED:
        if pattern.search(low):
            if sm_count and sm_count < PARTITION_SM_FRACTION * peaks.sm_count:
                share = sm_count / peaks.sm_count
                return replace(
                    peaks,
                    sm_count=sm_count,
                    dram_bytes_per_s=peaks.dram_bytes_per_s * share,
                    flop_per_s={k: v * share for k, v in peaks.flop_per_s.items()},
                    scaled_note=f"device shows {sm_count} of {peaks.name}'s {peaks.sm_count} "
                                f"SMs/CUs; peaks scaled to {share:.0%}",
                )
            return peaks
    return None


#: Devices known by their recorded properties when a profiler writes no name (ROCm 7 builds of
#: vLLM's traces, 2025: "name": ""): (compute major, minor, SMs/CUs, memory bytes low, high), name.
_BY_PROPERTIES: Final = (
    ((9, 4, 304, 190 * 2**30, 200 * 2**30), "mi300x"),  # gfx942, 304 CUs, 192 GiB HBM3
)


def peaks_from_properties(major: int | None, minor: int | None, sms: int | None,
                          memory_bytes: int | None) -> DevicePeaks | None:
    """The table's peaks for an unnamed device whose properties match one row of _BY_PROPERTIES."""
    for (mj, mn, n, lo, hi), name in _BY_PROPERTIES:
        if (major, minor, sms) == (mj, mn, n) and memory_bytes is not None and lo <= memory_bytes <= hi:
            return lookup_peaks(name, sms)
    return None


def known_devices() -> tuple[str, ...]:
    return tuple(peaks.name for _, peaks in _TABLE)


class HostLink(msgspec.Struct, frozen=True):
    """The link between a GPU and its host, which host-device copies cross: its name and its
    peak in one direction (a copy moves data one way), bytes/s."""

    name: str
    bytes_per_s: float
    source: str


def _link(name: str, both_ways_gb_per_s: float, source: str) -> HostLink:
    """Datasheets quote a host link's bandwidth for both directions together; a copy gets half."""
    return HostLink(name, both_ways_gb_per_s * GB / 2, source)


_PCIE3: Final = "PCIe 3.0 x16"
_PCIE4: Final = "PCIe 4.0 x16"
_PCIE5: Final = "PCIe 5.0 x16"
# (pattern on the lower-cased device name, link), first match wins as in _TABLE. Each figure is
# the device's datasheet "interconnect" line (PCIe Gen3 32 GB/s, Gen4 64 GB/s, Gen5 128 GB/s, both
# directions; GH200's NVLink-C2C 900 GB/s); GeForce parts by their PCIe generation (x16).
_LINKS: Final[tuple[tuple[str, HostLink], ...]] = (
    (r"gh200", _link("NVLink-C2C", 900, "NVIDIA GH200 datasheet")),
    (r"h100|h200|h800", _link(_PCIE5, 128, "NVIDIA H100/H200 datasheets")),
    (r"b200", _link(_PCIE5, 128, "NVIDIA HGX B200 specifications")),
    (r"a100|a10g|\ba10\b|\ba40\b|l40|\bl4\b", _link(_PCIE4, 64, "NVIDIA A100/A10/A40/L40/L4 datasheets")),
    (r"v100|\bt4\b", _link(_PCIE3, 32, "NVIDIA V100/T4 datasheets")),
    (r"rtx ?(30|40)\d0", _link(_PCIE4, 64, "NVIDIA GeForce specifications (PCIe 4.0 x16)")),
    (r"rtx ?50\d0", _link(_PCIE5, 128, "NVIDIA GeForce specifications (PCIe 5.0 x16)")),
    (r"mi300", _link(_PCIE5, 128, "AMD MI300X datasheet")),
    (r"mi250|mi210", _link(_PCIE4, 64, "AMD MI250/MI210 datasheets")),
)
_COMPILED_LINKS: Final = tuple((re.compile(p), link) for p, link in _LINKS)
#: The host links a data-centre GPU of the last generations sits on, for a trace that names no
#: device: a copy's rate is set beside each, so that the reader can place it (same datasheet figures).
COMMON_HOST_LINKS: Final = (_link(_PCIE4, 64, "PCI-SIG PCIe 4.0 x16"), _link(_PCIE5, 128, "PCI-SIG PCIe 5.0 x16"))


def host_link(device_name: str | None) -> HostLink | None:
    """The host link of a device name as profilers write it (None: not in the table)."""
    if not device_name:
        return None
    low = " ".join(device_name.lower().replace("-", " ").replace("_", " ").split())
    return next((link for pattern, link in _COMPILED_LINKS if pattern.search(low)), None)


# GPU-to-GPU links, which collectives cross: (pattern on the lower-cased device name, link), first
# match wins. Each figure is the datasheet's GPU-to-GPU line, both directions together, halved as
# for host links (NCCL's bus bandwidth is one direction: nccl-tests doc/PERFORMANCE.md). Parts
# without a GPU-to-GPU fabric (PCIe cards, GeForce) exchange over PCIe: their host link.
_PEER_LINKS: Final[tuple[tuple[str, HostLink], ...]] = (
    (r"b200|b100|gb200", _link("NVLink 5", 1800, "NVIDIA HGX B200 specifications (NVLink 1.8 TB/s)")),
    (r"h800", _link("NVLink 4", 400, "NVIDIA H800 datasheet (NVLink 400 GB/s)")),
    (r"h100|h200|gh200", _link("NVLink 4", 900, "NVIDIA H100/H200 SXM datasheets (NVLink 900 GB/s)")),
    (r"a800", _link("NVLink 3", 400, "NVIDIA A800 datasheet (NVLink 400 GB/s)")),
    (r"a100", _link("NVLink 3", 600, "NVIDIA A100 SXM datasheet (NVLink 600 GB/s)")),
    (r"v100", _link("NVLink 2", 300, "NVIDIA V100 SXM2 datasheet (NVLink 300 GB/s)")),
    (r"mi300|mi325", _link("Infinity Fabric (xGMI)", 896, "AMD Instinct MI300X datasheet (7 links, 896 GB/s)")),
)
_COMPILED_PEER_LINKS: Final = tuple((re.compile(p), link) for p, link in _PEER_LINKS)
#: Cards whose GPUs exchange over PCIe (no fabric between them, or a bridge the trace cannot see).
_PEERS_OVER_PCIE: Final = re.compile(r"pcie|\bnvl\b|rtx|l40|\bl4\b|\ba10g?\b|\ba40\b|\bt4\b|v100s")


def peer_link(device_name: str | None) -> HostLink | None:
    """The link a device exchanges with the other GPUs of its node over, with its peak in one
    direction (None: not in the table). A PCIe card's is its host link."""
    if not device_name:
        return None
    low = " ".join(device_name.lower().replace("-", " ").replace("_", " ").split())
    if _PEERS_OVER_PCIE.search(low):
        return host_link(device_name)
    return next((link for pattern, link in _COMPILED_PEER_LINKS if pattern.search(low)), None)
