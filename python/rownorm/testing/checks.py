"""Comparisons against the op table's truths, shared by the tests and ``python -m rownorm``.

Every check raises AssertionError with a message naming the op, the sample and the output.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from rownorm._checks import param_grad_dtype
from rownorm.testing.opinfo import ROW_INPUTS, TOL, OpInfo, Tol
from rownorm.testing.samples import randn


def assert_matches(out, expected, *, magnitude=None, dim=None, what="", tol: Tol | None = None):
    """``out`` equals ``expected`` within the dtype's tolerances (elementwise and relative).

    NaN must appear exactly where the expected value has it. Errors are measured relative to
    ``magnitude`` (default: ``expected``), per row along ``dim`` when given (else over the
    tensor): atol is a fraction of the row's largest |magnitude| and the relative error is
    ‖out − expected‖ / ‖magnitude‖ with both rescaled per row. A gradient passes the size of
    the terms it is computed from, since its true value may cancel to ~0.
    """
    assert out.shape == expected.shape, (
        f"{what}: shape {tuple(out.shape)} != {tuple(expected.shape)}"
    )
    assert out.dtype == expected.dtype, f"{what}: dtype {out.dtype} != {expected.dtype}"
    tol = TOL[out.dtype] if tol is None else tol
    o = out.detach().double()
    r = expected.detach().to(out.device).double()
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    assert torch.equal(nan_o, nan_r), (
        f"{what}: NaN at {int((nan_o & ~nan_r).sum())} elements where the reference has "
        f"none, missing at {int((nan_r & ~nan_o).sum())}"
    )
    if r.numel() == 0:
        return
    mag = r if magnitude is None else magnitude.detach().to(o.device).double().expand(r.shape)
    mag = torch.where(torch.isfinite(mag), mag, 0).abs()
    scale = mag.max() if dim is None else mag.amax(dim=dim, keepdim=True)
    # Below the dtype's smallest normal number the output's spacing is absolute (subnormals),
    # so a row's scale never drops below it: one subnormal step always passes.
    scale = torch.where(scale > 0, scale, 1.0).clamp_min(2 * torch.finfo(out.dtype).tiny)
    o, r, mag = o / scale, r / scale, mag / scale
    torch.testing.assert_close(
        o, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True,
        msg=lambda m: f"{what}: {m} (values divided by the largest |magnitude| of their row)",
    )  # fmt: skip
    finite = torch.isfinite(r)
    num = torch.linalg.vector_norm(o[finite] - r[finite]).item()
    den = torch.linalg.vector_norm(mag[finite]).item()
    err = num / den if den > 0 else num
    assert err <= tol.relerr, f"{what}: relative error {err:.3e} > {tol.relerr:.0e}"


def assert_new_contiguous(out: torch.Tensor, x: torch.Tensor, what: str = "") -> None:
    """The op's output contract: a new contiguous tensor of x's shape, dtype and device."""
    assert out.shape == x.shape, f"{what}: shape {tuple(out.shape)} != {tuple(x.shape)}"
    assert out.dtype == x.dtype, f"{what}: dtype {out.dtype} != {x.dtype}"
    assert out.device == x.device, f"{what}: device {out.device} != {x.device}"
    assert out.is_contiguous(), f"{what}: output strides {out.stride()} are not contiguous"
    if x.numel() > 0:
        assert out.data_ptr() != x.data_ptr(), f"{what}: the output aliases the input"


def assert_row_stat(stat: torch.Tensor, expected, bound, *, what: str = "") -> None:
    """A per-row statistic of an output is its known exact value within ``bound``."""
    stat = stat.double()
    expected = torch.as_tensor(expected, dtype=torch.float64, device=stat.device)
    if stat.numel() == 0:
        return
    err = (stat - expected).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64, device=stat.device).expand(err.shape)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {err.numel()} rows off, worst by "
        f"{(err - bound).max().item():.3e} beyond the bound"
    )


def _upcast(inp):
    half = (torch.float16, torch.bfloat16)
    return {k: v.float() if v.dtype in half else v for k, v in inp.items()}


def check_outputs(op: OpInfo, inp, dim: int, outs, *, what="", vs_torch=True, stat=True):
    """Checks outputs already computed: new contiguous tensors equal to the float64 reference
    and to the PyTorch expression, with the row property where the op has one.

    The PyTorch expression carries its own rounding errors, so against it the relative error
    is held to the elementwise rtol; ops whose torch expression computes in x's dtype
    (``op.torch_in_fp32``) are compared with it evaluated on float32 copies of 16-bit inputs.
    """
    assert isinstance(outs, tuple) and len(outs) == op.n_outputs, f"{op} {what}: outputs"
    for i, o in enumerate(outs):
        assert_new_contiguous(o, op.output_like(inp, i), f"{op} {what} output {i}")
    refs = op.reference(inp, dim)
    mags = [op.output_magnitude(inp, dim, refs[0])] + [None] * (len(refs) - 1)
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        assert_matches(
            o, r, magnitude=mags[i], dim=dim, what=f"{op} {what} output {i} vs reference"
        )
    if vs_torch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            expected = op.torch_equivalent(_upcast(inp) if op.torch_in_fp32 else inp, dim)
        for i, (o, t) in enumerate(zip(outs, expected, strict=True)):
            tol = TOL[o.dtype]
            tol = dataclasses.replace(tol, relerr=max(tol.relerr, tol.rtol))
            what_i = f"{op} {what} output {i} vs torch"
            assert_matches(o, t.to(o.dtype), magnitude=mags[i], dim=dim, what=what_i, tol=tol)
    if stat and (s := op.row_stat(outs[0], inp, dim)) is not None:
        assert_row_stat(*s, what=f"{op} {what} row property")
    return outs


def check_forward(op: OpInfo, inp, dim: int, *, what="", vs_torch=True, stat=True):
    """Runs the public function and checks its outputs (:func:`check_outputs`)."""
    return check_outputs(op, inp, dim, op.call(inp, dim), what=what, vs_torch=vs_torch, stat=stat)


def random_grads(outs) -> tuple[torch.Tensor, ...]:
    return tuple(randn(o.shape, o.dtype, o.device) for o in outs)


def autograd_grads(op: OpInfo, inp, dim: int, dys=None, *, frozen=()):
    """Forward + backward through autograd; returns (outputs, dys, {name: grad or None})."""
    leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in inp.items()}
    outs = op.call(leaves, dim)
    dys = random_grads(outs) if dys is None else dys
    wrt = [k for k in leaves if k not in frozen]
    used = [(o, g) for o, g in zip(outs, dys, strict=True) if g is not None]
    grads = torch.autograd.grad(
        [o for o, _ in used], [leaves[k] for k in wrt], [g for _, g in used], allow_unused=True
    )
    return outs, dys, dict(zip(wrt, grads, strict=True))


def reference_grads(op: OpInfo, inp, dim: int, dys) -> tuple[dict, dict]:
    """(reference gradients, their magnitudes) for the output gradients ``dys``.

    The reference takes the parameters in float64 (same values), so that its parameter
    gradients are not rounded to a 16-bit parameter dtype before a float32 one is compared."""
    ref_inp = {k: (v if k in ROW_INPUTS else v.double()) for k, v in inp.items()}
    return op.reference_grads(dys, ref_inp, dim), op.grad_magnitudes(dys, inp, dim)


def check_grads(op: OpInfo, inp, dim: int, dys, got: dict, *, what: str = "", refs=None) -> None:
    """Every gradient in ``got`` (None: not computed) equals the float64 reference backward,
    errors measured against the terms it is computed from (``op.grad_magnitudes``);
    ``refs``: :func:`reference_grads` already computed for these ``dys``."""
    refs, mag = reference_grads(op, inp, dim, dys) if refs is None else refs
    n = inp["x"].shape[dim] if inp["x"].dim() else 0
    for name, g in got.items():
        if g is None:
            continue
        label = f"{op} {what} d{name}"
        if name in ROW_INPUTS:
            assert_new_contiguous(g, inp[name], label)
            assert_matches(g, refs[name].to(g.dtype), magnitude=mag[name], dim=dim, what=label)
        else:
            assert g.shape == (n,), f"{label}: shape {tuple(g.shape)}"
            tol = param_grad_tol(g.dtype, n)
            assert_matches(g, refs[name].to(g.dtype), magnitude=mag[name], what=label, tol=tol)


def param_grad_tol(dtype: torch.dtype, n: int) -> Tol:
    """The tolerance of a parameter gradient (dweight, dbias) of rows of n elements.

    Its every column carries the error of its rows' statistics (r, μ), sums of n terms in the
    accumulator: sequential in part (a thread's share of a strided-dim row, up to n / 8
    terms), so their relative error grows like eps·sqrt(n), past the tensor-wide relerr of a
    single rounding for long rows (float32, n = 32768: 1.06e-6 measured on the H100)."""
    tol = TOL[dtype]
    return dataclasses.replace(tol, relerr=max(tol.relerr, torch.finfo(dtype).eps * n**0.5 / 2))


def noisy_grads(op: OpInfo, inp, dim: int) -> tuple[str, ...]:
    """The gradients that are rounding noise for these inputs, not compared with the reference:
    layer_norm's dweight where a row is constant (ŷ = (x − μ)·rsqrt(eps) is then μ's rounding
    error in the accumulator, amplified by rsqrt(eps); torch's float32 kernels alike)."""
    x = inp["x"]
    if op.name != "layer_norm" or "weight" not in inp or x.numel() == 0 or x.shape[dim] < 2:
        return ()
    return ("weight",) if bool((x.amax(dim) == x.amin(dim)).any()) else ()


def check_backward(op: OpInfo, inp, dim: int, *, what: str = "", raw: bool = True):
    """Autograd's gradient of every input (of its dtype and shape) and, with ``raw``, the
    ``*_backward`` op's (parameter gradients in the dtype the parameters run in) against the
    reference (but the :func:`noisy_grads`). Returns (outputs, dys, autograd's gradients)."""
    outs, dys, got = autograd_grads(op, inp, dim)
    skip = noisy_grads(op, inp, dim)
    for name, g in got.items():
        assert g is not None, f"{op} {what}: no gradient for {name}"
        assert g.dtype == inp[name].dtype and g.shape == inp[name].shape, f"{op} {what} d{name}"
    refs = reference_grads(op, inp, dim, dys)
    compared = {k: v for k, v in got.items() if k not in skip}
    check_grads(op, inp, dim, dys, compared, what=what + " autograd", refs=refs)
    if raw:
        want = frozenset(p for p in op.params if p in inp)
        detached = tuple(o.detach() for o in outs)
        got_raw = op.raw_backward(dys, inp, dim, detached, want)
        # The parameters run as x's would (on add_rms_norm's float32 residual stream too).
        grad_dtype = param_grad_dtype(inp["x"], inp.get("weight"), bias_grad_op="bias" in inp)
        for name in want:
            assert got_raw[name].dtype == grad_dtype, (
                f"{op} {what} raw d{name}: {got_raw[name].dtype}"
            )
        compared = {k: v for k, v in got_raw.items() if k not in skip}
        check_grads(op, inp, dim, dys, compared, what=what + " raw backward", refs=refs)
    return outs, dys, got


def assert_same_specials(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """NaN, +inf and -inf at the same elements."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    for name, is_it in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        g, w = is_it(got), is_it(want)
        assert torch.equal(g, w), (
            f"{what}: {name} at {int((g & ~w).sum())} elements where the other has none, "
            f"missing at {int((w & ~g).sum())}"
        )


def torch_grads(op: OpInfo, inp, dim: int, dys, device=None):
    """The torch expression's outputs and input gradients (on ``device``, default the inputs'),
    in the inputs' dtypes; 16-bit inputs on float32 copies where the op table says torch's
    expression rounds to 16 bits (``op.torch_in_fp32``), on the CPU where torch's CUDA kernel
    differs on rows holding ±inf (``op.torch_cuda_nan_inf_rows``). Inputs torch's expression
    does not use have no gradient."""
    half = (torch.float16, torch.bfloat16)
    target = torch.device(device) if device is not None else inp["x"].device
    run_on = target
    if (
        op.torch_cuda_nan_inf_rows
        and target.type == "cuda"
        and any(torch.isinf(v).any() for v in inp.values())
    ):
        run_on = torch.device("cpu")
    leaves = {
        k: (v.float() if op.torch_in_fp32 and v.dtype in half else v)
        .to(run_on)
        .detach()
        .requires_grad_(True)
        for k, v in inp.items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        outs = op.torch_equivalent(leaves, dim)
    dys = tuple(d.to(device=o.device, dtype=o.dtype) for d, o in zip(dys, outs, strict=True))
    got = torch.autograd.grad(outs, list(leaves.values()), dys, allow_unused=True)
    grads = {
        k: g.to(target, inp[k].dtype) for k, g in zip(leaves, got, strict=True) if g is not None
    }
    return tuple(o.detach().to(target, inp["x"].dtype) for o in outs), grads
