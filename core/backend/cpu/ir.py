"""LLVM IR building blocks for the kernels that emit their own vector code as numba intrinsics."""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils

F32, I8, I16, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
LANES = 16
VF32, VI32, VI8 = ir.VectorType(F32, LANES), ir.VectorType(I32, LANES), ir.VectorType(I8, LANES)
V8F32, V8I32 = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
V16I8, V32I8, V16I16 = ir.VectorType(I8, 16), ir.VectorType(I8, 32), ir.VectorType(I16, 16)
FEATURES = llvm.get_host_cpu_features()
# numba compiles for this machine's CPU: with F16C a half converts in one instruction, without it
# LLVM would call a runtime helper numba may not link, so the conversion is done in integers.
HAS_F16C = bool(FEATURES.get("f16c", False))


def widen_halves(builder: ir.IRBuilder, bits):
    """IEEE halves (an i16, or a vector of them) as floats. With F16C one conversion; without it,
    in integers: exponent and mantissa moved into a float's bits and rescaled by 2**112 (exact for
    every finite half, subnormals included), inf and nan rebuilt, the sign put back."""
    n = bits.type.count if isinstance(bits.type, ir.VectorType) else None
    vector = (lambda t: t) if n is None else (lambda t: ir.VectorType(t, n))  # noqa: E731
    i32, f32 = vector(I32), vector(F32)
    if HAS_F16C:
        return builder.fpext(builder.bitcast(bits, vector(ir.HalfType())), f32)

    def const(ty, value):
        return ir.Constant(ty, value if n is None else [value] * n)

    h = builder.zext(bits, i32)
    body = builder.shl(builder.and_(h, const(i32, 0x7FFF)), const(i32, 13))
    finite = builder.fmul(builder.bitcast(body, f32), const(f32, float(2 ** 112)))
    special = builder.icmp_unsigned("==", builder.and_(h, const(i32, 0x7C00)), const(i32, 0x7C00))
    x = builder.select(special, builder.bitcast(builder.or_(body, const(i32, 0x7F800000)), f32), finite)
    sign = builder.shl(builder.and_(h, const(i32, 0x8000)), const(i32, 16))
    return builder.bitcast(builder.or_(builder.bitcast(x, i32), sign), f32)


def call(builder: ir.IRBuilder, name: str, ret, args):
    """A call of the LLVM intrinsic (or declared function) `name`."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def prefetch(builder: ir.IRBuilder, ptr, locality: int = 3):
    """Asks for the cache line at ptr (no fault if it is not mapped); locality 3 keeps it in every
    cache level, 2 in the outer ones."""
    call(builder, "llvm.prefetch.p0", ir.VoidType(),
         [builder.bitcast(ptr, ir.IntType(8).as_pointer()), ir.Constant(I32, 0), ir.Constant(I32, locality),
          ir.Constant(I32, 1)])


def splat(builder: ir.IRBuilder, value, lanes: int = LANES):
    """A scalar in every lane."""
    v = builder.insert_element(ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def constant_lanes(ty: ir.VectorType, value):
    """The constant vector of type `ty` with `value` in every lane."""
    return ir.Constant(ty, [value] * ty.count)


def fma(builder: ir.IRBuilder, a, b, c):
    """a * b + c in one rounding, on floats or float vectors."""
    ty = a.type
    return call(builder, f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32", ty, [a, b, c])


def reduce_add(builder: ir.IRBuilder, v):
    """The sum of a float vector's lanes, as a tree of halvings."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(I32, 0))


def pointer(builder: ir.IRBuilder, base, index, offset: int, ty):
    """A `ty` pointer to base[index + offset]."""
    return builder.bitcast(builder.gep(base, [builder.add(index, ir.Constant(I64, offset))]), ty.as_pointer())


def contiguous(a, dtype) -> bool:
    """Whether the numba type `a` is a C-contiguous array of `dtype` (what an intrinsic reads)."""
    return isinstance(a, types.Array) and a.dtype == dtype and a.layout == "C"


def arrays(context, builder, arg_types, args):
    """An intrinsic's array arguments as numba array structures (.data, .shape)."""
    return [context.make_array(t)(context, builder, a) for t, a in zip(arg_types, args)]
