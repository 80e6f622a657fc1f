"""The article's reference skeleton (rope.md), line for line: six ops (view, neg, concat, mul,
add, assemble) inside pypto.loop over the batch axis. The placeholders are filled from the input
shape: sl = [B, S, D], batch = sl[0], inner = sl[1:], half = D // 2."""

import tilerope.pypto as pypto


def make_rope_kernel(sl, pypto_dtype):
    """The skeleton for inputs of shape sl and dtype pypto_dtype (a, cos, sin and out alike)."""
    sl = list(sl)
    batch = sl[0]
    inner = sl[1:]
    half = sl[-1] // 2

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.NPU})
    def rope_kernel(a: pypto.Tensor(sl, pypto_dtype), cos: pypto.Tensor(sl, pypto_dtype),
                    sin: pypto.Tensor(sl, pypto_dtype), out: pypto.Tensor(sl, pypto_dtype)):
        for i in pypto.loop(batch, name="batch", unroll_list=[1]):
            a_s = pypto.view(a, [1] + inner, [i] + [0] * len(inner))
            cos_s = pypto.view(cos, [1] + inner, [i] + [0] * len(inner))
            sin_s = pypto.view(sin, [1] + inner, [i] + [0] * len(inner))
            pypto.set_vec_tile_shapes(1, *inner)
            neg_a2 = pypto.neg(pypto.view(a_s, [1] + inner[:-1] + [half],
                                          [0] * len([1] + inner[:-1]) + [half]))
            a1 = pypto.view(a_s, [1] + inner[:-1] + [half], [0] * len([1] + inner))
            rot = pypto.concat([neg_a2, a1], dim=-1)
            r = pypto.add(pypto.mul(a_s, cos_s), pypto.mul(rot, sin_s))
            pypto.assemble(r, [i] + [0] * len(inner), out)

    return rope_kernel


def _golden(a, cos, sin):
    """a * cos + rotate_half(a) * sin in float64, from the rounded inputs."""
    import torch

    a, cos, sin = a.double(), cos.double(), sin.double()
    h = a.shape[-1] // 2
    return a * cos + torch.cat((-a[..., h:], a[..., :h]), dim=-1) * sin


def main(argv=None) -> int:
    """Runs the skeleton at a few [B, S, D] in f32, f16 and bf16 and prints the largest error
    against the fp64 golden, with the tolerance it is held to. Exit status 1 if one is over."""
    import argparse

    import torch

    # each op rounds to the dtype (unit roundoff u): |out - golden| <= 2u (|a cos| + |rot sin|)
    dtypes = {"f32": (torch.float32, pypto.DT_FP32, 3 * 2.0**-24),
              "f16": (torch.float16, pypto.DT_FP16, 3 * 2.0**-11),
              "bf16": (torch.bfloat16, pypto.DT_BF16, 3 * 2.0**-8)}
    p = argparse.ArgumentParser(prog="python -m tilerope.pypto.examples.skeleton",
                                description=main.__doc__)
    p.add_argument("--shape", action="append", metavar="B,S,D",
                   help="input shape (repeatable; default 2,16,64 3,8,128 4,32,32)")
    p.add_argument("--dtype", action="append", choices=sorted(dtypes),
                   help="dtype (repeatable; default all three)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shapes = [[int(d) for d in s.split(",")] for s in (args.shape or ["2,16,64", "3,8,128",
                                                                       "4,32,32"])]
    gen = torch.Generator().manual_seed(args.seed)
    failed = 0
    for shape in shapes:
        for name in args.dtype or ["f32", "f16", "bf16"]:
            tdtype, pdtype, rtol = dtypes[name]
            a, cos, sin = (torch.randn(shape, generator=gen).to(tdtype) for _ in range(3))
            out = torch.full(shape, float("nan"), dtype=tdtype)
            kernel = make_rope_kernel(shape, pdtype)
            kernel(a, cos, sin, out)
            golden = _golden(a, cos, sin)
            err = (out.double() - golden).abs()
            bound = rtol * (a.double() * cos.double()).abs() + rtol * (
                torch.cat((-a[..., shape[-1] // 2:], a[..., :shape[-1] // 2]), -1).double()
                * sin.double()).abs() + 2.0**-22
            ok = bool((err <= bound).all())
            failed += not ok
            r = kernel.last_report
            print(f"rope skeleton {shape} {name}: max |out - fp64 golden| = {err.max().item():.3g}"
                  f" ({'within' if ok else 'OUTSIDE'} {rtol:.3g} * (|a cos| + |rot sin|)); UB peak "
                  f"{r['peak_ub_bytes']} of {r['ub_budget_bytes']} bytes, {r['tiles']} tiles")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
