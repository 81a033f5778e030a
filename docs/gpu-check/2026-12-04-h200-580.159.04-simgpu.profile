# simgpu profile measured by the GPU check's calibration part (NVIDIA's driver), 2026-12-04 07:01 UTC.
# Use: SIMGPU_MODEL=h200 SIMGPU_PROFILE=<this file> (docs/simgpu.md).

# not modeled by simgpu yet:
# event_record_ns = 205  # calibrate costs: host clock over 100000 calls in a row, one process alone
# not modeled by simgpu yet:
# event_query_ns = 1460  # calibrate costs: host clock over 100000 calls in a row, one process alone
# not modeled by simgpu yet:
# stream_is_capturing_ns = 26  # calibrate costs: host clock over 100000 calls in a row, one process alone
launch_capture_ns = 1557  # calibrate costs: host clock over 20000 empty-kernel launches into a capturing stream
launch_exec_ns = 4113  # calibrate costs: host clock over 20000 empty-kernel launches, a sync every 100 included
nvml_sample_period_us = 200248  # calibrate nvml: median gap between NVML per-process sample instants, read every 10 ms for 3 s, one process busy and one idle (15 samples)
# not modeled by simgpu yet:
# context_switch_ns = 154624  # calibrate run --records: median hole by %globaltimer between one process's stretch on the engine and the other's (1357 switches)
time_slice_ns = 2091008  # calibrate run --records: median stretch a 20 ms kernel ran on the engine by %globaltimer beside a process of 50 us kernels (678 stretches)
