"""Forward of every op of the op table (l2 / l1 / mean-abs normalize, rms_norm, layer_norm,
softmax, log_softmax, add_rms_norm) against its float64 reference AND the PyTorch expression it
replaces, on every row length, layout and dim.

Specification (DESIGN §2, the op contract): each op returns NEW CONTIGUOUS tensors of x's
shape and dtype, equal to ``F.normalize(x, p=2)`` / ``F.normalize(x, p=1)`` / ``x / mean|x|``
(seed 003) / ``F.rms_norm`` (seed 001: ``x / sqrt(mean(x², dim=1) + eps)`` over NCHW channels)
/ ``F.layer_norm`` / ``torch.softmax`` / ``torch.log_softmax`` /
``r = x + residual; (F.rms_norm(r), r)``, with the reduction over ``dim``; a float32
weight/bias may come with float16/bfloat16 x.

Why the grid is what it is:

* Every op case × dtype × N (utils.ROW_LENGTHS; on CUDA also the tier edges
  GPU_TIER_LENGTHS), with the property checks and the module / public function / raw op.
* Layouts and dims cross dtype with a few N (short, one past a warp, odd mid-sized, and the
  column path's register-cache edge 65 for dims), on one case per op family (OP_FAMILIES,
  with every parameter): the routing into the kernels is shared by all cases of an op, and
  the weight/no-weight variants differ only in the op body, which the N grid covers.
* Rarer properties (weight dtypes, poisoned outputs, zero rows, eps, special values, empty
  tensors) run on a representative subset of N.
* Long rows use few rows on the CPU (utils.row_count); CUDA runs more rows for the tiers.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import rownorm
import torch
from op_table import (
    OP_FAMILIES,
    OPS,
    PARAM_OPS,
    OpCase,
    dim_cases,
    empty_cases,
    inputs_for,
    layout_cases,
)
from utils import (
    DIM_CASES,
    DTYPES,
    GPU_TIER_LENGTHS,
    LAYOUTS,
    ROW_LENGTHS,
    TOL,
    assert_matches,
    assert_new_contiguous,
    assert_row_stat,
    cuda_only,
    dtype_id,
    gpu_rows,
    poison_blocks,
    randn,
    row_count,
    scaled_rows,
    with_zero_rows,
)

SUBSET_LENGTHS = (1, 7, 33, 1025, 65537)
LAYOUT_LENGTHS = (7, 1025)
DIM_LENGTHS = (1, 33, 65)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
all_ops = pytest.mark.parametrize("op_id", OPS)
op_families = pytest.mark.parametrize("op_id", OP_FAMILIES)

# F.rms_norm warns that a float32 weight with 16-bit x takes its unfused path.
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


def _upcast(inp):
    half = (torch.float16, torch.bfloat16)
    return {k: v.float() if v.dtype in half else v for k, v in inp.items()}


def check_forward(
    op: OpCase,
    inp,
    dim: int,
    *,
    what: str = "",
    vs_torch: bool = True,
    torch_fp32: bool = False,
    stat: bool = True,
) -> tuple[torch.Tensor, ...]:
    """Runs the op and checks its outputs: new contiguous tensors equal to the float64
    reference and to the PyTorch expression, with the row property where the op has one.

    The PyTorch expression carries its own rounding errors (F.normalize's float32 norm is off
    by ~3e-6 at N = 65537), so against it the whole-tensor error is held to the elementwise
    rtol. torch_fp32 (and ops whose torch expression computes in x's dtype, op.torch_in_fp32):
    evaluate it on float32 copies of 16-bit inputs, where torch's own 16-bit arithmetic is the
    inexact one (Σ|x| overflowing fp16, eps = 1e-12 rounding to 0 in fp16).
    """
    outs = op.call(inp, dim)
    assert isinstance(outs, tuple) and len(outs) == op.n_outputs
    for o in outs:
        assert_new_contiguous(o, inp["x"])
    refs = op.reference(inp, dim)
    mags = [op.output_magnitude(inp, dim, refs[0])] + [None] * (len(refs) - 1)
    for i, (o, ref) in enumerate(zip(outs, refs, strict=True)):
        what_i = f"{op} {what} output {i} vs reference"
        assert_matches(o, ref, magnitude=mags[i], dim=dim, what=what_i)
    if vs_torch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            upcast = torch_fp32 or op.torch_in_fp32
            expected = op.torch_equivalent(_upcast(inp) if upcast else inp, dim)
        for i, (o, t) in enumerate(zip(outs, expected, strict=True)):
            # (torch promotes some parameter dtypes; the output dtype is checked above)
            tol = TOL[o.dtype]
            tol = dataclasses.replace(tol, relerr=max(tol.relerr, tol.rtol))
            what_i = f"{op} {what} output {i} vs torch"
            assert_matches(o, t.to(o.dtype), magnitude=mags[i], dim=dim, what=what_i, tol=tol)
    if stat and (s := op.row_stat(outs[0], inp, dim)) is not None:
        assert_row_stat(*s, what=f"{op} {what} row property")
    return outs


# ---------------------------------------------------------------------------------------------
# Row lengths


@all_ops
@dtypes
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_forward_row_lengths(device, op_id, dtype, n):
    op = OPS[op_id]
    x = scaled_rows(row_count(n), n, dtype, device)
    inp = op.inputs(x, -1)
    outs = check_forward(op, inp, -1, what=f"N={n}")
    # The public function, the raw op and the module are the same computation.
    for i, o in enumerate(op.raw(inp, -1)):
        assert torch.equal(o, outs[i]), f"raw op output {i} differs from the public function"
    module = op.module(inp, -1)
    if module is not None:
        got = module(*[inp[k] for k in ("x", "residual") if k in inp])
        got = got if isinstance(got, tuple) else (got,)
        for i, o in enumerate(got):
            assert torch.equal(o, outs[i]), f"module output {i} differs from the function"


@cuda_only
@all_ops
@dtypes
@pytest.mark.parametrize("n", GPU_TIER_LENGTHS)
def test_forward_gpu_tiers(op_id, dtype, n):
    op = OPS[op_id]
    x = scaled_rows(gpu_rows(n), n, dtype, "cuda")
    check_forward(op, op.inputs(x, -1), -1, what=f"N={n}")


# ---------------------------------------------------------------------------------------------
# Layouts and dims


@pytest.mark.parametrize(("op_id", "layout"), layout_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", LAYOUT_LENGTHS)
def test_forward_layouts(device, op_id, dtype, layout, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, LAYOUTS[layout], row_count(n), n, dtype, device)
    check_forward(op, inp, dim, what=f"{layout} N={n}")


@pytest.mark.parametrize(("op_id", "case"), dim_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", DIM_LENGTHS)
def test_forward_dims(device, op_id, case, dtype, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], n, dtype, device)
    check_forward(op, inp, dim, what=f"{case} N={n}")


@cuda_only
@pytest.mark.parametrize(("op_id", "case"), dim_cases(OP_FAMILIES))
@dtypes
@pytest.mark.parametrize("n", (7, 64, 255, 1000, 1025, 4097))
def test_forward_dims_gpu(op_id, case, dtype, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], n, dtype, "cuda")
    check_forward(op, inp, dim, what=f"{case} N={n}")


# ---------------------------------------------------------------------------------------------
# Parameters: absent, of x's dtype, float32 with 16-bit x, other dtypes (converted)

# (x dtype, parameter dtype): float32 parameters with 16-bit x are the mixed-precision case; any
# other pairing is converted by the binding (to float32, or x's dtype for float32/64 x).
PARAM_DTYPES = [
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16),
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.float32, torch.bfloat16),
]
PARAM_DTYPE_IDS = [f"{dtype_id(a)}-{dtype_id(b)}" for a, b in PARAM_DTYPES]


@pytest.mark.parametrize("op_id", PARAM_OPS)
@pytest.mark.parametrize(("x_dtype", "p_dtype"), PARAM_DTYPES, ids=PARAM_DTYPE_IDS)
@pytest.mark.parametrize("n", (7, 1025, 4097))
def test_forward_param_dtypes(device, op_id, x_dtype, p_dtype, n):
    op = OPS[op_id]
    x = scaled_rows(row_count(n), n, x_dtype, device)
    inp = op.inputs(x, -1, param_dtype=p_dtype)
    # torch's layer_norm takes parameters of x's dtype, or (on the CPU only) float32 ones
    # with 16-bit x.
    vs_torch = (
        op.name != "layer_norm"
        or p_dtype == x_dtype
        or p_dtype == torch.float32
        and (x_dtype in (torch.float16, torch.bfloat16))
        and torch.device(device).type == "cpu"
    )
    outs = check_forward(op, inp, -1, what=f"N={n}", vs_torch=vs_torch)
    for o in outs:
        assert o.dtype == x_dtype


@pytest.mark.parametrize("op_id", ["rms_norm_weight", "layer_norm_affine"])
@pytest.mark.parametrize(("x_dtype", "p_dtype"), PARAM_DTYPES[:2], ids=["bf16-fp32", "fp16-fp32"])
@pytest.mark.parametrize("case", ["middle", "nchw_channels", "first"])
def test_forward_param_dtypes_strided_dim(device, op_id, x_dtype, p_dtype, case):
    op = OPS[op_id]
    x, dim = DIM_CASES[case](33, x_dtype, device)
    # torch's CUDA layer_norm rejects float32 parameters with 16-bit x (its CPU one takes them).
    vs_torch = op.name != "layer_norm" or torch.device(device).type == "cpu"
    check_forward(op, op.inputs(x, dim, param_dtype=p_dtype), dim, what=case, vs_torch=vs_torch)


@dtypes
@pytest.mark.parametrize("params", [("weight",), ("bias",)], ids=["weight_only", "bias_only"])
@pytest.mark.parametrize("n", (7, 1025))
def test_forward_layer_norm_one_param(device, dtype, params, n):
    op = dataclasses.replace(OPS["layer_norm_affine"], params=params)
    for x, dim in (LAYOUTS["contiguous"](row_count(n), n, dtype, device),
                   DIM_CASES["middle"](n, dtype, device)):  # fmt: skip
        check_forward(op, op.inputs(x, dim), dim, what=f"{params} N={n}")


# ---------------------------------------------------------------------------------------------
# Every output element is written


def _poison_and_run(op: OpCase, inp, dim):
    x = inp["x"]
    ptrs = poison_blocks([(x.shape, x.dtype)] * (op.n_outputs + 1), x.device)
    outs = op.call(inp, dim)
    for i, o in enumerate(outs):
        if o.is_cuda:
            assert o.data_ptr() in ptrs, "the caching allocator did not hand back a poisoned block"
        assert not torch.isnan(o).any(), f"output {i}: unwritten (NaN-poisoned) elements"
    return outs


@all_ops
@dtypes
@pytest.mark.parametrize("layout", ["contiguous", "odd_offset", "transposed"])
@pytest.mark.parametrize("n", (7, 1025))
def test_forward_poisoned_output(device, op_id, dtype, layout, n):
    op = OPS[op_id]
    inp, dim = inputs_for(op, LAYOUTS[layout], row_count(n), n, dtype, device)
    outs = _poison_and_run(op, inp, dim)
    for o, ref in zip(outs, op.reference(inp, dim), strict=True):
        assert_matches(o, ref, dim=dim, what=layout)


@pytest.mark.parametrize(
    ("op_id", "case"),
    dim_cases(OPS, ("middle", "nchw_channels", "nchw_wide", "first", "last_negative")),
)
@dtypes
def test_forward_poisoned_output_dims(device, op_id, case, dtype):
    op = OPS[op_id]
    inp, dim = inputs_for(op, DIM_CASES[case], 65, dtype, device)
    outs = _poison_and_run(op, inp, dim)
    for o, ref in zip(outs, op.reference(inp, dim), strict=True):
        assert_matches(o, ref, dim=dim, what=case)


# ---------------------------------------------------------------------------------------------
# Zero rows, eps


def _with_zero_rows(op: OpCase, inp, dim: int):
    """Every third row of x zero; for add_rms_norm residual = -x there, so r's row is zero."""
    inp = dict(inp)
    x = with_zero_rows(inp["x"], dim)
    inp["x"] = x
    if op.residual:
        zero_row = (x == 0).all(dim, keepdim=True)
        inp["residual"] = torch.where(zero_row, 0, inp["residual"])
    return inp


@all_ops
@dtypes
@pytest.mark.parametrize("n", (1, 7, 1025))
def test_forward_zero_rows(device, op_id, dtype, n):
    """Zero rows: 0 for the norms (eps > 0), uniform for softmax, as the reference and torch."""
    op = OPS[op_id]
    cases = [(randn((row_count(n) + 4, n), dtype, device), -1)]
    if not op.last_dim_only:
        cases.append(DIM_CASES["middle"](n, dtype, device))
    for x, dim in cases:
        inp = _with_zero_rows(op, op.inputs(x, dim), dim)
        outs = check_forward(op, inp, dim, what=f"N={n}", torch_fp32=True)
        assert not torch.isnan(outs[0]).any()


# Cases of the ops with an eps, at eps = 0: a zero row divides 0 by 0 and gives NaN exactly
# where the torch expression (seed 003: x / mean|x|; F.rms_norm(eps=0); F.layer_norm(eps=0))
# does.
EPS_ZERO_OPS = ("l1", "mean_abs", "rms_norm", "layer_norm_affine", "add_rms_norm_weight")


@pytest.mark.parametrize("op_id", EPS_ZERO_OPS)
@dtypes
@pytest.mark.parametrize("n", (1, 7, 1025))
def test_forward_eps_zero(device, op_id, dtype, n):
    op = dataclasses.replace(OPS[op_id], eps=0.0)
    x = randn((row_count(n) + 4, n), dtype, device)
    inp = _with_zero_rows(op, op.inputs(x, -1), -1)
    outs = check_forward(op, inp, -1, what=f"N={n}", torch_fp32=True, stat=False)
    assert torch.isnan(outs[0][::3]).all()
    if not (op.name == "layer_norm" and n == 1):  # (a row of one has zero variance)
        assert not torch.isnan(outs[0][1::3]).any()


def _l1_scaled_rows(rows: int, n: int, dtype, device, s_of_eps, mean: bool):
    """Rows whose Σ|x| (mean|x|) is s_of_eps[i] · eps: well below, above, and a zero row.

    The scales stay a factor 2 away from 1 so rounding never crosses the clamp's kink.
    """
    x = randn((rows, n), torch.float64, "cpu")
    s = x.abs().sum(-1, keepdim=True) / (n if mean else 1)
    scales = torch.tensor(s_of_eps, dtype=torch.float64).repeat(rows)[:rows].unsqueeze(1)
    x = x / s * scales
    x[rows // 2] = 0
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("op_id", ["l1", "mean_abs"])
@dtypes
@pytest.mark.parametrize("eps", [1e-3, 0.5, 7.0])
@pytest.mark.parametrize("n", (1, 7, 33, 1025))
def test_forward_l1_eps_clamps_small_rows(device, op_id, dtype, eps, n):
    """Rows with s < eps are divided by eps (F.normalize's clamp), the others normalized."""
    op = dataclasses.replace(OPS[op_id], eps=eps)
    x = _l1_scaled_rows(16, n, dtype, device, [0.1, 0.45, 3.0, 20.0], op.mean)
    (y,) = check_forward(op, op.inputs(x, -1), -1, what=f"eps={eps}")
    s = x.double().abs().sum(-1) / (n if op.mean else 1)
    small = s < eps
    assert small.any() and (~small).any()
    assert_matches(y[small], (x[small].double() / eps).to(dtype), dim=-1, what="clamped rows")


@pytest.mark.parametrize("op_id", ["rms_norm", "layer_norm"])
@dtypes
@pytest.mark.parametrize("eps", [1e-6, 0.1, 10.0])
def test_forward_norm_eps(device, op_id, dtype, eps):
    """eps is added to mean(x²) / the variance: it matters for rows of small magnitude."""
    op = dataclasses.replace(OPS[op_id], eps=eps)
    x = scaled_rows(19, 255, dtype, device)
    check_forward(op, op.inputs(x, -1), -1, what=f"eps={eps}")


@pytest.mark.parametrize("c", [0.0, 2.0, -0.5])
@dtypes
@pytest.mark.parametrize("n", (1, 7, 1025))
def test_forward_layer_norm_constant_rows(device, c, dtype, n):
    """A constant row has zero variance: the output is exactly the bias (zero without one)."""
    op = OPS["layer_norm_affine"]
    x = torch.full((5, n), c, dtype=dtype, device=device)
    inp = op.inputs(x, -1)
    check_forward(op, inp, -1, what=f"c={c}")
    check_forward(OPS["layer_norm"], {"x": x}, -1, what=f"c={c}")


@pytest.mark.parametrize(
    ("c", "eps"), [(0.1, 0.0), (0.1, 1e-5), (1e20, 1e-5), (-3.3e4, 1e-5), (12345.678, 0.0)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("n", (7, 1000, 4097))
def test_layer_norm_constant_rows_inexact_sum(device, c, eps, dtype, n):
    """Constant rows whose Σx/n rounds (float32 on CUDA, float64 on both): y = 0 and
    dx = (dy − mean dy)/sqrt(eps) as in torch's F.layer_norm (x − μ = 0 exactly; all NaN for
    eps = 0), not the ±1 that a mean off by one rounding gives (x − μ = ±δ, var = δ² ≫ eps).
    (dx from the formula: torch's own float64 backward computes x·r − μ·r, which cancels
    catastrophically at |x| = 1e20.)"""
    x = torch.full((3, n), c, dtype=dtype, device=device)
    dy = randn(x.shape, dtype, device)
    leaf = x.clone().requires_grad_(True)
    y = rownorm.layer_norm(leaf, eps=eps)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    expected = torch.nn.functional.layer_norm(x.double().cpu(), (n,), eps=eps)
    assert torch.equal(torch.isnan(expected), torch.tensor(eps == 0).expand(x.shape))
    if eps == 0:
        assert torch.isnan(y).all() and torch.isnan(dx).all()
        return
    assert torch.count_nonzero(y) == 0, f"max |y| = {y.abs().max().item()}"
    dy64 = dy.double()
    dx_ref = (dy64 - dy64.mean(-1, keepdim=True)) / eps**0.5
    assert_matches(dx, dx_ref.to(dtype), magnitude=dy64.abs() / eps**0.5, dim=-1, what="dx")


@pytest.mark.parametrize("op_id", ["rms_norm", "add_rms_norm"])
@dtypes
def test_default_eps_is_torchs(device, op_id, dtype):
    """eps=None is F.rms_norm's / torch.nn.RMSNorm's default: the machine epsilon of the
    computation type (float32 for float16 / bfloat16 / float32 x, float64 for float64 x).
    Rows of rms ~ 1e-3 make the difference visible: eps matters next to mean(x²) ~ 1e-6."""
    op = OPS[op_id]
    x = randn((6, 64), dtype, device) * 1e-3
    inp = op.inputs(x, -1)
    check_forward(op, inp, -1, what="rms 1e-3")
    if op_id == "rms_norm":
        expected = torch.nn.RMSNorm(64, elementwise_affine=False)(x)
        got = rownorm.nn.RMSNorm(64, elementwise_affine=False)(x)
        assert_matches(got, expected, dim=-1, what="module")


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


@pytest.mark.parametrize("op_id", ["softmax", "log_softmax"])
@dtypes
@pytest.mark.parametrize("case", SPECIAL_CASES)
@pytest.mark.parametrize(
    ("where", "n"), [("last", 1), ("last", 33), ("last", 1025), ("middle", 33)], ids=str
)
def test_forward_softmax_special_values(device, op_id, dtype, case, where, n):
    """±inf, NaN, all -inf rows and huge magnitudes give what torch gives (NaN included)."""
    op = OPS[op_id]
    x = _special_rows(case, n, dtype).to(device)
    dim = -1
    if where == "middle":  # (5, n) -> (1, n, 5) reduced over dim 1: the strided-dim path
        x, dim = x.t().unsqueeze(0).contiguous(), 1
    (y,) = check_forward(op, {"x": x}, dim, what=f"{case} N={n}", stat=False)
    expected = op.torch_equivalent({"x": x}, dim)[0]
    assert torch.equal(torch.isnan(y), torch.isnan(expected))
    assert torch.equal(torch.isinf(y), torch.isinf(expected))
    finite_rows = torch.isfinite(x).all(dim)
    if finite_rows.any() and (s := op.row_stat(y, {"x": x}, dim)) is not None:
        stat, want, bound = s
        bound = torch.as_tensor(bound, dtype=torch.float64, device=stat.device).expand(stat.shape)
        assert_row_stat(stat[finite_rows], want, bound[finite_rows], what=case)


# ---------------------------------------------------------------------------------------------
# The seed expressions


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_seed_001_channel_rms_norm(device, eps):
    """Seed 001: ``x / sqrt(mean(x², dim=1) + eps)`` over the channels of NCHW (small)."""
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
# Empty tensors


@pytest.mark.parametrize(("op_id", "shape_dim"), empty_cases())
def test_empty(device, op_id, shape_dim):
    op = OPS[op_id]
    shape, dim = shape_dim
    for dtype in DTYPES:
        x = torch.empty(shape, dtype=dtype, device=device)
        inp = op.inputs(x, dim)
        outs = op.call(inp, dim)
        assert len(outs) == op.n_outputs
        for o in outs:
            assert_new_contiguous(o, x)


# ---------------------------------------------------------------------------------------------
# Streams and devices (CUDA)


@cuda_only
@all_ops
@pytest.mark.parametrize("n", (33, 4096, 65535))
def test_current_stream_is_used(op_id, n):
    """The kernels run on the current stream: work queued before them on it is seen."""
    op = OPS[op_id]
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
        assert_matches(o, ref, dim=-1)


@cuda_only
@all_ops
def test_tensor_on_second_gpu(op_id):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    op = OPS[op_id]
    dev = torch.device("cuda", 1)
    for n in (33, 4096, 65535):
        inp = op.inputs(randn((5, n), torch.float32, dev), -1)
        outs = op.call(inp, -1)
        for o, ref in zip(outs, op.reference(inp, -1), strict=True):
            assert o.device == dev
            assert_matches(o, ref, dim=-1)
    assert torch.cuda.current_device() == 0
