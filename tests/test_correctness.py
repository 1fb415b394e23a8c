"""Forward and backward of every op case against its float64 reference and the PyTorch
expression it replaces, on the op table's sample inputs.

Specification (DESIGN §2, the op contract): each op returns NEW CONTIGUOUS tensors of x's
shape and dtype, equal to ``F.normalize(x, p=2 / 1)`` / ``x / mean|x|`` / ``F.rms_norm`` /
``F.layer_norm`` / ``torch.softmax`` / ``torch.log_softmax`` / ``r = x + residual;
(F.rms_norm(r), r)`` with the reduction over ``dim``; the backward ops return dx (new,
contiguous, x's dtype) and parameter gradients in the accumulator's dtype; autograd gives
every input its gradient in its own dtype.

Why the grid is what it is: one test id per (op case, dtype, device); the op table's samples
(odd N, misaligned and strided rows, stride-0 rows, other dims, zero rows, spread norms,
float32 parameters with 16-bit x) are iterated inside it, the way PyTorch's OpInfo tests
iterate ``sample_inputs``: a failure names the sample. The tier edges (test_tier_edges),
layouts per arity (test_routing) and reduced dims (test_strided_dim) have their own files.
Rarer properties (poisoned outputs, empty tensors, parameter dtypes, eps, special values) are
one id per op (or op family) and device, their cases iterated inside.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import rownorm
import torch
from utils import (
    DIM_CASES,
    DTYPES,
    EMPTY_CASES,
    LAYOUTS,
    OPS,
    TOL,
    assert_matches,
    assert_new_contiguous,
    assert_row_stat,
    check_backward,
    check_forward,
    cuda_only,
    dtype_id,
    families,
    param_grad_dtype,
    poison_blocks,
    randn,
    raw_case,
    scaled_rows,
)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
all_ops = pytest.mark.parametrize("op_id", OPS)
PARAM_OPS = [op_id for op_id, op in OPS.items() if op.params]

# F.rms_norm warns that a float32 weight with 16-bit x takes its unfused path.
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _vs_torch(op, inp, device) -> bool:
    """torch's CUDA layer_norm rejects float32 parameters with 16-bit x (its CPU one takes
    them); every other pairing is comparable."""
    p, x = inp.get("weight", inp.get("bias")), inp["x"]
    if op.name != "layer_norm" or p is None or p.dtype == x.dtype:
        return True
    half = x.dtype in (torch.float16, torch.bfloat16)
    return torch.device(device).type == "cpu" and p.dtype == torch.float32 and half


@all_ops
@dtypes
def test_samples(device, op_id, dtype):
    """Every sample: outputs vs reference, torch and the row property; the raw op and the
    module equal to the public function; gradients by autograd and by the backward op."""
    op = OPS[op_id]
    for desc, inp, dim in op.sample_inputs(device, dtype):
        outs = check_forward(op, inp, dim, what=desc, vs_torch=_vs_torch(op, inp, device))
        for i, o in enumerate(op.raw(inp, dim)):
            assert torch.equal(o, outs[i]), f"{op} {desc}: raw op output {i} differs"
        module = op.module(inp, dim)
        if module is not None and all(p.dtype == inp["x"].dtype for p in module.parameters()):
            got = module(*[inp[k] for k in op.row_inputs])
            for i, o in enumerate(got if isinstance(got, tuple) else (got,)):
                assert torch.equal(o, outs[i]), f"{op} {desc}: module output {i} differs"
        check_backward(raw_case(op, inp["x"]), inp, dim, what=desc)


# ---------------------------------------------------------------------------------------------
# Every output element is written


@all_ops
def test_poisoned_outputs(device, op_id):
    """Outputs and gradients are allocated from NaN-filled blocks: any element a kernel does
    not write stays NaN. Row layouts (aligned, misaligned, copied) and strided dims."""
    op = OPS[op_id]
    builders = [(LAYOUTS[k], (19, n)) for k in ("contiguous", "odd_offset", "transposed")
                for n in (7, 1025)]  # fmt: skip
    builders += [(DIM_CASES[k], (n,)) for k in ("middle", "nchw_wide", "first") for n in (33, 65)]
    cpu = torch.device(device).type == "cpu"
    if cpu:  # (the allocator's reuse is best effort there, and one loop serves every layout)
        builders = builders[:2] + builders[6:7]
    # (float16 writes as bfloat16 does: the same element size)
    for dtype in DTYPES[:1] if cpu else (torch.float32, torch.bfloat16, torch.float64):
        for build, args in builders:
            x, dim = build(*args, dtype, device)
            if not op.supports(x, dim):
                continue
            inp = op.inputs(x, dim)
            case = raw_case(op, x)
            outs_like = [op.output_like(inp, i).dtype for i in range(op.n_outputs)]
            ptrs = poison_blocks([(x.shape, dt) for dt in outs_like + [x.dtype]], device)
            outs = case.call(inp, dim)
            what = f"{op} {dtype_id(dtype)} {build.__name__}{args}"
            for i, (o, r) in enumerate(zip(outs, case.reference(inp, dim), strict=True)):
                if o.is_cuda:
                    assert o.data_ptr() in ptrs, "the allocator did not hand back a poisoned block"
                assert not torch.isnan(o).any(), f"{what}: output {i} has unwritten elements"
                assert_matches(o, r, magnitude=case.output_magnitude(inp, dim, r) if i == 0
                               else None, dim=dim, what=what)  # fmt: skip
            dys = tuple(randn(o.shape, o.dtype, device) for o in outs)
            n = x.shape[dim]
            # dx in x's dtype; add_rms_norm's d_r in r's (on the float32 residual stream both)
            rows = [(x.shape, dt) for dt in dict.fromkeys(outs_like)]
            poison_blocks(rows * 2 + [((n,), param_grad_dtype(inp))] * 3, device)
            got = case.raw_backward(dys, inp, dim, outs, frozenset(op.params))
            for name, g in got.items():
                assert not torch.isnan(g).any(), f"{what}: d{name} has unwritten elements"


# ---------------------------------------------------------------------------------------------
# Empty tensors


@all_ops
def test_empty(device, op_id):
    """No rows, no columns or neither: empty outputs and dx; the parameter gradients of a batch
    without rows are zeros of shape (N,)."""
    op = OPS[op_id]
    for shape, dim in EMPTY_CASES:
        for dtype in DTYPES:
            x = torch.empty(shape, dtype=dtype, device=device)
            if not op.supports(x, dim):
                continue
            inp = op.inputs(x, dim)
            case = raw_case(op, x)
            outs = case.raw(inp, dim)
            assert len(outs) == op.n_outputs
            for i, o in enumerate(outs):
                assert_new_contiguous(o, op.output_like(inp, i), f"{op} {shape}")
            dys = tuple(torch.empty_like(o) for o in outs)
            got = case.raw_backward(dys, inp, dim, outs, frozenset(op.params))
            assert_new_contiguous(got["x"], x, f"{op} {shape} dx")
            for name in op.params:
                assert got[name].shape == (x.shape[dim],)
                assert got[name].dtype == param_grad_dtype(inp)
                assert torch.count_nonzero(got[name]) == 0, f"d{name} of no rows is not zero"
            leaves = {k: v.clone().requires_grad_(True) for k, v in inp.items()}
            sum(o.sum() for o in op.call(leaves, dim)).backward()
            for k, leaf in leaves.items():
                assert leaf.grad is not None and leaf.grad.shape == leaf.shape, k


# ---------------------------------------------------------------------------------------------
# Parameters: absent, of x's dtype, float32 with 16-bit x, other dtypes (converted exactly)

# (x dtype, parameter dtype): float32 parameters with 16-bit x are the mixed-precision case; any
# other pairing is converted exactly by the binding (to float32, or x's dtype for float32/64 x).
# float64 parameters with other x would be rounded: rejected (test_errors.py).
PARAM_DTYPES = [
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16),
    (torch.float64, torch.float32),
    (torch.float64, torch.bfloat16),
    (torch.float32, torch.bfloat16),
]


@pytest.mark.parametrize("op_id", PARAM_OPS)
def test_param_dtypes(device, op_id):
    """Outputs in x's dtype, gradients in each parameter's dtype, for every pairing; on rows
    and (for ops with a dim) on a strided dim."""
    op = OPS[op_id]
    for x_dtype, p_dtype in PARAM_DTYPES:
        cases = [(scaled_rows(7, n, x_dtype, device), -1) for n in (7, 1025)]
        if not op.last_dim_only:
            cases.append(DIM_CASES["nchw_channels"](33, x_dtype, device))
        for x, dim in cases:
            inp = op.inputs(x, dim, param_dtype=p_dtype)
            what = f"{dtype_id(x_dtype)} x, {dtype_id(p_dtype)} params, {tuple(x.shape)}"
            outs = check_forward(op, inp, dim, what=what, vs_torch=_vs_torch(op, inp, device))
            assert all(o.dtype == op.output_like(inp, i).dtype for i, o in enumerate(outs))
            if p_dtype != torch.float32:
                continue  # (a gradient in a parameter dtype finer than the accumulator's)
            _, _, got = check_backward(raw_case(op, x), inp, dim, what=what)
            for p in op.params:
                assert got[p].dtype == p_dtype


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_layer_norm_mixed_param_dtypes(device, x_dtype):
    """A weight and a bias of different dtypes (the forward runs both in float32), and a
    float32 bias alone: every gradient in its parameter's dtype and, through autograd, not
    rounded to the 16-bit one's first (the backward op returns dbias in the dtype it reads off
    the weight, so autograd passes the weight in float32 here); the raw backward's dtypes are
    rownorm._checks.param_grad_dtype's."""
    x = scaled_rows(7, 1025, x_dtype, device)
    affine = OPS["layer_norm_affine"]
    cases = [
        (affine, {"weight": x_dtype, "bias": torch.float32}),
        (affine, {"weight": torch.float32, "bias": x_dtype}),
        (dataclasses.replace(affine, params=("bias",)), {"bias": torch.float32}),
    ]
    for op, dtypes in cases:
        inp = op.inputs(x, -1)
        for name, dt in dtypes.items():
            inp[name] = inp[name].to(dt)
        what = ", ".join(f"{dtype_id(dt)} {name}" for name, dt in dtypes.items())
        _, _, got = check_backward(raw_case(op, x), inp, -1, what=what)
        for name, dt in dtypes.items():
            assert got[name].dtype == dt, f"{what}: d{name} is {got[name].dtype}"


def test_layer_norm_one_param(device):
    """layer_norm with a weight only or a bias only, on rows and a strided dim."""
    for params in (("weight",), ("bias",)):
        op = dataclasses.replace(OPS["layer_norm_affine"], params=params)
        for dtype in DTYPES:
            for x, dim in ((randn((19, 257), dtype, device), -1),
                           DIM_CASES["middle"](33, dtype, device)):  # fmt: skip
                inp = op.inputs(x, dim)
                check_forward(op, inp, dim, what=str(params))
                check_backward(op, inp, dim, what=str(params))


# ---------------------------------------------------------------------------------------------
# eps: zero, clamping, added to the statistic; the default


@pytest.mark.parametrize("op_id", [k for k, op in OPS.items() if op.has_eps])
def test_eps_zero(device, op_id):
    """eps = 0: a zero row divides 0 by 0 and gives NaN exactly where the torch expression
    (x / mean|x|, F.rms_norm(eps=0), ...) does; the other rows are finite."""
    op = dataclasses.replace(OPS[op_id], eps=0.0)
    for dtype in DTYPES:
        for n in (1, 7, 1025):
            x = randn((13, n), dtype, device)
            inp = op.with_zero_rows(op.inputs(x, -1), -1)
            (y, *_) = check_forward(op, inp, -1, what=f"N={n}", stat=False)
            assert torch.isnan(y[::3]).all()
            if not (op.name == "layer_norm" and n == 1):  # (a row of one has zero variance)
                assert not torch.isnan(y[1::3]).any()


@pytest.mark.parametrize("op_id", ["l2_normalize", "l1", "mean_abs"])
def test_normalize_eps_clamps_small_rows(device, op_id):
    """Rows whose norm s is below eps are divided by eps (F.normalize's clamp), with gradient
    dy / eps; the others are normalized. Scales stay a factor 2 from the clamp's kink."""
    base = OPS[op_id]
    norm = {"l2_normalize": lambda t: torch.linalg.vector_norm(t, dim=-1, keepdim=True)}.get(
        op_id, lambda t: t.abs().sum(-1, keepdim=True) / (t.shape[-1] if base.mean else 1)
    )
    for dtype in DTYPES:
        for eps in (0.5, 7.0):
            op = dataclasses.replace(base, eps=eps)
            for n in (1, 7, 1025):
                x = randn((16, n), torch.float64, "cpu")
                scales = torch.tensor([0.1, 0.45, 3.0, 20.0], dtype=torch.float64).repeat(4)
                x = x / norm(x) * eps * scales[:, None]
                x[8] = 0
                x = x.to(device=device, dtype=dtype)
                (y,) = check_forward(op, {"x": x}, -1, what=f"eps={eps} N={n}")
                _, dys, got = check_backward(op, {"x": x}, -1, what=f"eps={eps} N={n}")
                small = norm(x.double()).squeeze(-1) < eps
                assert small.any() and (~small).any()
                what = f"{op} clamped rows eps={eps} N={n}"
                assert_matches(y[small], (x[small].double() / eps).to(dtype), dim=-1, what=what)
                dx = (dys[0][small].double() / eps).to(dtype)
                assert_matches(got["x"][small], dx, dim=-1, what=what + " dx")


@pytest.mark.parametrize("op_id", ["rms_norm", "layer_norm"])
def test_norm_eps(device, op_id):
    """eps is added to mean(x²) / the variance: it matters for rows of small magnitude."""
    for eps in (1e-6, 0.1, 10.0):
        op = dataclasses.replace(OPS[op_id], eps=eps)
        for dtype in DTYPES:
            x = scaled_rows(19, 255, dtype, device)
            check_forward(op, {"x": x}, -1, what=f"eps={eps}")
            check_backward(op, {"x": x}, -1, what=f"eps={eps}")


def test_layer_norm_constant_rows(device):
    """A constant row has zero variance: the output is exactly the bias (zero without one)."""
    for dtype in DTYPES:
        for c in (0.0, 2.0, -0.5):
            for n in (1, 1025):
                x = torch.full((5, n), c, dtype=dtype, device=device)
                op = OPS["layer_norm_affine"]
                check_forward(op, op.inputs(x, -1), -1, what=f"c={c}")
                check_forward(OPS["layer_norm"], {"x": x}, -1, what=f"c={c}")


def test_layer_norm_slices_of_different_means(device):
    """Rows whose quarters have means 300, -250, 1000 and 5 (plus unit noise): on the cluster
    tier each CTA's slice has its own mean, and the row's variance must include the spread of
    those means as well as each slice's own spread (what a per-CTA statistic merged across the
    cluster gets wrong when it drops a term; on the wide CTA, whose threads' (count, mean, M2)
    are merged in one all-reduce, each thread's values too). Lengths reach the CTA tier, the
    wide CTA and clusters of 2 to 16 CTAs, aligned and odd."""
    gen = torch.Generator().manual_seed(0)
    offsets = torch.tensor([300.0, -250.0, 1000.0, 5.0], dtype=torch.float64)
    shapes = {
        torch.float32: (8000, 12001, 16384, 20000, 65535, 131072),
        torch.bfloat16: (30001, 32768, 40000, 65536, 262144),
    }
    for dtype, ns in shapes.items():
        for n in ns:
            x = torch.randn(3, n, dtype=torch.float64, generator=gen)
            x += offsets[torch.arange(n) * 4 // n]
            x = x.to(dtype).to(device)
            op = OPS["layer_norm_affine"]
            check_forward(op, op.inputs(x, -1), -1, what=f"{dtype_id(dtype)} n={n}")


def test_layer_norm_constant_rows_inexact_sum(device):
    """Constant rows whose Σx/n rounds (float32 on CUDA, float64 on both): y = 0 and
    dx = (dy − mean dy)/sqrt(eps) as in torch's F.layer_norm (x − μ = 0 exactly; all NaN for
    eps = 0), not the ±1 that a mean off by one rounding gives (x − μ = ±δ, var = δ² ≫ eps).
    Lengths reach the group, CTA, wide CTA and cluster tiers. (dx from the formula: torch's own
    float64 backward computes x·r − μ·r, which cancels catastrophically at |x| = 1e20.)"""
    cases = [(0.1, 0.0), (0.1, 1e-5), (1e20, 1e-5), (-3.3e4, 1e-5), (12345.678, 0.0)]
    for (c, eps), dtype, n in itertools.product(
        cases, (torch.float32, torch.float64), (7, 1000, 4097, 12000, 40000)
    ):
        what = f"c={c} eps={eps} {dtype_id(dtype)} n={n}"
        x = torch.full((3, n), c, dtype=dtype, device=device)
        dy = randn(x.shape, dtype, device)
        leaf = x.clone().requires_grad_(True)
        y = rownorm.layer_norm(leaf, eps=eps)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        if eps == 0:
            assert torch.isnan(y).all() and torch.isnan(dx).all(), what
            continue
        assert torch.count_nonzero(y) == 0, f"{what}: max |y| = {y.abs().max().item()}"
        dy64 = dy.double()
        dx_ref = (dy64 - dy64.mean(-1, keepdim=True)) / eps**0.5
        assert_matches(dx, dx_ref.to(dtype), magnitude=dy64.abs() / eps**0.5, dim=-1, what=what)


@pytest.mark.parametrize("op_id", ["rms_norm", "add_rms_norm"])
def test_default_eps_is_torchs(device, op_id):
    """eps=None is F.rms_norm's / torch.nn.RMSNorm's default: the machine epsilon of the
    computation type (float32 for 16-bit and float32 x, float64 for float64 x). Rows of rms
    ~ 1e-3 make the difference visible: eps matters next to mean(x²) ~ 1e-6."""
    op = OPS[op_id]
    for dtype in DTYPES:
        x = randn((6, 64), dtype, device) * 1e-3
        check_forward(op, op.inputs(x, -1), -1, what="rms 1e-3")
        if op_id == "rms_norm":
            expected = torch.nn.RMSNorm(64, elementwise_affine=False)(x)
            got = rownorm.nn.RMSNorm(64, elementwise_affine=False)(x)
            assert_matches(got, expected, dim=-1, what="module")


@pytest.mark.parametrize("fn", ["rms_norm", "add_rms_norm"])
def test_casting_modes(device, fn):
    """casting_mode="llama" rounds ŷ to x's dtype before the weight: the same result as "once"
    for float64 x (the rounding is the identity there), another one for 16-bit x; both keep
    x's dtype with a float32 weight (torch's promotion would give float32). Gemma's offset is
    added in float32: a bf16 weight near 0 keeps its low bits in 1 + w."""
    call = getattr(rownorm, fn)
    for dtype in DTYPES:
        x = randn((9, 96), dtype, device)
        args = (x, randn(x.shape, dtype, device)) if fn == "add_rms_norm" else (x,)
        for w_dtype in {dtype, torch.float32}:
            w = (1 + 0.1 * randn((96,), torch.float32, device)).to(w_dtype)
            once = call(*args, w, eps=1e-6)
            llama = call(*args, w, eps=1e-6, casting_mode="llama")
            once, llama = (once[0], llama[0]) if fn == "add_rms_norm" else (once, llama)
            assert once.dtype == llama.dtype == dtype
            if dtype != torch.float32:  # float32: rounded where the kernel computes in float64
                assert torch.equal(once, llama) == (dtype == torch.float64), (dtype, w_dtype)
    x = randn((9, 96), torch.bfloat16, device)
    args = (x, torch.zeros_like(x)) if fn == "add_rms_norm" else (x,)
    w = (1e-3 * randn((96,), torch.float32, device)).to(torch.bfloat16)
    out = call(*args, w, eps=1e-6, weight_offset=1.0)
    out = out[0] if fn == "add_rms_norm" else out
    xf = x.float()
    yhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    exact = (yhat * (1.0 + w.float())).to(torch.bfloat16)  # Gemma's expression
    rounded = (yhat * (1 + w).float()).to(torch.bfloat16)  # 1 + w made in bf16 first
    assert (out != exact).float().mean() < 0.01
    assert not torch.equal(exact, rounded), "the probe must tell the two apart"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_residual_stream_backward_ops_agree(device, x_dtype):
    """On the float32 residual stream add_rms_norm_stream_backward (what autograd runs) returns
    add_rms_norm_backward's d_r and dweight bit for bit, and x's gradient: d_r rounded to x's
    dtype, written by the same pass; on every tier (rows of 96 to 32768, grad_residual given or
    not, dweight requested or not, odd row counts and a misaligned row start). dweight has the
    weight's dtype: the parameters run as x's would (x's dtype, or float32)."""
    stream_op = torch.ops.rownorm.add_rms_norm_stream_backward.default
    op = torch.ops.rownorm.add_rms_norm_backward.default
    shapes = [(9, 96), (33, 1000), (16, 4096), (5, 32768)]
    if torch.device(device).type == "cpu":
        shapes = shapes[:2]
    flags = (True, False)
    for (m, n), weight_grad, with_dr, w_dtype in itertools.product(
        shapes, flags, flags, (x_dtype, torch.float32)
    ):
        x = randn((m, n), x_dtype, device)
        r = x.float() + randn((m, n), torch.float32, device)
        dy = randn((m, n), x_dtype, device)
        dr_in = randn((m, n), torch.float32, device) if with_dr else None
        w = 1 + 0.1 * randn((n,), w_dtype, device)
        if (m, n) == (33, 1000):  # rows that start off the 16-byte grid
            r = randn((m * n + 1,), torch.float32, device)[1:].view(m, n)
        args = (dy, dr_in, r, w, 1e-6, weight_grad)
        dr, dx, dw = stream_op(*args)
        dr2, dw2 = op(*args)
        what = f"{(m, n)} weight_grad={weight_grad} grad_residual={with_dr} weight {w_dtype}"
        assert dr.dtype == torch.float32 and dx.dtype == x_dtype and dw.dtype == w_dtype, what
        assert torch.equal(dr, dr2), what
        assert torch.equal(dx, dr.to(x_dtype)), what
        assert torch.equal(dw, dw2), what
        assert dw.shape == ((n,) if weight_grad else (0,)), what


def test_residual_stream_backward_needs_the_stream():
    """add_rms_norm_stream_backward takes only the float32 residual stream's dtypes, with the
    same message from the kernel (CPU) and the fake (meta)."""
    stream_op = torch.ops.rownorm.add_rms_norm_stream_backward.default
    for device in ("cpu", "meta"):
        for g_dtype, r_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
            dy = torch.zeros((3, 8), dtype=g_dtype, device=device)
            r = torch.zeros((3, 8), dtype=r_dtype, device=device)
            msg = (f"add_rms_norm_stream_backward: expected the float32 residual stream, grad "
                   f"float16 or bfloat16 and r float32, got grad {str(g_dtype)[6:]}")  # fmt: skip
            with pytest.raises(RuntimeError, match=msg):
                stream_op(dy, None, r, None, 1e-6, False)


@pytest.mark.parametrize("op_id", ["l2_normalize", "l1"])
def test_normalize_propagates_nan(device, op_id):
    """A NaN in a row makes the whole row NaN, as in F.normalize; the other rows are finite."""
    op = OPS[op_id]
    x = randn((4, 33), torch.float32, device)
    x[1, 5] = float("nan")
    (y,) = op.call({"x": x}, -1)
    assert torch.isnan(y[1]).all()
    assert not torch.isnan(y[[0, 2, 3]]).any()


# ---------------------------------------------------------------------------------------------
# softmax / log_softmax special values


def _special_rows(case: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(5, n) rows with special values, from a random base."""
    big = {torch.float16: 6e4, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e300}
    x = randn((5, n), torch.float64, "cpu")
    inf = float("inf")
    if case == "neg_inf_entries":
        x[:, ::2] = -inf  # N=1: the whole row
    elif case == "all_neg_inf_row":
        x[1] = -inf
        x[3] = -inf
    elif case == "pos_inf":
        x[0, n // 2] = inf
        x[2, 0] = inf
        x[2, n - 1] = inf
    elif case == "pos_and_neg_inf":
        x[1, 0] = inf
        x[1, n - 1] = -inf
        x[3, n // 2] = -inf
    elif case == "nan_entry":
        x[2, n // 3] = float("nan")
    elif case == "huge_positive":
        x[:, ::3] = big[dtype]
    elif case == "huge_spread":
        x = x.sign() * big[dtype]
        x[:, 0] = big[dtype]
    elif case == "huge_negative":
        x = -big[dtype] * (0.5 + 0.5 * x.abs().clamp_max(1))
    elif case == "constant":
        x[:] = 3.0
    return x.to(dtype)


SPECIAL_CASES = ("neg_inf_entries", "all_neg_inf_row", "pos_inf", "pos_and_neg_inf", "nan_entry",
                 "huge_positive", "huge_spread", "huge_negative", "constant")  # fmt: skip


# (where, N): rows of one and of a few packs; CUDA only (the CPU runs the same loop for any
# layout and length): the strided-dim path and a longer row.
WHERE = (("last", 1), ("last", 33), ("middle", 33), ("last", 1025))


@pytest.mark.parametrize("op_id", ["softmax", "log_softmax"])
def test_softmax_special_values(device, op_id):
    """±inf, NaN, all -inf rows and huge magnitudes give what torch gives (NaN included),
    forward and backward, on rows and on a strided dim."""
    op = OPS[op_id]
    fn = torch.log_softmax if op.log else torch.softmax
    for dtype in DTYPES:
        for case in SPECIAL_CASES:
            for where, n in WHERE if torch.device(device).type == "cuda" else WHERE[:2]:
                x, dim = _special_rows(case, n, dtype).to(device), -1
                if where == "middle":  # (5, n) -> (1, n, 5) reduced over dim 1
                    x, dim = x.t().unsqueeze(0).contiguous(), 1
                what = f"{case} {dtype_id(dtype)} {where} N={n}"
                (y,) = check_forward(op, {"x": x}, dim, what=what, stat=False)
                expected = fn(x, dim)
                assert torch.equal(torch.isnan(y), torch.isnan(expected)), what
                assert torch.equal(torch.isinf(y), torch.isinf(expected)), what
                finite_rows = torch.isfinite(x).all(dim)
                if finite_rows.any():
                    stat, want, bound = op.row_stat(y, {"x": x}, dim)
                    bound = torch.as_tensor(bound, dtype=torch.float64, device=stat.device)
                    bound = bound.expand(stat.shape)[finite_rows]
                    assert_row_stat(stat[finite_rows], want, bound, what=what)
                leaf = x.detach().requires_grad_(True)
                dy = randn(x.shape, dtype, device)
                (dx,) = torch.autograd.grad(op.call({"x": leaf}, dim)[0], leaf, dy)
                leaf = x.detach().requires_grad_(True)
                (want_dx,) = torch.autograd.grad(fn(leaf, dim), leaf, dy)
                assert torch.equal(torch.isnan(dx), torch.isnan(want_dx)), what + " dx NaN"


# ---------------------------------------------------------------------------------------------
# The seed expressions


def test_seed_001_channel_rms_norm(device):
    """Seed 001: ``x / sqrt(mean(x², dim=1) + eps)`` over the channels of NCHW (small)."""
    for eps in (1e-5, 1e-6):
        x = randn((3, 64, 12, 24), torch.float32, device)  # inner 288: 16-byte packs
        seed = x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + eps)
        out = rownorm.rms_norm(x, dim=1, eps=eps)
        assert_new_contiguous(out, x)
        assert_matches(out, seed, dim=1)
        assert_matches(out, rownorm.reference.rms_norm(x, None, 1, eps), dim=1)
        module = rownorm.nn.RMSNorm(64, eps=eps, elementwise_affine=False, dim=1)
        assert torch.equal(module(x), out)
        cl = x.to(memory_format=torch.channels_last)  # channels innermost: the row path
        assert_matches(rownorm.rms_norm(cl, dim=1, eps=eps), seed, dim=1)


def test_seed_003_mean_abs(device):
    """Seed 003: ``x / torch.mean(torch.abs(x), dim=1, keepdim=True)`` (here 64 × 65535)."""
    x = randn((64, 65535), torch.float32, device)
    seed = x / torch.mean(torch.abs(x), dim=1, keepdim=True)
    out = rownorm.l1_normalize(x, dim=1, eps=0.0, mean=True)
    assert_new_contiguous(out, x)
    tol = TOL[torch.float32]
    torch.testing.assert_close(out, seed, rtol=tol.rtol, atol=tol.atol * seed.abs().max().item())
    assert_matches(out, rownorm.reference.l1_normalize(x, 1, 0.0, True), dim=1)
    assert torch.equal(rownorm.nn.L1Norm(dim=1, eps=0.0, mean=True)(x), out)


# ---------------------------------------------------------------------------------------------
# The reference backward is the truth above: it agrees with float64 autograd through the
# torch expressions (F.rms_norm, F.layer_norm, ...).


@all_ops
def test_reference_backward_matches_torch_autograd(op_id):
    op = OPS[op_id]
    cases = [(randn((5, 7), torch.float64, "cpu"), -1)]
    if not op.last_dim_only:
        cases.append(DIM_CASES["middle"](7, torch.float64, "cpu"))
    for x, dim in cases:
        inp = op.inputs(x, dim)
        leaves = {k: v.detach().requires_grad_(True) for k, v in inp.items()}
        outs = op.torch_equivalent(leaves, dim)
        dys = tuple(randn(o.shape, o.dtype, o.device) for o in outs)
        expected = torch.autograd.grad(outs, list(leaves.values()), dys)
        ref = op.reference_grads(dys, inp, dim)
        for k, e in zip(leaves, expected, strict=True):
            torch.testing.assert_close(ref[k], e, rtol=1e-10, atol=1e-10, msg=lambda m, k=k: k + m)


# ---------------------------------------------------------------------------------------------
# Streams and devices (CUDA)


@cuda_only
@pytest.mark.streams
def test_current_stream_is_used():
    """The kernels run on the current stream: work queued before them on it is seen."""
    for op in families().values():
        for n in (33, 4096, 65535):
            src = op.inputs(randn((8, n), torch.float32, "cuda"), -1)
            inp = {k: torch.ones_like(v) for k, v in src.items()}
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)
                for k, v in src.items():
                    inp[k].copy_(v)
                outs = op.call(inp, -1)
            side.synchronize()
            for o, ref in zip(outs, op.reference(src, -1), strict=True):
                assert_matches(o, ref, dim=-1, what=f"{op} N={n}")


@cuda_only
def test_tensor_on_second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    dev = torch.device("cuda", 1)
    for op in families().values():
        for n in (33, 4096, 65535):
            inp = op.inputs(randn((5, n), torch.float32, dev), -1)
            for o, ref in zip(op.call(inp, -1), op.reference(inp, -1), strict=True):
                assert o.device == dev
                assert_matches(o, ref, dim=-1, what=f"{op} N={n}")
    assert torch.cuda.current_device() == 0
