"""One fused fwd+bwd of layer_norm on 16-bit rows of the 4-pack clusters (8 and 16 CTAs) and of
the 2-CTA 8-pack ones, with enough rows for the fused plan, for compute-sanitizer."""
import torch
import rownorm

for dtype in (torch.bfloat16, torch.float16):
    for n in (40968, 122888, 24576):
        rows = 64
        while rownorm.explain(torch.empty(rows, n, device="cuda", dtype=dtype), "layer_norm", backward=True, param_grads=True).param_grads != "fused":
            rows = rows * 3 // 2
        rows += 17
        x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        y = rownorm.layer_norm(x, w, b)
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        print(dtype, n, rows, rownorm.explain(x.detach(), "layer_norm", backward=True, param_grads=True).raw, flush=True)
