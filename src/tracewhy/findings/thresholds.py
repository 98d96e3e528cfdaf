"""Every threshold a finding uses, in one place, each with the reason for its value.

Changing a value here changes what tracewhy reports; tests pin behaviour on both sides of each.
"""

from __future__ import annotations

from typing import Final

# --- trust checks --------------------------------------------------------------------------
#: Fewer steady steps than this and percentiles are anecdotes: p90 of two values is an
#: interpolation, not a distribution.
MIN_STEADY_STEPS: Final = 3

# --- the step account (where the step goes) -----------------------------------------------
#: ``diagnose`` opens with the account's largest parts until they cover this share of the step:
#: four fifths say where the step goes; the long tail after it is summed on one line...
ACCOUNT_COVER_SHARE: Final = 0.80
#: ...in at most this many lines (a step split over more parts than this has no single story).
ACCOUNT_MAX_LINES: Final = 8
#: A part that is not essential work and takes this share of the step is reported even when no
#: rule explains it (``unexplained-part``), and while one exists the step is not called healthy:
#: three times the medium line (IDLE_CLASS_MIN_SHARE), a share no reader would call small.
UNEXPLAINED_PART_MIN_SHARE: Final = 0.15
#: Host-device copies on the critical path from this share of the step are their own finding
#: (``copy-bound``): the same line as a part no rule explains.
COPY_BOUND_MIN_SHARE: Final = UNEXPLAINED_PART_MIN_SHARE
#: A copy part under this share of the copies' time is left out of the copy-bound sentence (its
#: evidence keeps it): 9 bytes read back beside 24 GiB sent say nothing about the step.
COPY_LINE_MIN_SHARE: Final = 0.01
#: Copies from pinned memory at this share of the link's one-way peak or more run as fast as
#: the link allows (DMA engines reach 80-90% of it on large copies): only fewer bytes help.
COPY_NEAR_LINK_PEAK: Final = 0.5
#: ``essential-work`` gives the ops' fraction of their roof only when ops with modelled shapes
#: cover this share of the GPU time: below half, the figure speaks for the ops it covers, not
#: for the step (a graph-replayed decode step links 3% of its kernels to an op).
ESSENTIAL_ROOF_MIN_COVER: Final = 0.5
#: The fixes ``diagnose`` predicts together: the three that save most (more are rarely tried at once).
FIXES_TOGETHER: Final = 3

# --- GPU idle ------------------------------------------------------------------------------
#: GPU active share of the steady window under which utilization is called low. 80% is where
#: the TensorBoard profiler plugin and most tuning guides draw the line for training jobs.
LOW_UTILIZATION: Final = 0.80
#: GPU busy share of the window from which the GPU is called saturated: idle below 2% is
#: launch jitter that no host-side change recovers, so the time is in the GPU work itself.
SATURATED_UTILIZATION: Final = 0.98
#: An idle class becomes its own finding when it costs at least this share of the step...
IDLE_CLASS_MIN_SHARE: Final = 0.05
#: ...and at least this much time per step (shares of a tiny step are noise).
IDLE_CLASS_MIN_NS: Final = 50_000
#: Share of the step above which a finding is high severity rather than medium.
HIGH_SEVERITY_SHARE: Final = 0.20

# --- input pipeline ------------------------------------------------------------------------
#: DataLoader share of the step that tb_plugin flagged (its threshold was 5% of step time
#: spent in DataLoader); we flag the GPU-idle part of it, which is what a fix recovers.
INPUT_MIN_SHARE: Final = 0.05

# --- launch-bound --------------------------------------------------------------------------
#: Host dispatch time at least this share of GPU busy time means the host struggles to keep
#: the GPU fed (at 1.0 it cannot keep up at all).
LAUNCH_DISPATCH_RATIO: Final = 0.5
#: Host idle is the model's own op-by-op dispatch, not a stretch of CPU work, when a step's
#: host-class gaps number at least this many and no one of them holds DISPATCH_MAX_GAP_SHARE of
#: their time: the GPU idles between the step's own launches, a little each time, rather than
#: once while the host does something else (BERT-small inference: 51 gaps, the largest 14%).
DISPATCH_MIN_GAPS: Final = 8
DISPATCH_MAX_GAP_SHARE: Final = 0.5
#: Share of kernels shorter than one launch call above which CUDA graphs pay off clearly.
SHORT_KERNEL_SHARE: Final = 0.5

# --- small captures ------------------------------------------------------------------------
#: A capture with fewer events (slices of every kind) than this gets no finding above low: a
#: training step of even a small model runs dozens of ops forward, backward and in the optimizer
#: (the generated SmallCNN step: about 220 events), so fewer is a fragment or a toy, which cannot
#: show what the job repeats. The real fragments in ../shared/traces hold 7 to 56 events; the
#: smallest whole-step captures there, 112 to 115.
MIN_EVENTS_FOR_SEVERITY: Final = 100
#: A finding is high only over at least this many analysed steps (with step markers; a trace
#: without them is one window, which this does not judge): high says the cost recurs in every
#: step, which one step cannot show. One step gets at most medium.
HIGH_SEVERITY_MIN_STEPS: Final = 2

# --- step-time spikes ----------------------------------------------------------------------
#: A user line explains the spikes when its self time in them grows by at least this share of
#: their excess over the median step: most of the extra time is then under that one line.
SPIKE_LINE_MIN_SHARE: Final = 0.5
#: Ops the spikes call more often than a median step are named when their extra time is at
#: least this share of the spikes' excess (up to three): smaller ones are a spike's noise.
SPIKE_OPS_MIN_SHARE: Final = 0.1
#: Untraced time, or the same ops running slower, is named when it grows by at least this share
#: of the excess.
SPIKE_PART_MIN_SHARE: Final = 0.25

# --- copies --------------------------------------------------------------------------------
#: Pageable copies worth mentioning: fewer than this per step are not worth pinning memory for.
PAGEABLE_MIN_BYTES: Final = 1 << 20

# --- memory --------------------------------------------------------------------------------
#: Reserved memory at this share of the device's memory leaves no headroom for fragmentation
#: or a larger batch (tb_plugin warned near the limit too).
MEMORY_NEAR_LIMIT: Final = 0.90
#: Reserved-but-unallocated share of reserved at the peak from which the cache is called
#: fragmented: PyTorch's allocator docs treat a third of reserved memory idle as the point where
#: expandable_segments pays off; below it the slack is the cache doing its job.
MEMORY_FRAGMENTATION_SHARE: Final = 0.30
#: ...and at least this many bytes: a third of a small cache is not worth a setting.
MEMORY_FRAGMENTATION_MIN_BYTES: Final = 256 * 1024**2
#: Allocated growth per steady step, as a share of the peak, from which a leak (a rise in every
#: steady step) is high: at 0.5% a step it doubles the peak in 200 steps. Below, it is medium: a
#: run of many thousand steps still reaches the limit.
MEMORY_GROWTH_SHARE_PER_STEP: Final = 0.005
#: Steady steps needed before rising in every one of them is a trend rather than two points.
MEMORY_GROWTH_MIN_STEPS: Final = 3
#: A peak below this gets no advice to lower it (no activation checkpointing, no sharding): it is
#: under 1% of 16 GiB, the smallest data-centre GPU in service (T4, V100 16GB), so lowering it
#: frees nothing a larger batch or model could use, and checkpointing would only cost recompute.
MEMORY_PEAK_ADVICE_MIN_BYTES: Final = 128 * 1024**2
#: Reserved changes (cudaMalloc/cudaFree by the caching allocator) per steady step from which
#: the allocator is churning: in a settled loop the cache is warm and reserved stays flat.
ALLOCATOR_CHURN_RESERVE_CHANGES_PER_STEP: Final = 1.0

# --- precision -----------------------------------------------------------------------------
#: Share of GPU time in tensor-core-eligible kernels (GEMM, convolution) running without
#: tensor cores above which mixed precision is recommended (tb_plugin used the same idea).
TENSOR_CORE_ELIGIBLE_SHARE: Final = 0.30

# --- overlap, blocks and ranks -------------------------------------------------------------
#: Exposed communication worth a finding: at 5% of the step, overlapping it pays more than the
#: few percent of run-to-run noise a step time has on a shared cluster...
EXPOSED_COMM_MIN_SHARE: Final = 0.05
#: ...and at least this much per step (a few tiny collectives in a tiny step are noise).
EXPOSED_COMM_MIN_NS: Final = 100_000
#: Exposed communication (or waiting for a straggler) above this share of the step is high
#: severity: a fifth of the step is more than most single optimizations give back.
EXPOSED_COMM_HIGH_SHARE: Final = 0.20
#: A collective message from which bandwidth, not latency, sets its time: nccl-tests on NVLink and
#: xGMI systems reach over half their peak bus bandwidth from a few MB, while under 1 MB a call is
#: mostly its fixed cost of a few to tens of µs, so a low bus bandwidth there says nothing of the link.
COLL_LARGE_MESSAGE_BYTES: Final = 4 * 1024**2
#: Large collectives below this share of their link's peak bus bandwidth are judged slow: tuned
#: NCCL reaches 70-85% of NVLink's per-direction peak on large all-reduces, so under a quarter is
#: a transport, topology or waiting problem, not tuning.
COLL_SLOW_BUS_SHARE: Final = 0.25
#: Block attribution needs at least this many blocks with GPU work: one block is the step.
BLOCKS_MIN_FOR_ATTRIBUTION: Final = 2
#: Timed block by block (``blocks-synchronized``): a synchronize ends at least this share of the
#: blocks that launched GPU work (below half, syncs are incidental: one per optimizer step ends a
#: few blocks at most; the window that ties a sync to a block is analyses/blocks.SYNC_AFTER_BLOCK_NS)...
BLOCKS_SYNCED_MIN_SHARE: Final = 0.5
#: ...and at least this many distinct synchronizes end blocks per step: one per step is the
#: loop's own (``loss.item()``, a step timer) and leaves the blocks inside the step free to
#: overlap, even when the step has one or two blocks and so half of them end at that sync.
BLOCKS_SYNCS_MIN_PER_STEP: Final = 2
#: A rank is the straggler when it arrives last at this share of matched collectives or more:
#: with two ranks chance alone gives one half, so ask for a clear majority...
STRAGGLER_MIN_LAST_SHARE: Final = 0.6
#: ...and the others wait for it at least this share of the step (less is timing noise).
STRAGGLER_MIN_LATE_SHARE: Final = 0.05
#: What the straggler was doing while the others waited: a slice is named when it was open for
#: at least this share of that window (and a block it spent longer in than the other ranks, when
#: the excess is this share of the wait), so what is named explains much of the wait, not a sliver.
STRAGGLER_DOING_MIN_SHARE: Final = 0.25
#: GPU compute per step this far above the median rank is imbalance: replicas of one model
#: (DDP) compute within a few percent of each other; more means uneven work per rank.
RANK_IMBALANCE_MIN_SHARE: Final = 0.10

# --- comparing runs (diff, check --baseline) -----------------------------------------------
#: Two-sided confidence of the interval for the change in median step time: the usual 95%.
#: The exact rank interval reaches at least this (96.8% at 5 vs 5 steps); below 4 steps a side
#: it cannot, and the verdict is "within noise".
DIFF_CONFIDENCE: Final = 0.95
#: A shift whose interval excludes zero but that is smaller than this share of A's median step
#: is still "within noise": the test treats the steps of one run as independent, but they share
#: that run's machine state (clocks, co-tenants, data order), which drifts between runs by about
#: this much on a quiet machine; no step of a single run can sample that drift.
DIFF_MIN_RELATIVE_CHANGE: Final = 0.02
#: Without steps on either side two captures are compared by their totals, with no interval to
#: tell noise apart: only a change this large is called faster or slower, and the statement says
#: the verdict holds only if both captured the same work.
DIFF_TOTALS_MIN_CHANGE: Final = 0.10

# --- several traces on one command line (findings/inputs_grouping.py) -------------------------
#: Two traces with the same step marker are runs of one program when at least this share of
#: their operator, kernel and annotation names (digits folded: "ProfilerStep#N") is common to
#: both (names in both over names in either). Measured on the real traces: runs of one program
#: share 71-100% (two resnet50 captures with 0 and 4 DataLoader workers 88%, a CPU loop and the
#: same loop with a planted slowdown 99%, HTA's trace-diff pair, one model on an A100 and on a
#: V100 whose kernels differ, 71%), traces of different programs 20-31% (HTA's A100 DDP trace
#: against its V100 DDP trace 20%, against a resnet50 capture 23%, against a CPU-only loop 31%):
#: a half lies in the gap with room on both sides.
SAME_PROGRAM_MIN_NAME_SHARE: Final = 0.5

# --- roofline (Nsight Compute verdicts per kernel, shape-based estimates per op) ---------------
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
#: Shape-based estimates: an op instance shorter than this (ns) that reaches less than
#: SHAPE_LATENCY_EFFICIENCY of its roof is dominated by launch and ramp-up latency (a few us
#: on current GPUs), not by its roof...
SHAPE_LATENCY_MAX_NS: Final = 10_000
#: ...below this share of the roof, latency rather than the roof explains the time.
SHAPE_LATENCY_EFFICIENCY: Final = 0.3

# --- torch.compile (findings/compile.py) ------------------------------------------------------
#: Graph breaks per steady step at or above this are a finding: one break already splits the
#: graph in two and runs Python between the halves.
GRAPH_BREAKS_MIN_PER_STEP: Final = 1.0
#: A frame recompiles "every step" when it recompiled in at least this many captured steps...
#: (one recompile is a change that happened once; two already repeat)
RECOMPILE_EVERY_STEP_MIN_STEPS: Final = 2
#: ...and in at least this share of the steps from its first recompile to the end of the capture
#: (a frame recompiled twice in a long run is two one-time costs, not a per-step one).
RECOMPILE_EVERY_STEP_MIN_SHARE: Final = 0.5
#: Many small regions: this many compiled-region runs per steady step... (the seeds' regression
#: had about 160 per forward; a model compiled per block has a few dozen at most)
MANY_REGIONS_MIN_PER_STEP: Final = 32.0
#: ...each shorter than this on average (ns): at tens of microseconds the guard check and the
#: AOT wrapper (a few us each) are a visible share of every region.
SMALL_REGION_MAX_NS: Final = 200_000

# --- pipelines (tracewhy pipeline) -----------------------------------------------------------
#: The gate on the median OverlapScore after warm-up: the seeds' pass mark for a two-stage
#: pipeline ("OverlapScore >= 0.30 after warm-up"); below it the stages mostly wait for each other.
PIPELINE_MIN_OVERLAP: Final = 0.30
#: A chunk whose period exceeds this multiple of the median is a spike worth naming: twice the
#: period means a whole extra chunk's time, which queueing noise does not produce.
PIPELINE_SPIKE_RATIO: Final = 2.0

# --- anti-patterns (findings/anti_patterns.py) ------------------------------------------------
#: An optimizer step runs a per-parameter loop when one op runs at least this many times per
#: step call with no multi-tensor op inside: with one parameter there is nothing to batch.
OPTIMIZER_LOOP_MIN_REPEATS: Final = 2.0
#: An anti-pattern whose predicted saving reaches this share of the step is medium, else low: the
#: medium line of the GPU idle classes (IDLE_CLASS_MIN_SHARE).
ANTI_PATTERN_MEDIUM_SHARE: Final = IDLE_CLASS_MIN_SHARE
#: Under this share of the step the saving is stated but not claimed (info, nothing recoverable):
#: a 4 us saving of a 3 ms step (a compiled CPU model's four-parameter SGD) is below the step
#: time's run-to-run spread and must not rank above a cause that costs seconds once.
ANTI_PATTERN_MIN_SHARE: Final = 0.01

# --- autograd in inference -----------------------------------------------------------------
#: A loop without backward is told its forward records autograd when the forward is at least
#: this share of the step (a loop whose forward is a sliver has other work to look at first).
INFERENCE_AUTOGRAD_MIN_SHARE: Final = 0.2
