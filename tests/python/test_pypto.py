"""tilerope.pypto: the article's skeleton line for line, every op of the module against values
computed here, loops and dynamic dims, and the kernel's reports. The source material's four
production kernels on its case files are in test_pypto_kernels.py; the rules as errors in
test_pypto_rules.py."""

import numpy as np
import pytest
import torch

import tilerope
import tilerope.pypto as pypto
from tilerope.pypto.examples import skeleton

from pypto_golden import assert_close, rope, rotate_half

DTYPES = {torch.float32: pypto.DT_FP32, torch.float16: pypto.DT_FP16,
          torch.bfloat16: pypto.DT_BF16}
# unit roundoff of each dtype
U = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


# ---- the skeleton --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [[1, 1, 32], [2, 16, 64], [3, 8, 128], [4, 32, 32], [5, 3, 96]])
def test_skeleton_matches_the_golden(shape, dtype):
    """The six ops in pypto.loop over the batch axis, each rounded to the dtype as the vector
    unit would: within 2u(|a cos| + |rot sin|) of the fp64 golden, and close to the production
    kernel."""
    gen = torch.Generator().manual_seed(sum(shape))
    a, cos, sin = (torch.randn(shape, generator=gen).to(dtype) for _ in range(3))
    half = shape[-1] // 2
    cos = torch.cat([cos[..., :half]] * 2, -1)  # real tables repeat over the halves
    sin = torch.cat([sin[..., :half]] * 2, -1)
    out = torch.full(shape, float("nan"), dtype=dtype)
    kernel = skeleton.make_rope_kernel(shape, DTYPES[dtype])
    kernel(a, cos, sin, out)
    golden = rope(a, cos, sin)
    terms = (a.double() * cos.double()).abs() + (rotate_half(a).double() * sin.double()).abs()
    bound = 2 * U[dtype] * terms + 2.0**-24
    err = (out.double() - golden).abs()
    assert bool((err <= bound).all()), f"worst |err| {err.max().item():.3g}"
    # the report: one loop over the batch, one assemble per iteration, UB within budget
    r = kernel.last_report
    assert r["chunks"] == [(0, shape[0], 1)]
    assert r["assembles"] == shape[0]
    assert 0 < r["peak_ub_bytes"] <= r["ub_budget_bytes"]
    # the production kernel on the same rows, fp32 math rounded once
    prod = tilerope.apply_rotary_pos_emb(a.unsqueeze(2), a.unsqueeze(2), cos, sin,
                                         unsqueeze_dim=2)[0].squeeze(2)
    assert_close(prod, golden, U[dtype] * 2, U[dtype] * 2, "production")
    # the tile program (rounded per op) and the production kernel (rounded once) differ only
    # by the skeleton's extra roundings
    assert bool(((out.double() - prod.double()).abs() <= bound + U[dtype] * golden.abs()).all())


def test_skeleton_one_liner_prints_errors(capsys):
    """python -m tilerope.pypto.examples.skeleton: one line per shape and dtype, all within."""
    assert skeleton.main(["--shape", "2,8,64", "--dtype", "bf16", "--dtype", "f32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert all("max |out - fp64 golden|" in line and "within" in line for line in lines)


def test_skeleton_runs_with_numpy_arrays():
    """Arrays other than torch tensors: numpy float32."""
    rng = np.random.default_rng(3)
    a, cos, sin = (rng.standard_normal((2, 4, 32), dtype=np.float32) for _ in range(3))
    out = np.zeros_like(a)
    skeleton.make_rope_kernel([2, 4, 32], pypto.DT_FP32)(a, cos, sin, out)
    want = rope(torch.from_numpy(a), torch.from_numpy(cos), torch.from_numpy(sin))
    assert_close(torch.from_numpy(out), want, 1e-6, 1e-6, "numpy")


# ---- every op ------------------------------------------------------------------------------


def run_op(make, *inputs, out_shape=None, tile=None, out_dtype=None):
    """Runs ``out[:] = make(*views)`` in a kernel over f32 (or the inputs') arrays."""
    out_shape = out_shape or list(inputs[0].shape)
    out = torch.full(out_shape, -7.0, dtype=out_dtype or inputs[0].dtype)
    tile = tile or [min(8, d) for d in out_shape[:-1]] + [32]

    def body(*ts):
        pypto.set_vec_tile_shapes(*tile)
        ts[-1][:] = make(*ts[:-1])

    return _run_positional(body, list(inputs) + [out]), out


def _run_positional(body, arrays):
    """A jit kernel of len(arrays) tensor parameters t0..tn running body(t0, ..., tn)."""
    names = [f"t{i}" for i in range(len(arrays))]
    src = (f"def kernel({', '.join(n + ': pypto.Tensor' for n in names)}):\n"
           f"    body({', '.join(names)})\n")
    scope = {"pypto": pypto, "body": body}
    exec(src, scope)  # noqa: S102 (a kernel of n parameters, for the op table below)
    kernel = pypto.frontend.jit(scope["kernel"])
    kernel(*arrays)
    return kernel.last_report


def f32(*shape, seed=0, lo=None):
    g = torch.Generator().manual_seed(seed + 17 * len(shape))
    x = torch.randn(shape, generator=g)
    return x.abs() + lo if lo is not None else x


BINARY = [
    ("add", pypto.add, torch.add), ("sub", pypto.sub, torch.sub), ("mul", pypto.mul, torch.mul),
    ("div", pypto.div, torch.div)]


@pytest.mark.parametrize("name,op,ref", BINARY)
def test_binary_ops_with_tensors_broadcast_and_scalars(name, op, ref):
    a, b = f32(4, 8, 32, seed=1), f32(4, 1, 32, seed=2, lo=0.5)
    _, out = run_op(lambda x, y: op(x, y), a, b)
    assert torch.equal(out, ref(a, b))
    _, out = run_op(lambda x: op(x, 2.5), a)
    assert torch.equal(out, ref(a, 2.5))
    # a scalar first operand: add, mul (commutative) and div (2.5 / x); sub via the operator
    if name == "div":
        _, out = run_op(lambda x: op(2.5, x), b.expand(4, 8, 32).contiguous())
        b3 = b.expand(4, 8, 32)
        assert torch.equal(out, torch.div(torch.full_like(b3, 2.5), b3))  # a true division


def test_python_operators_are_the_ops():
    a, b = f32(2, 8, 32, seed=3), f32(2, 8, 32, seed=4, lo=0.25)
    _, out = run_op(lambda x, y: (x + y) * 2.0 - y / 4.0 + (-x) - (1.0 - y) + 3.0 / y, a, b)
    want = (((a + b) * 2.0 - b / 4.0) + (-a)) - (1.0 - b) + 3.0 / b
    assert torch.allclose(out, want, rtol=0, atol=1e-5)


def test_neg_and_rsqrt():
    x = f32(3, 8, 32, seed=5, lo=0.1)
    _, out = run_op(pypto.neg, x)
    assert torch.equal(out, -x)
    _, out = run_op(pypto.rsqrt, x)
    assert torch.allclose(out, torch.rsqrt(x), rtol=2e-7, atol=0)


@pytest.mark.parametrize("keepdim", [True, False])
def test_sum_and_amax(keepdim):
    x = f32(2, 8, 64, seed=6) - 3.0  # mostly negative: a padded 0 would win an amax
    shape = [2, 8, 1] if keepdim else [2, 8]
    tile = [2, 8, 32] if keepdim else [2, 32]
    _, out = run_op(lambda v: pypto.sum(v, -1, keepdim=keepdim), x, out_shape=shape, tile=tile)
    assert torch.allclose(out, x.sum(-1, keepdim=keepdim), rtol=1e-6, atol=1e-5)
    _, out = run_op(lambda v: pypto.amax(v, -1, keepdim), x, out_shape=shape, tile=tile)
    assert torch.equal(out, x.amax(-1, keepdim=keepdim))
    # a tail: valid for 5 of 8 rows; sum over rows of the valid ones only
    _, out = run_op(lambda v: pypto.amax(pypto.view(v, [2, 8, 64], [0, 0, 0], [2, 5, 64]), 1,
                                         keepdim=True), x, out_shape=[2, 1, 64], tile=[2, 8, 32])
    assert torch.equal(out, x[:, :5].amax(1, keepdim=True))


@pytest.mark.parametrize("mode,ref", [
    (pypto.CastMode.CAST_NONE, lambda x: x.to(torch.bfloat16)),
    (pypto.CastMode.CAST_RINT, lambda x: x.to(torch.bfloat16)),
    (pypto.CastMode.CAST_TRUNC, lambda x: (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
     .to(torch.bfloat16)),
])
def test_cast_rounding(mode, ref):
    x = f32(2, 8, 32, seed=7) * 3.3
    _, out = run_op(lambda v: pypto.cast(v, pypto.DT_BF16, mode), x, out_dtype=torch.bfloat16)
    assert torch.equal(out, ref(x))


def test_cast_floor_ceil_round_bracket_the_value():
    x = f32(1, 8, 32, seed=8) * 5.1
    outs = {}
    for m in (pypto.CastMode.CAST_FLOOR, pypto.CastMode.CAST_CEIL, pypto.CastMode.CAST_ROUND):
        _, outs[m] = run_op(lambda v, m=m: pypto.cast(v, pypto.DT_FP16, m), x,
                            out_dtype=torch.float16)
    lo, hi = outs[pypto.CastMode.CAST_FLOOR].float(), outs[pypto.CastMode.CAST_CEIL].float()
    assert bool((lo <= x).all() and (x <= hi).all())
    near = outs[pypto.CastMode.CAST_ROUND].float()
    assert bool(((near == lo) | (near == hi)).all())
    # widening is exact
    h = x.to(torch.float16)
    _, out = run_op(lambda v: pypto.cast(v, pypto.DT_FP32), h, out_dtype=torch.float32)
    assert torch.equal(out, h.float())


def test_concat_deinterleave_interleave_gathermask():
    x = f32(2, 4, 64, seed=9)
    _, out = run_op(lambda v: pypto.concat([pypto.view(v, [2, 4, 32], [0, 0, 32]),
                                            pypto.view(v, [2, 4, 32], [0, 0, 0])], dim=-1), x)
    assert torch.equal(out, torch.cat([x[..., 32:], x[..., :32]], -1))
    _, out = run_op(lambda v: pypto.concat(list(pypto.deinterleave(v)), -1), x)
    assert torch.equal(out, torch.cat([x[..., 0::2], x[..., 1::2]], -1))
    _, out = run_op(lambda v: pypto.concat([pypto.gathermask(v, 1), pypto.gathermask(v, 2)], -1),
                    x)
    assert torch.equal(out, torch.cat([x[..., 0::2], x[..., 1::2]], -1))
    _, out = run_op(lambda v: pypto.interleave(*pypto.deinterleave(v)), x)
    assert torch.equal(out, x)


def test_expand_clone_and_reshape():
    w = f32(64, seed=10)
    x = f32(2, 3, 64, seed=11)

    def body(v, weight):
        w3 = pypto.reshape(weight, [1, 1, 64], inplace=True)  # a whole tensor
        return pypto.mul(v, pypto.expand_clone(w3, [2, 3, 64]))

    _, out = run_op(body, x, w)
    assert torch.equal(out, x * w)
    _, out = run_op(lambda v: pypto.reshape(pypto.view(v, [2, 3, 64], [0, 0, 0]), [6, 32, 2]), x,
                    out_shape=[6, 32, 2], tile=[2, 8, 8])
    assert torch.equal(out, x.reshape(6, 32, 2))


def test_view_of_a_value_and_valid_shape_tail():
    """A view of a computed value; a tail window past the tensor's end reads zeros and writes
    only its valid rows."""
    x = f32(10, 4, 32, seed=12)
    out = torch.full((10, 4, 32), -7.0)

    @pypto.frontend.jit
    def kernel(a: pypto.Tensor([pypto.DYNAMIC, 4, 32], pypto.DT_FP32),
               o: pypto.Tensor([pypto.DYNAMIC, 4, 32], pypto.DT_FP32)):
        n = a.shape[0]
        for i in pypto.loop((n + 7) // 8, name="tiles", unroll_list=[2, 1]):
            cur = (n - i * 8).min(8)
            pypto.set_vec_tile_shapes(8, 4, 32)
            blk = pypto.mul(pypto.view(a, [8, 4, 32], [i * 8, 0, 0], valid_shape=[cur, 4, 32]),
                            2.0)
            assert blk.valid_shape == [cur, 4, 32] and blk.shape == [8, 4, 32]
            pypto.assemble(pypto.view(blk, [8, 4, 32], [0, 0, 0]), [i * 8, 0, 0], o)

    kernel(x, out)
    assert torch.equal(out, x * 2.0)
    assert kernel.last_report["chunks"] == [(0, 2, 2)]  # 2 trips, unrolled by 2
    assert kernel.last_report["assembles"] == 2


# ---- loops, symbolic ints, dynamic dims, out[:] ----------------------------------------------


@pytest.mark.parametrize("args,unroll,want_chunks", [
    ((13,), [8, 4, 2], [(0, 8, 8), (8, 12, 4), (12, 13, 1)]),
    ((5, 18), [4], [(5, 17, 4), (17, 18, 1)]),
    ((0, 13, 2), [4], [(0, 8, 4), (8, 13, 1)]),
    ((3,), None, [(0, 3, 1)]),
])
def test_loop_forms_and_unroll_stretches(args, unroll, want_chunks):
    seen = []
    x = torch.zeros(1, 32)
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (list(args) + [1])[:3]
    out = torch.zeros(1, 32)

    @pypto.frontend.jit
    def looping(src: pypto.Tensor, dst: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 32)
        for i in pypto.loop(*args, name="i", unroll_list=unroll):
            assert isinstance(i, pypto.SymInt)
            seen.append(int(i))
        dst[:] = pypto.add(src, 1.0)

    looping(x, out)
    expected = list(range(start, stop, step))
    assert seen == expected * 2  # the body runs in the checking pass and the executing pass
    assert looping.last_report["chunks"] == want_chunks
    assert torch.equal(out, x + 1.0)


def test_symint_min_max_and_arithmetic():
    s = pypto.SymInt(13)
    assert (s - 2 * 8).min(8) == -3 and (s - 8).min(8) == 5 and s.max(20) == 20
    assert isinstance((20 - s * 2) // 3 % 5, pypto.SymInt)
    assert isinstance(-s + 1, pypto.SymInt)


def test_named_dynamic_dims_and_annotations():
    S = pypto.frontend.dynamic("S")

    @pypto.frontend.jit
    def kernel(a: pypto.Tensor([S, 32], pypto.DT_FP16), b: pypto.Tensor([S, 32], pypto.DT_FP16)):
        pypto.set_vec_tile_shapes(8, 32)
        b[:] = pypto.neg(a)

    for n in (1, 9):
        a = torch.randn(n, 32).half()
        b = torch.zeros(n, 32).half()
        kernel(a, b)
        assert torch.equal(b, -a)
    assert repr(S) == "pypto.frontend.dynamic('S')"


def test_jit_accepts_pypto_options_and_reports():
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM,
                                         "stitch_function_max_num": 128},
                        pass_options={"cube_l1_reuse_setting": {-1: 4}}, ub_bytes=64 * 1024)
    def kernel(a: pypto.Tensor([2, 64], pypto.DT_FP32), o: pypto.Tensor([2, 64], pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(1, 32)
        o[:] = pypto.mul(a, a)

    a = torch.randn(2, 64)
    o = torch.zeros(2, 64)
    assert kernel(a, o) is None
    assert torch.equal(o, a * a)
    r = kernel.last_report
    assert r["name"] == "kernel" and r["ub_budget_bytes"] == 64 * 1024
    assert r["tiles"] == 4  # tiles of [1, 32] in the executing pass
    assert kernel.pass_options == {"cube_l1_reuse_setting": {-1: 4}}
    assert kernel.__name__ == "kernel"


def test_scalar_parameters_after_tensors():
    @pypto.frontend.jit
    def kernel(a: pypto.Tensor, o: pypto.Tensor, scale: float = 2.0, *, shift=0.0):
        pypto.set_vec_tile_shapes(4, 32)
        o[:] = pypto.add(pypto.mul(a, scale), shift)

    a = torch.randn(4, 32)
    o = torch.zeros(4, 32)
    kernel(a, o, 3.0, shift=1.0)
    assert torch.equal(o, a * 3.0 + 1.0)
    kernel(a, o)
    assert torch.equal(o, a * 2.0)


def test_dtypes_and_bytes_of():
    assert [pypto.bytes_of(t) for t in (pypto.DT_FP32, pypto.DT_FP16, pypto.DT_BF16)] == [4, 2, 2]
    assert repr(pypto.DT_BF16) == "pypto.DT_BF16"


def test_value_and_tensor_introspection():
    shapes = {}

    @pypto.frontend.jit
    def kernel(a: pypto.Tensor([3, 64], pypto.DT_BF16), o: pypto.Tensor([3, 32], pypto.DT_BF16)):
        shapes["a"] = (a.shape, a.dtype, a.dim())
        pypto.set_vec_tile_shapes(1, 32)
        even, odd = pypto.deinterleave(a)
        shapes["even"] = (even.shape, even.valid_shape, even.dtype)
        o[:] = pypto.sub(even, odd)

    a = torch.randn(3, 64).bfloat16()
    o = torch.zeros(3, 32).bfloat16()
    kernel(a, o)
    assert shapes["a"] == ([3, 64], pypto.DT_BF16, 2)
    assert shapes["even"] == ([3, 32], [3, 32], pypto.DT_BF16)
    assert torch.equal(o, a[:, 0::2] - a[:, 1::2])


def test_kernels_on_two_threads_at_once():
    """Two threads inside their kernels at once (a barrier in the body): the tile layer's state is
    per thread, so neither sees the other's kernel as one it is nested in, and each result is its
    own."""
    import threading

    inside = threading.Barrier(2, timeout=10)

    @pypto.frontend.jit
    def scale(a: pypto.Tensor, o: pypto.Tensor, s: float):
        pypto.set_vec_tile_shapes(4, 32)
        inside.wait()  # both threads are in a kernel body here
        o[:] = pypto.mul(a, s)

    a = torch.randn(16, 32)
    outs = [torch.zeros(16, 32) for _ in range(2)]
    errors = []

    def work(i):
        try:
            for _ in range(3):
                scale(a, outs[i], float(i + 1))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            inside.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, o in enumerate(outs):
        assert torch.equal(o, a * float(i + 1))


def test_a_kernel_that_returns_a_value_is_an_error():
    """Kernels return nothing (PyPTO's frontend writes outputs in place): a returned value is an
    error raised in the checking pass, before any output is written."""

    @pypto.frontend.jit
    def kernel(a: pypto.Tensor, o: pypto.Tensor):
        pypto.set_vec_tile_shapes(4, 32)
        o[:] = pypto.neg(a)
        return pypto.neg(a)

    a, o = torch.randn(4, 32), torch.full((4, 32), 7.0)
    with pytest.raises(pypto.TileError, match="kernel 'kernel' returned a value"):
        kernel(a, o)
    assert bool((o == 7.0).all())


def test_shapes_and_offsets_take_any_integer_scalar():
    """numpy and torch integer scalars (and SymInt) stand for ints; floats and bools do not."""
    @pypto.frontend.jit
    def kernel(a: pypto.Tensor, o: pypto.Tensor):
        n = np.int64(2)
        pypto.set_vec_tile_shapes(np.int32(1), torch.tensor(32))
        for i in pypto.loop(n):
            pypto.assemble(pypto.view(a, [1, np.int64(32)], [i, torch.tensor(0)]), [i, 0], o)

    a, o = torch.randn(2, 32), torch.zeros(2, 32)
    kernel(a, o)
    assert torch.equal(o, a)

    @pypto.frontend.jit
    def bad(a: pypto.Tensor, o: pypto.Tensor):
        pypto.set_vec_tile_shapes(1, 32)
        o[:] = pypto.view(a, [2, 32.0], [0, 0])

    with pytest.raises(TypeError, match=r"view: shape must be a list of ints, got \[2, 32.0\]"):
        bad(a, o)
