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
