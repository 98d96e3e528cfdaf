"""The lines drawn by the roofline verdicts, each with the reason for its value."""

from __future__ import annotations

from typing import Final

#: Above this share of peak on the busier of compute (SM) and memory, that unit is what limits
#: the kernel; below it on both, neither is saturated and the kernel waits on latency. It is
#: the line of Nsight Compute's own SOLBottleneck rule ("Latency Issue" below 60%), so a
#: verdict here never contradicts the rule text printed beside it.
SATURATED_PCT: Final = 60.0
#: Compute and memory within this many points of each other are "balanced": reducing either
#: alone will not help much. Also the margin of ncu's SOLBottleneck rule.
BALANCED_GAP_PCT: Final = 10.0
#: Fewer blocks than one full wave leave SMs idle for the whole kernel.
FULL_WAVE: Final = 1.0
#: With fewer waves than this, a partly filled last wave idles SMs for a visible share of the
#: kernel (tail effect); with many waves it averages out.
TAIL_MAX_WAVES: Final = 4.0
#: A last wave filled below this fraction is called a tail.
TAIL_FILL_BELOW: Final = 0.5
#: Achieved occupancy below this fraction of theoretical points at imbalance or tail effects
#: rather than at a resource limit.
OCCUPANCY_GAP_RATIO: Final = 0.8
#: Theoretical occupancy below this (percent) is worth naming its limiter: the scheduler then
#: has at most half its warps to hide latency with.
LOW_THEORETICAL_OCCUPANCY_PCT: Final = 50.0
#: An SM clock under this fraction of the device's maximum during profiling means clocks were
#: locked (ncu's default --clock-control base) or the GPU throttled.
CLOCK_LOCK_RATIO: Final = 0.9
#: An SM clock under this fraction of boost is far below it, locked or not: compute-bound
#: durations are then 1.7x or more what they are at boost. ncu's base-clock lock lands at 0.54
#: on an A100 PCIe (765 of 1410 MHz) and 0.37 on a T4 (585 of 1590 MHz); elsewhere here at
#: 0.7-0.85, which the locked-clock note covers.
LOW_CLOCK_RATIO: Final = 0.6
#: Uncoalesced access: share of L2 sectors beyond a perfectly coalesced pattern (ncu's
#: derived__memory_l2_theoretical_sectors_global_excessive) worth calling out.
EXCESS_SECTORS_SHARE: Final = 0.10
#: Without excess-sector data: a warp touching this many 32-byte sectors per request reads at
#: least 512 B for at most 256 B of 8-byte values, i.e. every thread hits its own sector.
UNCOALESCED_SECTORS_PER_REQUEST: Final = 16.0
#: Stall reasons that are not waits: "selected" is issuing, "not_selected" is ready but
#: another warp was picked. They are excluded when naming why warps wait.
NON_STALL_REASONS: Final = ("selected", "not_selected")
#: Shape-based estimates: an op instance this short that reaches less than this share of its
#: roof is dominated by launch and ramp-up latency, not by its roof.
SHAPE_LATENCY_MAX_NS: Final = 10_000
SHAPE_LATENCY_EFFICIENCY: Final = 0.3
