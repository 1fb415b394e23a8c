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


for dt in (torch.bfloat16, torch.float32):
    a, b, c = (torch.randn(1 << 27, device="cuda", dtype=dt) for _ in range(3))
    by = a.numel() * a.element_size()
    res = {"copy": [], "add": []}
    for _ in range(5):
        res["copy"].append(timeit(lambda: c.copy_(a)))
        res["add"].append(timeit(lambda: torch.add(a, b, out=c)))
    tc, ta = sorted(res["copy"])[2], sorted(res["add"])[2]
    print(f"{dt}: copy {tc:.1f} us {2 * by / tc / 1e3:.0f} GB/s | add {ta:.1f} us {3 * by / ta / 1e3:.0f} GB/s")
