# simgpu's h200 model (SIMGPU_MODEL=h200): its built-in values. A file of
# this form named by SIMGPU_PROFILE overrides them; the GPU check's
# calibration part writes one measured on a real GPU (docs/simgpu.md).
# Each line is "key = value", a decimal integer, with an optional comment.

# NVML's per-process utilization is a sample stream: one sample a period,
# crediting the one process on the engine at its instant. NVIDIA's NVML
# reference gives the sample period as 1/6 s to 1 s depending on the
# product. At 1/6 s the model reproduces the shares the H200 run of
# docs/gpu-check measured; no GPU run has measured the period yet (the
# calibration part does).
nvml_sample_period_us = 166667  # NVIDIA's documentation: 1/6 s, the shortest period it names

# The time slice the hardware gives each context with pending work before
# switching: NVIDIA's default for a channel group, Volta and later.
time_slice_ns = 1024000  # NVIDIA's documentation: the default time slice, 1024 us

# A kernel launch's host time on the H200 run of docs/gpu-check (2026-11-30,
# driver 580.159.04; gw-bench's loop, median of 7 alternating rounds).
launch_capture_ns = 704   # into a capturing stream
launch_exec_ns = 3205     # executed, a sync every 100 launches

# What a launch leaves pending as it returns (a graph node or pushbuffer
# entries on cold lines, a doorbell write): a locked instruction right after
# it waits for these. With them a small program's locked add after a
# "launch" waited +169 ns; the H200 showed +153 ns capturing, +88 executed.
launch_cold_lines = 2     # cache lines written on memory no cache holds
launch_nt_bytes = 128     # bytes of non-temporal stores
