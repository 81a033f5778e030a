"""torch_quota: PyTorch under an 8 GiB quota. Prints one JSON line: the total
and free memory PyTorch sees, whether a 7 GiB tensor fits, and what a 2 GiB
tensor beside it gives (PyTorch's OutOfMemoryError is the right answer).
PYTORCH_CUDA_ALLOC_CONF picks the allocator (caching, cudaMallocAsync,
expandable segments)."""
import json

import torch

GiB = 1 << 30
out = {}
try:
    out["free"], out["total"] = torch.cuda.mem_get_info()
    held = torch.empty(7 * GiB, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    out["fit7"] = "ok"
except Exception as ex:  # reported, not raised: the check goes on
    out["fit7"] = f"{type(ex).__name__}: {ex}"[:300]
try:
    more = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    more.fill_(1)
    torch.cuda.synchronize()
    out["over"] = "ok"
except torch.OutOfMemoryError as ex:
    out["over"] = "OutOfMemoryError"
    out["over_msg"] = str(ex)[:300]
except Exception as ex:
    out["over"] = f"{type(ex).__name__}: {ex}"[:300]
print(json.dumps(out), flush=True)
