"""FP8 training of linear layers in one line: ``embscale.fp8.convert_to_float8_training(model)``.

Each converted ``nn.Linear`` runs its three GEMMs in FP8 with tensorwise current scaling (the recipe of
torchao's ``convert_to_float8_training`` with its default, tensorwise, config):

    forward       out         = x @ W^T        x, W       in e4m3
    backward      grad_input  = grad_out @ W   grad_out   in e5m2, W in e4m3
                  grad_weight = grad_out^T @ x grad_out   in e5m2, x in e4m3

Each operand is scaled by its own current amax (scale = fp8_max / amax, see ``embscale.compute_scale``)
and cast with embscale's fused cast + transpose, which writes the row-major copy and the transposed copy
the GEMMs need in one pass. The GEMMs accumulate in fp32 and round once to the output dtype: the input's
dtype for out and grad_input, the weight's for grad_weight. The bias is added in the output dtype,
outside the FP8 GEMM.

Non-finite values are not hidden by the scaling: the pass that computes an operand's amax also flags an
inf or NaN in it, and a flagged operand's inverse scale becomes NaN on the device (no host
synchronisation), so every GEMM that operand enters gives NaN. A non-finite input or gradient makes the
whole output / gradient NaN, where nn.Linear would give inf or NaN in the affected rows; a non-finite
weight makes the output and the input gradient NaN. So a GradScaler or a NaN check sees the overflow.

Where the GEMMs run:
  * CUDA: ``torch._scaled_mm`` (fp8 tensor cores, sm_89+), without fast accumulation.
  * CPU: an exact emulation. The fp8 codes are widened to fp32 (exactly: every fp8 value is an fp32
    value, and so is every product of two of them), multiplied as an fp32 GEMM, and the result is
    multiplied by scale_inv_a * scale_inv_b in fp32. Only the fp32 summation of the products rounds, as on
    the GPU; the order of that summation is the backend's.

Distributed training: activations and gradients are scaled from their local amax on each rank. The
weights' amax can be synchronised over a process group with ``sync_float8_weight_amax(model, group)``,
one batched all-reduce for all converted layers per step (for sharded weights, as torchao's
precompute_float8_dynamic_scale_for_fsdp does); the next forward passes use those amax values.
"""

import math
import weakref
from typing import Callable, Optional

import torch

from . import ops  # noqa: F401  (registers torch.ops.embscale.*)
from ._ops_common import FLOAT_DTYPES, _check_eps_type

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def _scaled_cast(x2d: torch.Tensor, amax: torch.Tensor, nonfinite: torch.Tensor, fp8_dtype: torch.dtype, eps: float):
    """(codes [r, c], codes transposed [c, r], scale_inv) of a 2-D x with the scale of `amax`. Where
    `nonfinite` (0-dim, on the device) is set, scale_inv is NaN: the scale alone would turn an inf into a
    saturated finite code (and a NaN into a NaN code the GEMM may not spread), hiding the overflow."""
    scale, scale_inv = torch.ops.embscale.compute_scale(amax, fp8_dtype, eps, False)
    y, yt = torch.ops.embscale.cast_transpose(x2d, scale, fp8_dtype)
    return y, yt, torch.where(nonfinite != 0, math.nan, scale_inv)


def _fp8_mm(a: torch.Tensor, b_rows: torch.Tensor, scale_inv_a: torch.Tensor, scale_inv_b: torch.Tensor,
            out_dtype: torch.dtype) -> torch.Tensor:
    """(a * scale_inv_a) @ (b_rows * scale_inv_b)^T for fp8 a [m, k] and b_rows [n, k], both row-major."""
    if a.is_cuda:
        # b_rows^T is the column-major right operand torch._scaled_mm wants.
        return torch._scaled_mm(a, b_rows.t(), scale_a=scale_inv_a, scale_b=scale_inv_b, out_dtype=out_dtype,
                                use_fast_accum=False)
    one = torch.ones((), dtype=torch.float32, device=a.device)
    a32 = torch.ops.embscale.dequantize(a, one, torch.float32)
    b32 = torch.ops.embscale.dequantize(b_rows, one, torch.float32)
    return ((a32 @ b32.t()) * (scale_inv_a * scale_inv_b)).to(out_dtype)


def _check_cuda_dims(x2d: torch.Tensor):
    """torch._scaled_mm needs inner dimensions that are multiples of 16; the weight gradient's inner
    dimension is the number of rows of the flattened input."""
    if x2d.is_cuda and x2d.shape[0] % 16 != 0:
        raise ValueError(f"input: {x2d.shape[0]} rows (the product of its leading dimensions) is not a multiple "
                         "of 16, which torch._scaled_mm needs for the weight gradient on CUDA")


class _Float8LinearFunction(torch.autograd.Function):
    """x @ W^T with the three GEMMs in FP8 (no bias). weight_amax: the weight's amax to use, or None to
    compute it here."""

    @staticmethod
    def forward(ctx, x, weight, weight_amax, eps):
        x2d = x.reshape(-1, x.shape[-1])
        _check_cuda_dims(x2d)
        x_amax, x_nonfinite = torch.ops.embscale.amax_nonfinite(x2d, "auto")
        x_codes, x_codes_t, x_scale_inv = _scaled_cast(x2d, x_amax, x_nonfinite, E4M3, eps)
        if weight_amax is None:
            weight_amax, weight_nonfinite = torch.ops.embscale.amax_nonfinite(weight, "auto")
        else:  # synced: sync_float8_weight_amax stores inf for a weight that holds an inf or a NaN
            weight_nonfinite = torch.isinf(weight_amax)
        w_codes, w_codes_t, w_scale_inv = _scaled_cast(weight, weight_amax, weight_nonfinite, E4M3, eps)
        out = _fp8_mm(x_codes, w_codes, x_scale_inv, w_scale_inv, x.dtype)
        ctx.save_for_backward(x_codes_t, x_scale_inv, w_codes_t, w_scale_inv)
        ctx.eps, ctx.x_shape, ctx.x_dtype, ctx.w_dtype = eps, x.shape, x.dtype, weight.dtype
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x_codes_t, x_scale_inv, w_codes_t, w_scale_inv = ctx.saved_tensors
        g2d = grad_out.reshape(-1, grad_out.shape[-1])
        g_amax, g_nonfinite = torch.ops.embscale.amax_nonfinite(g2d, "auto")
        g_codes, g_codes_t, g_scale_inv = _scaled_cast(g2d, g_amax, g_nonfinite, E5M2, ctx.eps)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _fp8_mm(g_codes, w_codes_t, g_scale_inv, w_scale_inv, ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            grad_w = _fp8_mm(g_codes_t, x_codes_t, g_scale_inv, x_scale_inv, ctx.w_dtype)
        return grad_x, grad_w, None, None


def _weight_identity(weight: torch.Tensor) -> tuple:
    """What must not change between sync_float8_weight_amax and a forward: the parameter object (a load with
    assign=True replaces it; held weakly, so a new object at a freed one's address never matches), its memory
    (``weight.data = ...`` replaces that) and its version counter (an in-place update bumps it). The version
    alone misses a replaced weight whose counter happens to match."""
    return weakref.ref(weight), weight.data_ptr(), tuple(weight.shape), weight._version


def _same_weight(recorded: Optional[tuple], weight: torch.Tensor) -> bool:
    return recorded is not None and recorded[0]() is weight and recorded[1:] == _weight_identity(weight)[1:]


# The largest eps: an amax clamped there gives inverse scales up to eps / 448, and a GEMM multiplies two of
# them in fp32 (torch._scaled_mm's alpha, or the CPU path's product), which must stay finite.
_MAX_EPS = 1e18


def _check_eps(eps):
    """The ops' check of eps's type, with this module's tighter bound."""
    _check_eps_type(eps)
    if not 0.0 <= eps <= _MAX_EPS:  # NaN fails too (and a huge int compares without overflowing a float)
        raise ValueError(f"eps: {eps} is not a number in [0, {_MAX_EPS:g}] (above, the product of two inverse "
                         "scales that a GEMM applies would overflow fp32)")


class Float8Linear(torch.nn.Linear):
    """An ``nn.Linear`` whose GEMMs run in FP8 with current scaling (module docstring for the maths).

    Parameters, their names and the state_dict are those of ``nn.Linear``, so optimizers, checkpoints and
    wrappers (DDP, FSDP) see no difference. ``eps``: lower bound of every amax before the scale is computed
    (``embscale.compute_scale``).

    Input and weight are float32, float16 or bfloat16, the dtypes its FP8 casts read; another dtype, float64
    included, raises TypeError naming the input or the weight at the forward. A float64 model is not cast
    silently: one kept in float64 asks for more precision than fp32, and FP8 GEMMs give far less.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 eps: float = 0.0):
        _check_eps(eps)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.eps = float(eps)
        # Set by sync_float8_weight_amax: the weight's amax (all-reduced) and which weight it was then.
        self.weight_amax: Optional[torch.Tensor] = None
        self._weight_amax_version: Optional[tuple] = None

    def __getstate__(self):
        # A copy or a pickle is another module with other weights: the sync does not carry over (its forward
        # scales the weight locally until the next sync_float8_weight_amax).
        state = self.__dict__.copy()
        state["weight_amax"] = None
        state["_weight_amax_version"] = None
        return state

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, eps: float = 0.0) -> "Float8Linear":
        """A Float8Linear that shares `linear`'s parameters (no copy)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False, eps=eps)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def _synced_weight_amax(self) -> Optional[torch.Tensor]:
        if self.weight_amax is None:
            return None
        if not torch.compiler.is_compiling() and not _same_weight(self._weight_amax_version, self.weight):
            raise RuntimeError("weight_amax: the weight changed after sync_float8_weight_amax; call it after "
                               "every optimizer step (or clear_float8_weight_amax to scale each weight locally)")
        return self.weight_amax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, t in (("input", x), ("weight", self.weight)):
            if t.dtype not in FLOAT_DTYPES:
                raise TypeError(f"{name}: dtype {t.dtype} is not supported by Float8Linear; expected torch.float32, "
                                "float16 or bfloat16, which its FP8 casts read (cast the model, e.g. .float(), or "
                                "leave this layer out with convert_to_float8_training's module_filter_fn)")
        if x.dim() == 0:
            raise ValueError("input: a 0-d tensor; expected [..., in_features]")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input: last dimension is {x.shape[-1]}, expected in_features = {self.in_features}")
        if self.in_features == 0:  # an empty sum, as nn.Linear: zeros (then the bias)
            out = x.new_zeros(*x.shape[:-1], self.out_features)
            return out if self.bias is None else out + self.bias.to(out.dtype)
        out = _Float8LinearFunction.apply(x, self.weight, self._synced_weight_amax(), self.eps)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8=e4m3 forward / e5m2 gradients, current scaling, eps={self.eps}"


def default_module_filter(module: torch.nn.Linear, fqn: str) -> bool:
    """Converts a linear layer when both its dimensions are positive multiples of 16 (what torch._scaled_mm
    needs)."""
    return (module.in_features > 0 and module.out_features > 0 and module.in_features % 16 == 0
            and module.out_features % 16 == 0)


def convert_to_float8_training(model: torch.nn.Module,
                               module_filter_fn: Optional[Callable[[torch.nn.Linear, str], bool]] = None,
                               eps: float = 0.0) -> torch.nn.Module:
    """Replaces, in place, every ``nn.Linear`` of `model` (exactly that type, not subclasses) for which
    ``module_filter_fn(module, fully_qualified_name)`` is true by a Float8Linear sharing its parameters,
    and returns `model`. The default filter is ``default_module_filter``; a given filter replaces it (and
    must then keep dimensions that are multiples of 16 for CUDA). A model that is itself an nn.Linear is
    returned converted. A layer that appears several times (shared weights, ``nn.Sequential(*[lin] * 3)``)
    is replaced by one Float8Linear at every place, so it stays shared; the filter sees it once, under the
    name it has first (as ``model.named_modules()`` lists it)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if module_filter_fn is not None and not callable(module_filter_fn):
        raise TypeError(f"module_filter_fn: expected a callable (module, fqn) -> bool, got "
                        f"{type(module_filter_fn).__name__}")
    _check_eps(eps)  # also when no layer qualifies
    keep = default_module_filter if module_filter_fn is None else module_filter_fn
    done = {}  # id(module) -> what replaces it (itself when kept), so a repeated module is handled once

    def convert(module, fqn):
        if id(module) in done:
            return done[id(module)]
        if type(module) is torch.nn.Linear and keep(module, fqn):
            done[id(module)] = Float8Linear.from_linear(module, eps=eps)
            return done[id(module)]
        done[id(module)] = module
        # _modules, not named_children(): that skips the second and later places of a repeated child.
        for name, child in list(module._modules.items()):
            if child is None:
                continue
            new = convert(child, f"{fqn}.{name}" if fqn else name)
            if new is not child:
                setattr(module, name, new)
        return module

    return convert(model, "")


def float8_linears(model: torch.nn.Module):
    """The Float8Linear modules of `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, Float8Linear)]


@torch.no_grad()
def sync_float8_weight_amax(model: torch.nn.Module, group=None) -> int:
    """Computes the amax of every Float8Linear weight of `model`, all-reduces them with MAX in one
    collective over `group` (the default group when None) when torch.distributed is initialised, and
    stores them for the following forward passes. Returns the number of layers.

    Call it once per step, after the optimizer step: a forward that finds its weight changed since raises
    (in eager mode; compiled code does not check). A weight that holds an inf or a NaN (on any rank) gets
    the amax inf, which the MAX all-reduce keeps and the forward reads as the weight's non-finite flag.
    """
    layers = float8_linears(model)
    if not layers:
        return 0
    # The amax skips NaN: fold the non-finite flag in as inf, so that one collective still carries both.
    amaxes = torch.stack([torch.where(nonfinite != 0, math.inf, amax) for amax, nonfinite in
                          (torch.ops.embscale.amax_nonfinite(m.weight, "auto") for m in layers)])
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=group)
    elif group is not None:
        raise ValueError("group: given, but torch.distributed is not initialised")
    for m, a in zip(layers, amaxes.unbind()):
        m.weight_amax = a
        m._weight_amax_version = _weight_identity(m.weight)
    return len(layers)


def clear_float8_weight_amax(model: torch.nn.Module) -> None:
    """Drops the amax values stored by sync_float8_weight_amax: each forward scales its weight locally."""
    for m in float8_linears(model):
        m.weight_amax = None
        m._weight_amax_version = None


__all__ = ["Float8Linear", "convert_to_float8_training", "default_module_filter", "float8_linears",
           "sync_float8_weight_amax", "clear_float8_weight_amax"]
