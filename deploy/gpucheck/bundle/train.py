"""train: ResNet-50 training on synthetic data in FP16 (autocast), as cGPU's
published table runs it. Prints "ready" after the warm-up steps, then
"progress <unix time> <images trained> <device ms>" about four times a second
and "images_per_sec <rate>" at the end. Device ms sums each step's span on
the GPU, between CUDA events recorded before and after the step."""
import argparse
import time

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--seconds", type=float, default=30)
p.add_argument("--warmup", type=int, default=8)
a = p.parse_args()

# cuDNN's heuristics, not its autotuner: two trainers that time algorithms
# while sharing the GPU can pick different ones, and then their steps differ
# in device time and their images/s no longer compare their shares.
torch.backends.cudnn.benchmark = False
model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(a.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (a.batch,), device="cuda")


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
print("ready", flush=True)
images, start, last = 0, time.time(), 0.0
device_ms, pending = 0.0, []


def device_time():
    """Adds the finished steps' spans; the caller has synchronized."""
    global device_ms
    for s, e in pending:
        device_ms += s.elapsed_time(e)
    pending.clear()


while time.time() - start < a.seconds:
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    step()
    e.record()
    pending.append((s, e))
    images += a.batch
    if time.time() - last >= 0.25:
        torch.cuda.synchronize()  # count finished work only
        device_time()
        last = time.time()
        print(f"progress {last:.3f} {images} {device_ms:.3f}", flush=True)
torch.cuda.synchronize()
device_time()
end = time.time()
print(f"progress {end:.3f} {images} {device_ms:.3f}", flush=True)
print(f"images_per_sec {images / (end - start):.1f}", flush=True)
