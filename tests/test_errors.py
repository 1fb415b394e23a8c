"""Every user mistake gives a clear error naming the argument and what was expected.

The same message comes from the C++ checks (eager CPU/CUDA), from the fakes (meta tensors,
torch.compile tracing) and, for the layout check, from the Python wrapper. Each message is
"<op>: <argument> must ..., got ...", the argument named as in the op's schema (a backward op's
y or r, not "x"), dtypes as torch names them, and nothing before the op's name (no source file
of the build machine).

Why the grid is what it is: the checks are shared by arity, not written per op: every op
checks x (floating, at least one dim), dim and eps; every parameter its dtype, shape
(x.size(dim),) and device; a residual x's shape, dtype and device; every backward op its
gradients against the tensor it saved. So the cases are GENERATED from the op table (one op
case per registered op, the one with every input) and iterated inside one id per (op,
device), for the op, the public function, the fake and (two cases per op) torch.compile.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import rownorm
import torch
from utils import DTYPES, HAS_CUDA, cuda_only, families, randn, raw_case

FLOATING = "float32, float16, bfloat16 or float64"
OP_IDS = list(families())
FAMILIES = families()
# Every other dtype torch has (integers, bool, complex, float8, float4, bits, quantized, ...),
# the common ones first (the compiled test takes the first).
_COMMON = (torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64)
OTHER_DTYPES = _COMMON + tuple(
    sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}
           - set(DTYPES) - set(_COMMON), key=str)
)  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _x(shape=(3, 4), dtype=torch.float32, device="cpu") -> torch.Tensor | None:
    """A tensor to pass; None where torch cannot allocate that dtype on the device (so it
    cannot reach the op there either). Values of the other dtypes do not matter: they are
    rejected before anything reads them."""
    if dtype in DTYPES:
        return randn(shape, dtype, device)
    try:
        with warnings.catch_warnings():  # complex32 is "experimental", quantized "deprecated"
            warnings.simplefilter("ignore", UserWarning)
            return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, NotImplementedError):
        return None


def forward_cases(op, device) -> list[tuple[str, object, dict, int, str]]:
    """(what, op case, inputs, dim, regex of the message after "<op>: ") for ``op``."""
    x = _x(device=device)
    good = op.inputs(x, -1)
    cases = []

    def with_rows(t):  # every row input replaced by t (x is checked first)
        return {**good, **{k: t for k in op.row_inputs}}

    for dtype in OTHER_DTYPES:
        name = dtype_name(dtype)
        bad = _x(dtype=dtype, device=device)
        if bad is not None:
            msg = re.escape(f"x must be {FLOATING}, got {name}")
            cases.append((f"x {name}", op, with_rows(bad), -1, msg))
    zero_d = {k: torch.tensor(1.5, device=device) for k in op.row_inputs}
    cases.append(("0-d x", op, zero_d, 0 if not op.last_dim_only else -1,
                  re.escape("x must have at least one dimension, got a 0-d tensor")))  # fmt: skip
    if not op.last_dim_only:
        row_only = {k: v for k, v in good.items() if k in op.row_inputs}
        for shape, dim in (((3, 4), 2), ((3, 4), -3), ((5,), 1), ((2, 1, 3, 4), -5)):
            rank = len(shape)
            msg = f"dim must be in [{-rank}, {rank - 1}] for a {rank}-d x, got {dim}"
            inp = {**row_only, "x": _x(shape, device=device)}
            cases.append((f"dim {dim} of {rank}-d", op, inp, dim, re.escape(msg)))
    if op.has_eps:
        for eps, text in ((-0.5, "-0.5"), (float("nan"), "nan")):
            bad_eps = dataclasses.replace(op, eps=eps)
            cases.append(
                (f"eps {text}", bad_eps, good, -1, re.escape(f"eps must be >= 0, got {text}"))
            )
    for p in op.params:
        for what, t, msg in (
            ("length 5", _x((5,), device=device), r"\(4,\).*got \(5,\)"),
            ("2-d", _x((1, 4), device=device), r"\(4,\).*got \(1, 4\)"),
            ("0-d", torch.tensor(1.0, device=device), r"\(4,\).*got \(\)"),
        ):
            cases.append((f"{p} {what}", op, {**good, p: t}, -1, rf"{p} must have shape {msg}"))
        for dtype in OTHER_DTYPES:
            bad = _x((4,), dtype=dtype, device=device)
            if bad is not None:
                msg = re.escape(f"{p} must be {FLOATING}, got {dtype_name(dtype)}")
                cases.append((f"{p} {dtype_name(dtype)}", op, {**good, p: bad}, -1, msg))
        # A float64 parameter would be rounded to the dtype parameters run in.
        for x_dtype in (torch.float32, torch.float16, torch.bfloat16):
            inp = {**op.inputs(_x(dtype=x_dtype, device=device), -1),
                   p: _x((4,), dtype=torch.float64, device=device)}  # fmt: skip
            msg = re.escape(
                f"{p} must be float32, float16 or bfloat16 for a {dtype_name(x_dtype)} x "
                "(float64 needs a float64 x), got float64"
            )
            cases.append((f"float64 {p}, {dtype_name(x_dtype)} x", op, inp, -1, msg))
        if not op.last_dim_only and p == op.params[0]:  # the size along dim, not the last size
            cases.append(
                (f"{p} along dim 0", op, good, 0, rf"{p} must have shape \(3,\).*got \(4,\)")
            )
    if op.residual:
        for what, t, msg in (
            ("shape", _x((3, 5), device=device), "residual must have x's shape (3, 4), got (3, 5)"),
            ("rank", _x((12,), device=device), "residual must have x's shape (3, 4), got (12,)"),
            ("dtype", _x(dtype=torch.float64, device=device),
             "residual must have x's dtype float32, got float64"),
            ("int", _x(dtype=torch.int64, device=device),
             "residual must have x's dtype float32, got int64"),
        ):  # fmt: skip
            cases.append((f"residual {what}", op, {**good, "residual": t}, -1, re.escape(msg)))
        # A 16-bit x's residual may also be float32 (the float32 residual stream), no other.
        bf16 = op.inputs(_x(dtype=torch.bfloat16, device=device), -1)
        msg = "residual must have x's dtype bfloat16 or float32 (a float32 residual stream), "
        cases.append(("residual float16, bf16 x", op,
                      {**bf16, "residual": _x(dtype=torch.float16, device=device)}, -1,
                      re.escape(msg + "got float16")))  # fmt: skip
    if op.name in ("rms_norm", "add_rms_norm"):  # the keyword options of the RMSNorm ops
        mode = dataclasses.replace(op, options={"casting_mode": "fp32"})
        msg = "casting_mode must be 'once' or 'llama', got 'fp32'"
        cases.append(("casting_mode", mode, good, -1, re.escape(msg)))
        offset = dataclasses.replace(op, params=(), options={"weight_offset": 1.0})
        no_weight = {k: v for k, v in good.items() if k != "weight"}
        msg = "weight_offset needs a weight, got weight=None and weight_offset=1"
        cases.append(("weight_offset without weight", offset, no_weight, -1, re.escape(msg)))
    return cases


def _raw(op, inp, dim):
    return op.op(*op.raw_args(inp, dim))


def _meta(inp):
    return {k: v.to("meta") for k, v in inp.items()}


def _raises(fn, op, regex, what, prefix=None, *, whole=False):
    """``fn()`` raises a RuntimeError matching "<op>: " + regex (``whole``: the message starts
    with it, as an eager call's does); a failure names the case."""
    start = re.escape((prefix or op.name) + ": ") + regex
    try:
        with pytest.raises(RuntimeError, match=("^" if whole else "") + start) as info:
            fn()
    except (AssertionError, pytest.fail.Exception) as err:
        raise AssertionError(f"{op.id}, {what}: {err}") from None
    return info


@pytest.mark.parametrize("op_id", OP_IDS)
def test_bad_input(device, op_id):
    """The op and the public function raise the message naming the argument (nothing before
    the op's name: no source file path)."""
    for what, op, inp, dim, regex in forward_cases(FAMILIES[op_id], device):
        _raises(lambda op=op, inp=inp, dim=dim: _raw(op, inp, dim), op, regex, what, whole=True)
        _raises(lambda op=op, inp=inp, dim=dim: op.call(inp, dim), op, regex, what, whole=True)


@pytest.mark.parametrize("op_id", OP_IDS)
def test_bad_input_fake(op_id):
    """The fakes (meta tensors, torch.compile tracing) raise the eager message."""
    for what, op, inp, dim, regex in forward_cases(FAMILIES[op_id], "cpu"):
        if any(t.is_quantized for t in inp.values()):
            continue  # a quantized tensor cannot be a meta tensor
        _raises(lambda op=op, inp=inp, dim=dim: _raw(op, _meta(inp), dim), op, regex, what)


@pytest.mark.parametrize("op_id", OP_IDS)
def test_bad_input_compiled(device, op_id):
    """Raised while tracing (by the fake), not by an eager fallback: the dtype check, then the
    first check of the op's own arity (dim, parameter shape or residual)."""
    cases = forward_cases(FAMILIES[op_id], device)
    picks = [cases[0]] + [
        c
        for c in cases
        if c[0].startswith(("dim 2", "weight length", "bias length", "residual shape"))
    ][:1]
    for what, op, inp, dim, regex in picks:
        names = list(inp)
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda *t, op=op, dim=dim, names=names: op.call(dict(zip(names, t, strict=True)), dim),
            fullgraph=True,
        )
        info = _raises(lambda c=compiled, inp=inp: c(*inp.values()), op, regex, what)
        assert isinstance(info.value, torch._dynamo.exc.TorchRuntimeError), what
    torch._dynamo.reset()


def backward_cases(op, device) -> list[tuple[str, object, tuple, str]]:
    """(what, op case, backward op arguments, regex) for the backward op of ``op``."""
    x = _x(device=device)
    good = op.inputs(x, -1)
    case = raw_case(op, x)
    outs = case.raw(good, -1)
    dys = tuple(torch.ones_like(o) for o in outs)
    want = frozenset(op.params)
    cases = []

    def args(c=case, inp=good, o=outs, d=dys, w=want, dim=-1):
        return c.backward_args(d, inp, dim, o, w)

    saved = op.saved  # the tensor the backward reads: x, the output y, or r
    for what, g, msg in (
        ("grad shape", _x((3, 5), device=device), r"shape \(3, 4\), got \(3, 5\)"),
        ("grad rank", _x((12,), device=device), r"shape \(3, 4\), got \(12,\)"),
        # (not float16: add_rms_norm's float32 r takes a 16-bit grad, the residual stream)
        ("grad dtype", _x(dtype=torch.float64, device=device),
         r"dtype float32, got float64"),
    ):  # fmt: skip
        cases.append((what, case, args(d=(g, *dys[1:])), rf"grad must have {saved}'s " + msg))

    def with_saved(t):  # the arguments with the saved tensor (and the gradients) replaced
        inp, o = ({**good, "x": t}, outs) if saved == "x" else (good, outs)
        if saved != "x":
            o = (t, *outs[1:]) if saved == "y" else (outs[0], t)
        return args(inp=inp, o=o, d=tuple(torch.ones_like(t) for _ in dys))

    bad = _x(dtype=torch.int64, device=device)
    cases.append(("saved int", case, with_saved(bad),
                  re.escape(f"{saved} must be {FLOATING}, got int64")))  # fmt: skip
    msg = re.escape(f"{saved} must have at least one dimension, got a 0-d tensor")
    cases.append(("saved 0-d", case, with_saved(torch.tensor(1.5, device=device)), msg))
    backward_names = [a.name for a in case.backward_op._schema.arguments]
    if "stats" in backward_names:  # layer_norm's: the forward's (mean, rstd), shaped like x
        stats = case.backward_args(dys, good, -1, outs, want)[backward_names.index("stats")]
        acc = dtype_name(stats.dtype)
        for what, s, msg in (
            ("stats dtype", stats.half(), re.escape(f"stats must be {acc} for a float32 x on ")
                                          + r"\S+, got float16"),
            ("stats shape", stats[:, :1], re.escape("stats must have shape (3, 2) (x's, with 2 "
                                                    "along dim 1), got (3, 1)")),
        ):  # fmt: skip
            a = list(args())
            a[backward_names.index("stats")] = s
            cases.append((what, case, tuple(a), msg))
    if op.has_eps and "eps" in backward_names:
        bad_eps = dataclasses.replace(case, eps=-1.0)
        cases.append(("eps", bad_eps, args(c=bad_eps), re.escape("eps must be >= 0, got -1")))
    if not op.last_dim_only:
        msg = re.escape(f"dim must be in [-2, 1] for a 2-d {saved}, got 5")
        cases.append(("dim", case, args(dim=5), msg))
    if op.params:
        no_params = {k: v for k, v in good.items() if k not in op.params}
        cases.append(
            ("weight_grad without weight", case, args(inp=no_params), r"weight_grad=True .*weight")
        )
        if "weight" in op.params:
            inp = {**good, "weight": _x((5,), device=device)}
            msg = rf"weight must have shape \(4,\) \(the size of {saved} along dim 1\), got \(5,\)"
            cases.append(("weight shape", case, args(inp=inp), msg))
    if op.name in ("rms_norm", "add_rms_norm"):
        offset = dataclasses.replace(case, options={"weight_offset": 1.0})
        no_weight = {k: v for k, v in good.items() if k != "weight"}
        msg = "weight_offset needs a weight, got weight=None and weight_offset=1"
        cases.append(("weight_offset without weight", offset,
                      args(c=offset, inp=no_weight, w=frozenset()), re.escape(msg)))  # fmt: skip
    if op.n_outputs > 1:
        g2 = _x(dtype=torch.float16, device=device)
        msg = rf"grad_residual must have {saved}'s dtype float32, got float16"
        cases.append(("grad_residual dtype", case, args(d=(dys[0], g2)), msg))
    return cases


@pytest.mark.parametrize("op_id", OP_IDS)
def test_backward_bad_input(device, op_id):
    for what, case, args, regex in backward_cases(FAMILIES[op_id], device):
        _raises(
            lambda c=case, a=args: c.backward_op(*a),
            case,
            regex,
            what,
            case.name + "_backward",
            whole=True,
        )


@pytest.mark.parametrize("op_id", OP_IDS)
def test_backward_bad_input_fake(op_id):
    for what, case, args, regex in backward_cases(FAMILIES[op_id], "cpu"):
        meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
        _raises(
            lambda c=case, a=meta: c.backward_op(*a), case, regex, what, case.name + "_backward"
        )


@pytest.mark.parametrize("op_id", OP_IDS)
def test_zero_dim_compiled(device, op_id):
    op = FAMILIES[op_id]
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda t: op.call({k: t * 2 for k in op.row_inputs}, -1 if op.last_dim_only else 0),
        fullgraph=True,
    )
    with pytest.raises(RuntimeError, match=re.escape(f"{op.name}: x must have at least one dim")):
        compiled(torch.tensor(3.0, device=device))
    torch._dynamo.reset()


def test_sparse(device):
    """Sparse x (COO, CSR): the public functions and modules say it must be dense; the raw
    ops (forward, and backward with a sparse grad) name the op and the argument too."""
    for op in FAMILIES.values():
        for fmt in ("coo", "csr"):
            dense = _x((3, 4), device=device)
            x = dense.to_sparse() if fmt == "coo" else dense.to_sparse_csr()
            inp = {**op.inputs(dense, -1), **{k: x for k in op.row_inputs}}
            with pytest.raises(
                ValueError, match=re.escape(f"{op.name}: x must be a dense (strided) tensor")
            ):
                op.call(inp, -1)
            module = op.module(op.inputs(dense, -1), -1)
            if module is not None:
                with pytest.raises(
                    ValueError, match=re.escape("x must be a dense (strided) tensor")
                ):
                    module(*[inp[k] for k in op.row_inputs])
            with pytest.raises(
                RuntimeError, match=re.escape(f"{op.name}: x must be a dense (strided) tensor")
            ):
                _raw(op, inp, -1)
            dense_inp = op.inputs(dense, -1)
            outs = op.raw(dense_inp, -1)
            grads = [o.to_sparse() if fmt == "coo" else o.to_sparse_csr() for o in outs]
            args = op.backward_args(tuple(grads), dense_inp, -1, outs, frozenset())
            name = f"{op.name}_backward: grad must be a dense (strided) tensor"
            with pytest.raises(RuntimeError, match=re.escape(name)):
                op.backward_op(*args)


def _unsupported_kinds(t: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """(t as a tensor that dispatches to no kernel of rownorm, what the message says of it):
    nested, and on the CPU mkldnn and quantized."""
    kinds = [(torch.nested.nested_tensor([t]), "got a nested tensor")]
    if t.device.type == "cpu":
        kinds.append((t.to_mkldnn(), "got layout torch._mkldnn"))
        q = torch.quantize_per_tensor(t, 0.1, 0, torch.qint8)
        kinds.append((q, f"must be {FLOATING}, got qint8"))
    return kinds


def test_unsupported_tensors(device):
    """An mkldnn, quantized or nested tensor in any tensor argument of an op or its backward
    op: the error names the op and the argument."""
    with warnings.catch_warnings():  # nested tensors are a "prototype", quantized "deprecated"
        warnings.simplefilter("ignore", UserWarning)
        for op in FAMILIES.values():
            good = op.inputs(_x(device=device), -1)
            case = raw_case(op, good["x"])
            outs = case.raw(good, -1)
            for name in op.input_names:
                for t, got in _unsupported_kinds(good[name]):
                    msg = re.escape(f"{op.name}: {name} ") + ".*" + re.escape(got)
                    with pytest.raises(RuntimeError, match=msg):
                        _raw(op, {**good, name: t}, -1)
            dys = tuple(torch.ones_like(o) for o in outs)
            for t, got in _unsupported_kinds(dys[0]):
                args = case.backward_args((t, *dys[1:]), good, -1, outs, frozenset())
                msg = re.escape(f"{op.name}_backward: grad ") + ".*" + re.escape(got)
                with pytest.raises(RuntimeError, match=msg):
                    case.backward_op(*args)


def test_not_a_tensor():
    """The public functions name a non-tensor argument before the dispatcher's error."""
    for op in FAMILIES.values():
        good = op.inputs(_x(), -1)
        for name in op.row_inputs:
            msg = re.escape(f"{op.name}: {name} must be a torch.Tensor, got list")
            with pytest.raises(TypeError, match=msg):
                op.call({**good, name: [1.0, 2.0]}, -1)


@cuda_only
def test_other_device():
    """A parameter, residual or gradient on another device than x: named, with both devices."""
    expected = {"cuda": "cuda:0", "cpu": "cpu"}
    for op in FAMILIES.values():
        for x_dev, o_dev in (("cuda", "cpu"), ("cpu", "cuda")):
            good = op.inputs(_x(device=x_dev), -1)
            for name in [n for n in op.input_names if n != "x"]:
                inp = {**good, name: good[name].to(o_dev)}
                devices = f"({expected[x_dev]}), got {expected[o_dev]}"
                msg = f"{op.name}: {name} must be on x's device {devices}"
                with pytest.raises(RuntimeError, match=re.escape(msg)):
                    _raw(op, inp, -1)
                # The fake names the argument too (the others on meta, it on a real device).
                meta = {k: (v if k == name else v.to("meta")) for k, v in inp.items()}
                with pytest.raises(
                    RuntimeError, match=re.escape(f"{op.name}: {name} must be on x's device")
                ):
                    _raw(op, meta, -1)
            case = raw_case(op, good["x"])
            outs = case.raw(good, -1)
            dys = (outs[0].to(o_dev), *[torch.ones_like(o) for o in outs[1:]])
            msg = f"{op.name}_backward: grad must be on {op.saved}'s device"
            with pytest.raises(RuntimeError, match=re.escape(msg)):
                case.backward_op(*case.backward_args(dys, good, -1, outs, frozenset(op.params)))


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.cuda
def test_other_gpu():
    for op in FAMILIES.values():
        good = op.inputs(_x(device="cuda:1"), -1)
        case = raw_case(op, good["x"])
        outs = case.raw(good, -1)
        dys = (outs[0].to("cuda:0"), *[torch.ones_like(o) for o in outs[1:]])
        with pytest.raises(RuntimeError, match=re.escape("device (cuda:1)")):
            case.backward_op(*case.backward_args(dys, good, -1, outs, frozenset(op.params)))


def test_module_negative_eps():
    for cls in ("L2Norm", "L1Norm"):
        with pytest.raises(ValueError, match=re.escape(f"{cls}: eps must be >= 0, got -0.5")):
            getattr(rownorm.nn, cls)(dim=1, eps=-0.5)
