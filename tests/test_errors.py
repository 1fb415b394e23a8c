"""Every user mistake gives a clear error naming the argument and what was expected.

l2_normalize first; then the op set of the op table (l1_normalize, rms_norm, layer_norm,
softmax, log_softmax, add_rms_norm and their backward ops), whose parameters and residual are
checked too.

The same message comes from the C++ checks (eager CPU/CUDA), from the fakes (meta tensors,
torch.compile tracing) and, for the layout check, from the Python wrapper.
"""

from __future__ import annotations

import re

import pytest
import rownorm
import torch
from op_table import OPS
from utils import HAS_CUDA, cuda_only, randn

FWD = "l2_normalize: "
BWD = "l2_normalize_backward: "


def _x(shape=(3, 4), dtype=torch.float32, device="cpu") -> torch.Tensor:
    if dtype.is_floating_point:
        return randn(shape, dtype, device)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    return torch.randint(0, 5, shape, device=device).to(dtype)


# (x builder(device), dim, eps, message): mistakes in x, dim and eps, valid in every layout.
FORWARD_CASES = {
    "int64": (lambda d: _x(dtype=torch.int64, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got int64"),
    "int32": (lambda d: _x(dtype=torch.int32, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got int32"),
    "uint8": (lambda d: _x(dtype=torch.uint8, device=d), -1, 1e-12,
              "x must be float32, float16, bfloat16 or float64, got uint8"),
    "bool": (lambda d: _x(dtype=torch.bool, device=d), -1, 1e-12,
             "x must be float32, float16, bfloat16 or float64, got bool"),
    "complex64": (lambda d: _x(dtype=torch.complex64, device=d), -1, 1e-12,
                  "x must be float32, float16, bfloat16 or float64, got complex64"),
    "complex128": (lambda d: _x(dtype=torch.complex128, device=d), -1, 1e-12,
                   "x must be float32, float16, bfloat16 or float64, got complex128"),
    "dim_too_large": (lambda d: _x(device=d), 2, 1e-12,
                      "dim must be in [-2, 1] for a 2-d x, got 2"),
    "dim_too_negative": (lambda d: _x(device=d), -3, 1e-12,
                         "dim must be in [-2, 1] for a 2-d x, got -3"),
    "dim_1d": (lambda d: _x((5,), device=d), 1, 1e-12,
               "dim must be in [-1, 0] for a 1-d x, got 1"),
    "dim_4d": (lambda d: _x((2, 1, 3, 4), device=d), -5, 1e-12,
               "dim must be in [-4, 3] for a 4-d x, got -5"),
    "eps_negative": (lambda d: _x(device=d), -1, -1e-6, "eps must be >= 0, got -1e-06"),
    "eps_nan": (lambda d: _x(device=d), -1, float("nan"), "eps must be >= 0, got nan"),
    "zero_dim": (lambda d: torch.tensor(1.5, device=d), 0, 1e-12,
                 "x must have at least one dimension, got a 0-d tensor"),
}  # fmt: skip


def _pattern(prefix: str, message: str) -> str:
    return re.escape(prefix + message)


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_bad_input_op(device, case):
    build, dim, eps, message = FORWARD_CASES[case]
    x = build(device)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        torch.ops.rownorm.l2_normalize(x, dim, eps)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        rownorm.l2_normalize(x, dim, eps)


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_bad_input_fake(case):
    """The fake (run for meta tensors and by torch.compile) raises the eager message."""
    build, dim, eps, message = FORWARD_CASES[case]
    x = build("cpu").to("meta")
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)):
        torch.ops.rownorm.l2_normalize(x, dim, eps)


@pytest.mark.parametrize("case", ["int64", "complex64", "dim_too_large", "eps_negative"])
def test_forward_bad_input_compiled(device, case):
    build, dim, eps, message = FORWARD_CASES[case]
    x = build(device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: rownorm.l2_normalize(t, dim, eps), fullgraph=True)
    with pytest.raises(RuntimeError, match=_pattern(FWD, message)) as info:
        compiled(x)
    # Raised while tracing (by the fake), not by an eager fallback.
    assert isinstance(info.value, torch._dynamo.exc.TorchRuntimeError)
    torch._dynamo.reset()


def test_zero_dim_compiled(device):
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: rownorm.l2_normalize(t * 2), fullgraph=True)
    with pytest.raises(RuntimeError, match=re.escape(FWD + "x must have at least one dim")):
        compiled(torch.tensor(3.0, device=device))
    torch._dynamo.reset()


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sparse_via_python_api(device, fmt):
    x = _x((3, 4), device=device)
    x = x.to_sparse() if fmt == "coo" else x.to_sparse_csr()
    with pytest.raises(ValueError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        rownorm.l2_normalize(x)
    with pytest.raises(ValueError, match=re.escape(FWD + "x must be a dense (strided) tensor")):
        rownorm.nn.L2Norm()(x)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("op_id", OPS)
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sparse_via_op(device, op_id, fmt):
    """Every op and backward op rejects a sparse tensor in any tensor argument (COO; CSR for
    2-D arguments) with an error naming the op and that argument."""
    op = OPS[op_id]
    inp = op.inputs(_x((3, 4), device=device), -1)
    outs = op.raw(inp, -1)
    dys = tuple(torch.ones_like(o) for o in outs)
    calls = ((op.op, op.raw_args(inp, -1)),
             (op.backward_op, op.backward_args(dys, inp, -1, outs, frozenset())))  # fmt: skip
    for overload, args in calls:
        name = overload._schema.name.removeprefix("rownorm::")
        arg_names = [a.name for a in overload._schema.arguments]
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or (fmt == "csr" and a.dim() != 2):
                continue
            sparse = a.to_sparse() if fmt == "coo" else a.to_sparse_csr()
            msg = f"{name}: {arg_names[i]} must be a dense (strided) tensor, got layout"
            with pytest.raises(RuntimeError, match=re.escape(msg)):
                overload(*args[:i], sparse, *args[i + 1 :])


def test_module_negative_eps():
    with pytest.raises(ValueError, match=re.escape("L2Norm: eps must be >= 0, got -0.5")):
        rownorm.nn.L2Norm(dim=1, eps=-0.5)


# ---------------------------------------------------------------------------------------------
# The backward op: x, dim and eps as in the forward; grad must match x in shape, dtype, device.

# (grad builder(x), x builder(device), dim, eps, message)
BACKWARD_CASES = {
    "grad_shape": (lambda x: _x((3, 5), device=x.device), lambda d: _x(device=d), -1, 1e-12,
                   "grad must have x's shape (3, 4), got (3, 5)"),
    "grad_rank": (lambda x: _x((12,), device=x.device), lambda d: _x(device=d), -1, 1e-12,
                  "grad must have x's shape (3, 4), got (12,)"),
    "grad_dtype": (lambda x: _x(dtype=torch.float64, device=x.device), lambda d: _x(device=d),
                   -1, 1e-12, "grad must have x's dtype float32, got float64"),
    "grad_int": (lambda x: _x(dtype=torch.int64, device=x.device), lambda d: _x(device=d), -1,
                 1e-12, "grad must have x's dtype float32, got int64"),
    "x_dtype": (lambda x: _x(dtype=torch.int64, device=x.device),
                lambda d: _x(dtype=torch.int64, device=d), -1, 1e-12,
                "x must be float32, float16, bfloat16 or float64, got int64"),
    "dim": (lambda x: torch.ones_like(x), lambda d: _x(device=d), 2, 1e-12,
            "dim must be in [-2, 1] for a 2-d x, got 2"),
    "dim_negative": (lambda x: torch.ones_like(x), lambda d: _x(device=d), -3, 1e-12,
                     "dim must be in [-2, 1] for a 2-d x, got -3"),
    "eps": (lambda x: torch.ones_like(x), lambda d: _x(device=d), 0, -2.0,
            "eps must be >= 0, got -2"),
    "zero_dim": (lambda x: torch.ones_like(x), lambda d: torch.tensor(2.0, device=d), 0, 1e-12,
                 "x must have at least one dimension, got a 0-d tensor"),
}  # fmt: skip


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_bad_input_op(device, case):
    build_grad, build_x, dim, eps, message = BACKWARD_CASES[case]
    x = build_x(device)
    grad = build_grad(x)
    with pytest.raises(RuntimeError, match=_pattern(BWD, message)):
        torch.ops.rownorm.l2_normalize_backward(grad, x, dim, eps)


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_bad_input_fake(case):
    build_grad, build_x, dim, eps, message = BACKWARD_CASES[case]
    x = build_x("cpu")
    grad = build_grad(x)
    with pytest.raises(RuntimeError, match=_pattern(BWD, message)):
        torch.ops.rownorm.l2_normalize_backward(grad.to("meta"), x.to("meta"), dim, eps)


@cuda_only
def test_backward_device_mismatch():
    x = _x(device="cuda")
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cuda:0)")):
        torch.ops.rownorm.l2_normalize_backward(x.cpu(), x, -1, 1e-12)
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cpu)")):
        torch.ops.rownorm.l2_normalize_backward(x, x.cpu(), -1, 1e-12)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.cuda
def test_backward_other_gpu():
    x = _x(device="cuda:1")
    with pytest.raises(RuntimeError, match=re.escape(BWD + "grad must be on x's device (cuda:1)")):
        torch.ops.rownorm.l2_normalize_backward(x.to("cuda:0"), x, -1, 1e-12)


# ---------------------------------------------------------------------------------------------
# The op set of the op table: the same checks of x, dim and eps, and of the parameters
# (weight / bias: floating, shape (x.size(dim),), x's device) and add_rms_norm's residual (x's
# shape, dtype and device). Each case: (op, args builder(device), regex of the message after
# "<op>: "). Shapes in the messages are spelled as the C++ does: (4,) and (3, 4).


def _w(n=4, dtype=torch.float32, device="cpu"):
    return _x((n,), dtype=dtype, device=device)


_INT = "float32, float16, bfloat16 or float64, got int64"
_X_INT = lambda d: _x(dtype=torch.int64, device=d)  # noqa: E731
_ZERO_D = lambda d: torch.tensor(1.5, device=d)  # noqa: E731
_ZERO_D_MSG = re.escape("x must have at least one dimension, got a 0-d tensor")

OP_ERROR_CASES = {
    # x, dim, eps, shared by every op
    "l1_int": ("l1_normalize", lambda d: (_X_INT(d), -1, 1e-12, False),
               re.escape("x must be " + _INT)),
    "l1_dim": ("l1_normalize", lambda d: (_x(device=d), 2, 1e-12, False),
               re.escape("dim must be in [-2, 1] for a 2-d x, got 2")),
    "l1_eps": ("l1_normalize", lambda d: (_x(device=d), -1, -1e-6, True),
               re.escape("eps must be >= 0, got -1e-06")),
    "l1_zero_dim": ("l1_normalize", lambda d: (_ZERO_D(d), 0, 1e-12, False), _ZERO_D_MSG),
    "rms_int": ("rms_norm", lambda d: (_X_INT(d), None, -1, None), re.escape("x must be " + _INT)),
    "rms_dim": ("rms_norm", lambda d: (_x((2, 3, 4), device=d), None, -4, None),
                re.escape("dim must be in [-3, 2] for a 3-d x, got -4")),
    "rms_eps": ("rms_norm", lambda d: (_x(device=d), None, -1, -1.0),
                re.escape("eps must be >= 0, got -1")),
    "rms_zero_dim": ("rms_norm", lambda d: (_ZERO_D(d), None, 0, None), _ZERO_D_MSG),
    "ln_int": ("layer_norm", lambda d: (_X_INT(d), None, None, -1, 1e-5),
               re.escape("x must be " + _INT)),
    "ln_dim": ("layer_norm", lambda d: (_x((5,), device=d), None, None, 1, 1e-5),
               re.escape("dim must be in [-1, 0] for a 1-d x, got 1")),
    "ln_eps": ("layer_norm", lambda d: (_x(device=d), None, None, -1, -1e-6),
               re.escape("eps must be >= 0, got -1e-06")),
    "ln_zero_dim": ("layer_norm", lambda d: (_ZERO_D(d), None, None, 0, 1e-5), _ZERO_D_MSG),
    "softmax_int": ("softmax", lambda d: (_X_INT(d), -1), re.escape("x must be " + _INT)),
    "softmax_bool": ("softmax", lambda d: (_x(dtype=torch.bool, device=d), -1),
                     re.escape("x must be float32, float16, bfloat16 or float64, got bool")),
    "softmax_dim": ("softmax", lambda d: (_x(device=d), -3),
                    re.escape("dim must be in [-2, 1] for a 2-d x, got -3")),
    "softmax_zero_dim": ("softmax", lambda d: (_ZERO_D(d), 0), _ZERO_D_MSG),
    "log_softmax_int": ("log_softmax", lambda d: (_x(dtype=torch.int32, device=d), -1),
                        re.escape("x must be float32, float16, bfloat16 or float64, got int32")),
    "log_softmax_dim": ("log_softmax", lambda d: (_x(device=d), 2),
                        re.escape("dim must be in [-2, 1] for a 2-d x, got 2")),
    "log_softmax_zero_dim": ("log_softmax", lambda d: (_ZERO_D(d), 0), _ZERO_D_MSG),
    "add_int": ("add_rms_norm", lambda d: (_X_INT(d), _X_INT(d), None, None),
                re.escape("x must be " + _INT)),
    "add_eps": ("add_rms_norm", lambda d: (_x(device=d), _x(device=d), None, -0.5),
                re.escape("eps must be >= 0, got -0.5")),
    "add_zero_dim": ("add_rms_norm", lambda d: (_ZERO_D(d), _ZERO_D(d), None, None), _ZERO_D_MSG),
    # parameters
    "rms_weight_shape": ("rms_norm", lambda d: (_x(device=d), _w(5, device=d), -1, None),
                         r"weight must have shape \(4,\).*got \(5,\)"),
    "rms_weight_shape_dim": ("rms_norm", lambda d: (_x(device=d), _w(4, device=d), 0, None),
                             r"weight must have shape \(3,\).*got \(4,\)"),
    "rms_weight_2d": ("rms_norm", lambda d: (_x(device=d), _x((1, 4), device=d), -1, None),
                      r"weight must have shape \(4,\).*got \(1, 4\)"),
    "rms_weight_0d": ("rms_norm", lambda d: (_x(device=d), _ZERO_D(d), -1, None),
                      r"weight must have shape \(4,\).*got \(\)"),
    "rms_weight_int": ("rms_norm",
                       lambda d: (_x(device=d), _w(dtype=torch.int64, device=d), -1, None),
                       re.escape("weight must be " + _INT)),
    "ln_weight_shape": ("layer_norm", lambda d: (_x(device=d), _w(3, device=d), None, -1, 1e-5),
                        r"weight must have shape \(4,\).*got \(3,\)"),
    "ln_bias_shape": ("layer_norm",
                      lambda d: (_x(device=d), _w(device=d), _w(5, device=d), -1, 1e-5),
                      r"bias must have shape \(4,\).*got \(5,\)"),
    "ln_bias_2d": ("layer_norm", lambda d: (_x(device=d), None, _x((4, 1), device=d), -1, 1e-5),
                   r"bias must have shape \(4,\).*got \(4, 1\)"),
    "ln_bias_int": ("layer_norm",
                    lambda d: (_x(device=d), None, _w(dtype=torch.int32, device=d), -1, 1e-5),
                    re.escape("bias must be float32, float16, bfloat16 or float64, got int32")),
    "add_weight_shape": ("add_rms_norm",
                         lambda d: (_x(device=d), _x(device=d), _w(3, device=d), None),
                         r"weight must have shape \(4,\).*got \(3,\)"),
    # add_rms_norm's residual
    "add_residual_shape": ("add_rms_norm",
                           lambda d: (_x(device=d), _x((3, 5), device=d), None, None),
                           re.escape("residual must have x's shape (3, 4), got (3, 5)")),
    "add_residual_rank": ("add_rms_norm", lambda d: (_x(device=d), _x((12,), device=d), None, None),
                          re.escape("residual must have x's shape (3, 4), got (12,)")),
    "add_residual_dtype": ("add_rms_norm",
                           lambda d: (_x(device=d), _x(dtype=torch.float64, device=d), None, None),
                           re.escape("residual must have x's dtype float32, got float64")),
    "add_residual_int": ("add_rms_norm",
                         lambda d: (_x(device=d), _x(dtype=torch.int64, device=d), None, None),
                         re.escape("residual must have x's dtype float32, got int64")),
}  # fmt: skip

# Backward ops: grad (and grad_residual) like x; y of softmax like x; weight_grad needs weight.
OP_BACKWARD_ERROR_CASES = {
    "l1_grad_shape": ("l1_normalize_backward",
                      lambda d: (_x((3, 5), device=d), _x(device=d), -1, 1e-12, False),
                      re.escape("grad must have x's shape (3, 4), got (3, 5)")),
    "l1_x_int": ("l1_normalize_backward", lambda d: (_X_INT(d), _X_INT(d), -1, 1e-12, False),
                 re.escape("x must be " + _INT)),
    "rms_grad_dtype": ("rms_norm_backward",
                       lambda d: (_x(dtype=torch.float16, device=d), _x(device=d), None, -1, 1e-6,
                                  False),
                       re.escape("grad must have x's dtype float32, got float16")),
    "rms_eps": ("rms_norm_backward", lambda d: (_x(device=d), _x(device=d), None, -1, -1.0, False),
                re.escape("eps must be >= 0, got -1")),
    "rms_dim": ("rms_norm_backward", lambda d: (_x(device=d), _x(device=d), None, 5, 1e-6, False),
                re.escape("dim must be in [-2, 1] for a 2-d x, got 5")),
    "rms_weight_grad_no_weight": ("rms_norm_backward",
                                  lambda d: (_x(device=d), _x(device=d), None, -1, 1e-6, True),
                                  r"weight_grad=True .*weight"),
    "rms_weight_shape": ("rms_norm_backward",
                         lambda d: (_x(device=d), _x(device=d), _w(5, device=d), -1, 1e-6, True),
                         r"weight must have shape \(4,\).*got \(5,\)"),
    "ln_grad_shape": ("layer_norm_backward",
                      lambda d: (_x((4, 3), device=d), _x(device=d), None, -1, 1e-5, False, False),
                      re.escape("grad must have x's shape (3, 4), got (4, 3)")),
    "ln_weight_grad_no_weight": ("layer_norm_backward",
                                 lambda d: (_x(device=d), _x(device=d), None, -1, 1e-5, True, True),
                                 r"weight_grad=True .*weight"),
    "softmax_grad_shape": ("softmax_backward", lambda d: (_x((3, 5), device=d), _x(device=d), -1),
                           r"grad must have .*shape \(3, 4\), got \(3, 5\)"),
    "softmax_y_int": ("softmax_backward", lambda d: (_X_INT(d), _X_INT(d), -1),
                      re.escape("y must be " + _INT)),
    "log_softmax_grad_dtype": ("log_softmax_backward",
                               lambda d: (_x(dtype=torch.float64, device=d), _x(device=d), -1),
                               r"grad must have .*dtype float32, got float64"),
    "log_softmax_dim": ("log_softmax_backward", lambda d: (_x(device=d), _x(device=d), -3),
                        re.escape("dim must be in [-2, 1] for a 2-d x, got -3")),
    "add_grad_shape": ("add_rms_norm_backward",
                       lambda d: (_x((3, 5), device=d), None, _x(device=d), None, 1e-6, False),
                       r"grad must have .*shape \(3, 4\), got \(3, 5\)"),
    "add_grad_residual_dtype": ("add_rms_norm_backward",
                                lambda d: (_x(device=d), _x(dtype=torch.float16, device=d),
                                           _x(device=d), None, 1e-6, False),
                                r"grad_residual must have .*dtype float32, got float16"),
    "add_weight_grad_no_weight": ("add_rms_norm_backward",
                                  lambda d: (_x(device=d), None, _x(device=d), None, 1e-6, True),
                                  r"weight_grad=True .*weight"),
}  # fmt: skip

FORWARD_OPS = ("l1_normalize", "rms_norm", "layer_norm", "softmax", "log_softmax", "add_rms_norm")


def _op_pattern(op: str, message: str) -> str:
    return re.escape(op + ": ") + message


@pytest.mark.parametrize("case", OP_ERROR_CASES)
def test_op_bad_input(device, case):
    op, build, message = OP_ERROR_CASES[case]
    args = build(device)
    with pytest.raises(RuntimeError, match=_op_pattern(op, message)):
        getattr(torch.ops.rownorm, op)(*args)
    with pytest.raises(RuntimeError, match=_op_pattern(op, message)):
        getattr(rownorm, op)(*args)


@pytest.mark.parametrize("case", OP_BACKWARD_ERROR_CASES)
def test_op_backward_bad_input(device, case):
    op, build, message = OP_BACKWARD_ERROR_CASES[case]
    with pytest.raises(RuntimeError, match=_op_pattern(op, message)):
        getattr(torch.ops.rownorm, op)(*build(device))


def _to_meta(args):
    return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("case", {**OP_ERROR_CASES, **OP_BACKWARD_ERROR_CASES})
def test_op_bad_input_fake(case):
    """The fakes (meta tensors, torch.compile tracing) raise the eager message."""
    op, build, message = {**OP_ERROR_CASES, **OP_BACKWARD_ERROR_CASES}[case]
    with pytest.raises(RuntimeError, match=_op_pattern(op, message)):
        getattr(torch.ops.rownorm, op)(*_to_meta(build("cpu")))


@pytest.mark.parametrize(
    "case",
    ["l1_int", "rms_dim", "ln_eps", "softmax_dim", "rms_weight_shape", "ln_bias_2d",
     "add_residual_shape", "add_residual_dtype"],
)  # fmt: skip
def test_op_bad_input_compiled(device, case):
    """Raised while tracing (by the fake), not by an eager fallback."""
    op, build, message = OP_ERROR_CASES[case]
    args = build(device)
    fn = getattr(rownorm, op)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True)
    with pytest.raises(RuntimeError, match=_op_pattern(op, message)) as info:
        compiled(*args)
    assert isinstance(info.value, torch._dynamo.exc.TorchRuntimeError)
    torch._dynamo.reset()


@pytest.mark.parametrize("op", FORWARD_OPS)
def test_op_zero_dim_compiled(device, op):
    torch._dynamo.reset()
    fn = getattr(rownorm, op)
    if op == "add_rms_norm":
        compiled = torch.compile(lambda t: fn(t * 2, t), fullgraph=True)
    else:
        compiled = torch.compile(lambda t: fn(t * 2), fullgraph=True)
    with pytest.raises(RuntimeError, match=_op_pattern(op, "x must have at least one dim")):
        compiled(torch.tensor(3.0, device=device))
    torch._dynamo.reset()


@pytest.mark.parametrize("op", FORWARD_OPS)
def test_op_sparse_via_python_api(device, op):
    x = _x((3, 4), device=device).to_sparse()
    args = (x, x) if op == "add_rms_norm" else (x,)
    with pytest.raises(ValueError, match=re.escape(op + ": x must be a dense (strided) tensor")):
        getattr(rownorm, op)(*args)


@cuda_only
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("where", ["cpu_param", "cuda_param"])
def test_op_param_on_other_device(op, where):
    """weight / bias / residual on another device than x: named, with both devices."""
    x_dev, p_dev = ("cuda", "cpu") if where == "cpu_param" else ("cpu", "cuda")
    x = _x(device=x_dev)
    name = {"rms_norm": "weight", "layer_norm": "bias", "add_rms_norm": "residual"}[op]
    expected = {"cuda": "cuda:0", "cpu": "cpu"}
    message = re.escape(f"{op}: {name} must be on x's device ({expected[x_dev]}), got ")
    args = {
        "rms_norm": (x, _w(device=p_dev), -1, None),
        "layer_norm": (x, None, _w(device=p_dev), -1, 1e-5),
        "add_rms_norm": (x, _x(device=p_dev), None, None),
    }[op]
    with pytest.raises(RuntimeError, match=message + re.escape(expected[p_dev])):
        getattr(torch.ops.rownorm, op)(*args)
    # The fake names the argument too (x on meta, the other on a real device).
    with pytest.raises(RuntimeError, match=re.escape(f"{op}: {name} must be on x's device")):
        getattr(torch.ops.rownorm, op)(*_to_meta(args[:1]), *args[1:])
