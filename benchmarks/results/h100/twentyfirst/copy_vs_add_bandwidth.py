"""Bandwidth of torch's copy (1 read, 1 write) and add (2 reads, 1 write) on 2^27 bf16 and fp32
elements: the ceiling of a backward that reads x and dy and writes dx."""

import torch


def timeit(f, iters=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f()
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / iters


def measure(dt: torch.dtype) -> None:
    a, b, c = (torch.randn(1 << 27, device="cuda", dtype=dt) for _ in range(3))
    by = a.numel() * a.element_size()
    res = {"copy": [], "add": []}
    for _ in range(5):
        res["copy"].append(timeit(lambda: c.copy_(a)))
        res["add"].append(timeit(lambda: torch.add(a, b, out=c)))
    tc, ta = sorted(res["copy"])[2], sorted(res["add"])[2]
    copy_rate, add_rate = 2 * by / tc / 1e3, 3 * by / ta / 1e3
    print(f"{dt}: copy {tc:.1f} us {copy_rate:.0f} GB/s | add {ta:.1f} us {add_rate:.0f} GB/s")


for dt in (torch.bfloat16, torch.float32):
    measure(dt)
