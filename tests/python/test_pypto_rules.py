"""tilerope.pypto's rules: each rule of the tile layer broken once inside a jit kernel raises
pypto.TileError with the tile layer's message and the kernel line that broke it, and the kernel
writes nothing."""

# C++ test (tests/test_tile.cc) -> Python twin ([ids] of test_rule unless named)
# TileRules.TileRankAboveFour -> [tile_rank_five], [tile_rank_zero]
# TileRules.TileDimNotPositive -> [tile_dim_zero], [tile_dim_negative]
# TileRules.LastTileDimNotAMultipleOf32Bytes -> [tile_row_48_bytes], [tile_row_16_bytes_bf16]
# TileRules.TileRankDiffersFromOutputRank -> [tile_rank_differs]
# TileRules.OpWithNoTileShape -> [no_tile_shape],
#     test_tile_shape_does_not_survive_into_the_executing_pass
# TileConcat.OneInput -> [concat_one_input]
# TileConcat.OneHundredTwentyNineInputs -> [concat_129_inputs]
# TileConcat.MixedDtype -> [concat_mixed_dtype]
# TileConcat.MixedRank -> [concat_mixed_rank]
# TileConcat.UnequalOtherDims -> [concat_unequal_other_dims]
# TileConcat.PartiallyValidConcatDim -> [concat_partially_valid]
# TileRules.ViewOutOfBounds -> [view_past_dim_0], [view_past_dim_2], [view_negative_offset],
#     [view_rank], [view_of_value_out_of_bounds]
# TileRules.AssembleOutOfBounds -> [assemble_past_dim_0], [assemble_past_dim_1]
# TileRules.AssembleIntoATensorViewedInTheKernel -> test_view_then_assemble_one_tensor_is_a_cycle,
#     [assemble_then_view]
# TileRules.AssembleIntoAnInput -> [assemble_into_an_input] (roles come from use: the cycle)
# TileRules.ViewOfAnOutputBeforeItIsWritten -> [view_output_then_assemble] (roles come from use:
#     the view makes `out` an input, so assembling into it is the cycle)
# TileRules.UnregisteredTensorsAndOpsOutsideAKernel -> test_view_of_a_tensor_of_another_kernel,
#     test_op_outside_a_kernel, test_kernels_do_not_nest, test_ub_below_32_bytes
# TileRules.MixedDtypesInArithmetic -> test_mixed_dtypes_in_arithmetic,
#     [assemble_bf16_into_f32], [set_item_bf16_into_f32]
# TileCheckingPass.AnErrorAfterAValidAssembleWritesNothing
#     -> test_error_after_a_valid_assemble_writes_nothing
# TileUb.OverflowNamesOpTileAndBytesAndWritesNothing -> [ub_overflow_names_op]
# TileUb.ExactFitRunsAndBf16CountsTwoBytes -> test_ub_exact_fit
# TileUb.OverflowInAViewNamesTheTileNotTheWholeView -> [ub_overflow_in_a_view]
# TileUb.CheckingPassCatchesAnOverflowInALaterTileOfAConcat -> [ub_later_concat_tile]
# TileUb.CheckingPassCatchesAnOverflowInAPartiallyValidLaterTile -> [ub_later_partial_tile]
# TileLoop.BadStepOrFactor -> [loop_step_zero], [loop_step_negative], [loop_unroll_factor_zero]
# TileLoop.LoopInsideAnUnrolledLoopIsAnError -> [loop_in_unrolled_loop],
#     [loop_in_loop_unrolled_past_its_trips]
# TileOps.Broadcasting -> [add_no_broadcast]
# TileOps.SumKeepdimTrueAndFalse -> [sum_dim_outside_rank]
# TileOps.AmaxTakesOnlyValidElements -> [amax_dim_outside_rank]
# TileOps.DeinterleaveAndGathermask -> [gathermask_mode_3], [deinterleave_odd_last_dim]
# TileOps.InterleaveIsTheInverseOfDeinterleave -> [interleave_mismatch]
# TileOps.ExpandClone -> [expand_clone_no_broadcast]
# TileOps.ReshapeOfANonContiguousViewIsAnError -> [reshape_non_contiguous],
#     [reshape_partially_valid], [reshape_of_computed], [reshape_element_count]
# TileRoles.ViewedIsAnInputAssembledIsAnOutput -> test_view_of_a_tensor_of_another_kernel
# TileRoles.ViewThenAssembleOneTensorIsACycle -> [assemble_into_an_input], [assemble_then_view]
# TileRoles.OutputSharingMemoryWithAnotherTensorIsAnError
#     -> test_output_sharing_memory_with_an_input, test_two_outputs_sharing_memory
# TileLoops.LoopScopeIteratedByTheCaller -> [loop_in_unrolled_loop] (its begin_chunk misuse has
#     no pypto surface: pypto.loop drives the scope itself)
# Python only: [cast_odd], test_argument_must_match_its_annotation,
#     test_named_dynamic_dim_has_one_extent

import os
import re
from pathlib import Path

import pytest
import torch

import tilerope.pypto as pypto

SHAPE = [4, 8, 32]
SENTINEL = 7.0
F32 = pypto.DT_FP32
BF16 = pypto.DT_BF16

SOURCE = Path(__file__).read_text().splitlines()
AT = re.compile(r"^  at (?P<file>.+):(?P<line>\d+), in (?P<func>\S+): (?P<code>.*)$", re.M)


def line_of(marker: str) -> int:
    """The line of this file that ends with the comment `# <- marker`."""
    hits = [n for n, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# <- {marker}")]
    assert len(hits) == 1, f"marker {marker!r} on lines {hits}"
    return hits[0]


def assert_at(message: str, marker: str) -> None:
    """The message names exactly one kernel line: the one marked `marker` in this file."""
    sites = list(AT.finditer(message))
    assert len(sites) == 1, message
    site = sites[0]
    assert os.path.samefile(site["file"], __file__), message
    assert int(site["line"]) == line_of(marker), message
    assert site["code"] == SOURCE[line_of(marker) - 1].strip(), message


def arange(shape) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).reshape(shape)


def untouched(t: torch.Tensor) -> bool:
    return bool((t == SENTINEL).all())


def make_kernel(body, *, x_shape=SHAPE, out_shape=SHAPE, ub_bytes=192 * 1024, prelude=True):
    """A kernel over x (read) and out (written) that runs body(x, out); with prelude it first
    copies all of x into out, a valid write that the checking pass must keep from happening."""

    @pypto.frontend.jit(ub_bytes=ub_bytes)
    def rule_kernel(x: pypto.Tensor(x_shape, F32), out: pypto.Tensor(out_shape, F32)):
        if prelude and x_shape == out_shape:
            pypto.assemble(pypto.view(x, x_shape, [0] * len(x_shape)), [0] * len(x_shape), out)
        body(x, out)

    return rule_kernel


def breaks(body, marker, *needles, x_shape=SHAPE, out_shape=SHAPE, **kernel_options) -> str:
    """Runs body in make_kernel's kernel: a TileError whose message holds every needle (a str,
    or a compiled regex) and names the line marked `marker`; x and out unchanged."""
    kernel = make_kernel(body, x_shape=x_shape, out_shape=out_shape, **kernel_options)
    x, out = arange(x_shape), torch.full(out_shape, SENTINEL)
    first = needles[0]
    pattern = first if isinstance(first, re.Pattern) else re.escape(first)
    with pytest.raises(pypto.TileError, match=pattern) as info:
        kernel(x, out)
    message = str(info.value)
    for needle in needles[1:]:
        if isinstance(needle, re.Pattern):
            assert needle.search(message), message
        else:
            assert needle in message, message
    assert_at(message, marker)
    assert untouched(out), "a kernel that breaks a rule must write nothing"
    assert torch.equal(x, arange(x_shape))
    return message


# ---- rule bodies: each breaks one rule on the line marked with its name ----------------------


def tile_rank_five(x, out):
    pypto.set_vec_tile_shapes(1, 1, 1, 8, 32)  # <- tile_rank_five


def tile_rank_zero(x, out):
    pypto.set_vec_tile_shapes()  # <- tile_rank_zero


def tile_dim_zero(x, out):
    pypto.set_vec_tile_shapes(1, 0, 32)  # <- tile_dim_zero


def tile_dim_negative(x, out):
    pypto.set_vec_tile_shapes(-2, 8, 32)  # <- tile_dim_negative


def tile_row_48_bytes(x, out):
    pypto.set_vec_tile_shapes(1, 8, 12)
    pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))  # <- tile_row_48_bytes


def tile_row_16_bytes_bf16(x, out):
    pypto.set_vec_tile_shapes(1, 8, 8)
    pypto.cast(pypto.view(x, [1, 8, 32], [0, 0, 0]), BF16)  # <- tile_row_16_bytes_bf16


def tile_rank_differs(x, out):
    pypto.set_vec_tile_shapes(8, 32)
    pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))  # <- tile_rank_differs


def no_tile_shape(x, out):
    pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))  # <- no_tile_shape


def concat_one_input(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.concat([pypto.view(x, [1, 8, 32], [0, 0, 0])], -1)  # <- concat_one_input


def concat_129_inputs(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.concat([pypto.view(x, [1, 8, 8], [0, 0, 0])] * 129, -1)  # <- concat_129_inputs


def concat_mixed_dtype(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a = pypto.view(x, [1, 8, 32], [0, 0, 0])
    pypto.concat([a, a, pypto.cast(a, BF16)], -1)  # <- concat_mixed_dtype


def concat_mixed_rank(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a = pypto.view(x, [1, 8, 32], [0, 0, 0])
    pypto.concat([a, pypto.reshape(a, [8, 32])], -1)  # <- concat_mixed_rank


def concat_unequal_other_dims(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a, b = pypto.view(x, [1, 8, 16], [0, 0, 0]), pypto.view(x, [1, 4, 16], [0, 0, 0])
    pypto.concat([a, b], -1)  # <- concat_unequal_other_dims


def concat_partially_valid(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a, b = pypto.view(x, [1, 8, 16], [0, 0, 0]), pypto.view(x, [1, 8, 16], [0, 0, 0], [1, 8, 12])
    pypto.concat([a, b], -1)  # <- concat_partially_valid


def view_past_dim_0(x, out):
    pypto.view(x, [2, 8, 32], [3, 0, 0])  # <- view_past_dim_0


def view_past_dim_2(x, out):
    pypto.view(x, [1, 8, 16], [0, 0, 20])  # <- view_past_dim_2


def view_negative_offset(x, out):
    pypto.view(x, [1, 8, 32], [-1, 0, 0])  # <- view_negative_offset


def view_rank(x, out):
    pypto.view(x, [8, 32], [0, 0])  # <- view_rank


def view_of_value_out_of_bounds(x, out):
    a = pypto.view(x, [1, 8, 32], [0, 0, 0])
    pypto.view(a, [1, 8, 16], [0, 0, 24])  # <- view_of_value_out_of_bounds


def assemble_past_dim_0(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))
    pypto.assemble(v, [4, 0, 0], out)  # <- assemble_past_dim_0


def assemble_past_dim_1(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))
    pypto.assemble(v, [0, 1, 0], out)  # <- assemble_past_dim_1


def assemble_then_view(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.assemble(pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0])), [0, 0, 0], out)
    pypto.view(out, [1, 8, 32], [0, 0, 0])  # <- assemble_then_view


def assemble_into_an_input(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))
    pypto.assemble(v, [1, 0, 0], x)  # <- assemble_into_an_input


def view_output_then_assemble(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.view(out, [1, 8, 32], [0, 0, 0])
    v = pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))
    pypto.assemble(v, [0, 0, 0], out)  # <- view_output_then_assemble


def assemble_bf16_into_f32(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.cast(pypto.view(x, [1, 8, 32], [0, 0, 0]), BF16)
    pypto.assemble(v, [0, 0, 0], out)  # <- assemble_bf16_into_f32


def set_item_bf16_into_f32(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    out[:] = pypto.cast(pypto.view(x, [4, 8, 32], [0, 0, 0]), BF16)  # <- set_item_bf16_into_f32


def ub_overflow_names_op(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.assemble(pypto.view(x, [1, 8, 32], [3, 0, 0]), [3, 0, 0], out)  # a copy: 1 KiB fits
    for b in pypto.loop(0, 3, 1, name="b", unroll_list=[1]):
        a = pypto.view(x, [1, 8, 32], [b, 0, 0])
        pypto.assemble(pypto.add(pypto.mul(a, a), 1.0), [b, 0, 0], out)  # <- ub_overflow_names_op


def ub_overflow_in_a_view(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.neg(pypto.view(x, [4, 8, 32], [0, 0, 0]))
    pypto.assemble(v, [0, 0, 0], out)  # <- ub_overflow_in_a_view


def ub_later_concat_tile(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a = pypto.view(x, [1, 8, 32], [0, 0, 0])
    deep = pypto.add(pypto.mul(a, a), a)
    pypto.assemble(pypto.concat([a, deep], -1), [0, 0, 0], out)  # <- ub_later_concat_tile


def ub_later_partial_tile(x, out):
    pypto.set_vec_tile_shapes(1, 8)
    v = pypto.view(pypto.neg(pypto.view(x, [1, 32], [0, 0])), [1, 32], [0, 0], [1, 31])
    pypto.assemble(pypto.gathermask(v, 1), [0, 0], out)  # <- ub_later_partial_tile


def loop_step_zero(x, out):
    for _ in pypto.loop(0, 4, 0):  # <- loop_step_zero
        pass


def loop_step_negative(x, out):
    for _ in pypto.loop(0, 4, -1):  # <- loop_step_negative
        pass


def loop_unroll_factor_zero(x, out):
    for _ in pypto.loop(0, 4, 1, unroll_list=[4, 0]):  # <- loop_unroll_factor_zero
        pass


def loop_in_unrolled_loop(x, out):
    for _ in pypto.loop(0, 4, 1, name="outer", unroll_list=[2]):
        for _ in pypto.loop(0, 2, 1, name="inner", unroll_list=[1]):  # <- loop_in_unrolled_loop
            pass


def loop_in_loop_unrolled_past_its_trips(x, out):
    for _ in pypto.loop(0, 2, 1, name="outer", unroll_list=[8]):
        for _ in pypto.loop(0, 2, 1, name="inner"):  # <- loop_in_loop_unrolled_past_its_trips
            pass


def add_no_broadcast(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a, b = pypto.view(x, [1, 8, 32], [0, 0, 0]), pypto.view(x, [1, 4, 32], [0, 0, 0])
    pypto.add(a, b)  # <- add_no_broadcast


def sum_dim_outside_rank(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.sum(pypto.view(x, [1, 8, 32], [0, 0, 0]), 3)  # <- sum_dim_outside_rank


def amax_dim_outside_rank(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    pypto.amax(pypto.view(x, [1, 8, 32], [0, 0, 0]), -4)  # <- amax_dim_outside_rank


def gathermask_mode_3(x, out):
    pypto.set_vec_tile_shapes(1, 8, 8)
    pypto.gathermask(pypto.view(x, [1, 8, 32], [0, 0, 0]), 3)  # <- gathermask_mode_3


def deinterleave_odd_last_dim(x, out):
    pypto.set_vec_tile_shapes(1, 8, 8)
    pypto.deinterleave(pypto.view(x, [1, 8, 15], [0, 0, 0]))  # <- deinterleave_odd_last_dim


def interleave_mismatch(x, out):
    pypto.set_vec_tile_shapes(1, 8, 8)
    even, odd = pypto.view(x, [1, 8, 16], [0, 0, 0]), pypto.view(x, [1, 8, 8], [0, 0, 0])
    pypto.interleave(even, odd)  # <- interleave_mismatch


def expand_clone_no_broadcast(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    row = pypto.view(x, [1, 2, 32], [0, 0, 0])
    pypto.expand_clone(row, [1, 8, 32])  # <- expand_clone_no_broadcast


def reshape_non_contiguous(x, out):
    pypto.reshape(pypto.view(x, [1, 8, 16], [0, 0, 0]), [8, 16])  # <- reshape_non_contiguous


def reshape_partially_valid(x, out):
    v = pypto.view(x, [1, 8, 32], [0, 0, 0], [1, 7, 32])
    pypto.reshape(v, [8, 32])  # <- reshape_partially_valid


def reshape_of_computed(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v = pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0]))
    pypto.reshape(v, [8, 32])  # <- reshape_of_computed


def reshape_element_count(x, out):
    pypto.reshape(pypto.view(x, [1, 8, 32], [0, 0, 0]), [8, 16])  # <- reshape_element_count


def cast_odd(x, out):
    pypto.set_vec_tile_shapes(1, 8, 32)
    a = pypto.view(x, [1, 8, 32], [0, 0, 0])
    pypto.cast(a, BF16, pypto.CastMode.CAST_ODD)  # <- cast_odd


def case(body, *needles, **kernel_options):
    return pytest.param(body, needles, kernel_options, id=body.__name__)


RULES = [
    case(tile_rank_five, "set_vec_tile_shapes[1, 1, 1, 8, 32]", "a tile has 1..4 dims, got 5"),
    case(tile_rank_zero, "a tile has 1..4 dims, got 0"),
    case(tile_dim_zero, "set_vec_tile_shapes[1, 0, 32]: every dim must be > 0"),
    case(tile_dim_negative, "set_vec_tile_shapes[-2, 8, 32]: every dim must be > 0"),
    case(tile_row_48_bytes, "op 'neg'", "tile shape [1, 8, 12]",
         "last dim (12) * sizeof(f32) = 48 bytes", "not a multiple of 32 bytes"),
    case(tile_row_16_bytes_bf16, "op 'cast'", "sizeof(bf16) = 16 bytes"),
    case(tile_rank_differs, "op 'neg'", "tile shape [8, 32] has rank 2",
         "the op's output [1, 8, 32] has rank 3"),
    case(no_tile_shape, "op 'neg': no tile shape set"),
    case(concat_one_input, "op 'concat': 1 inputs; concat takes 2..128"),
    case(concat_129_inputs, "op 'concat': 129 inputs; concat takes 2..128"),
    case(concat_mixed_dtype, "op 'concat': input 2 is bf16, input 0 is f32"),
    case(concat_mixed_rank, "op 'concat': input 1 [8, 32] and input 0 [1, 8, 32] differ in rank"),
    case(concat_unequal_other_dims,
         "input 1 [1, 4, 16] and input 0 [1, 8, 16] differ in dim 1", "(not the concat dim 2)"),
    case(concat_partially_valid, "input 1 is valid for 12 of 16 along the concat dim 2",
         "it must be fully valid"),
    case(view_past_dim_0, "view of 'x' with shape [2, 8, 32] at offsets [3, 0, 0]",
         "of [4, 8, 32] is out of bounds"),
    case(view_past_dim_2, "at offsets [0, 0, 20]", "is out of bounds"),
    case(view_negative_offset, "is out of bounds"),
    case(view_rank, re.compile(r"view of 'x'.*(ranks differ|has rank 2, the tensor "
                               r"\[4, 8, 32\] has rank 3)")),
    case(view_of_value_out_of_bounds, "view of a [1, 8, 32] value with shape [1, 8, 16]",
         "is out of bounds"),
    case(assemble_past_dim_0, "assemble into 'out' with shape [1, 8, 32] at offsets [4, 0, 0]",
         "is out of bounds"),
    case(assemble_past_dim_1, "at offsets [0, 1, 0]", "is out of bounds"),
    case(assemble_then_view, "view of output 'out' after assembling into it", "a cycle"),
    case(assemble_into_an_input,
         "assemble into 'x' after viewing it: viewing and assembling one tensor in a kernel "
         "is a cycle"),
    case(view_output_then_assemble,
         "assemble into 'out' after viewing it: viewing and assembling one tensor in a kernel "
         "is a cycle", prelude=False),
    case(assemble_bf16_into_f32, "assemble of a bf16 value into f32 tensor 'out'"),
    case(set_item_bf16_into_f32, "assemble of a bf16 value into f32 tensor 'out'"),
    case(ub_overflow_names_op, "UB overflow in kernel 'rule_kernel'",
         "op 'mul' with tile [1, 8, 32]",
         "needs 1024 bytes more with 1024 live; the UB holds 1536 bytes",
         ub_bytes=1536, prelude=False),
    case(ub_overflow_in_a_view, "op 'view' with tile [1, 8, 32] needs 1024 bytes more",
         ub_bytes=1536, prelude=False),
    case(ub_later_concat_tile, "UB overflow", x_shape=[1, 8, 32], out_shape=[1, 8, 64],
         ub_bytes=4096),
    case(ub_later_partial_tile, "UB overflow", x_shape=[1, 32], out_shape=[1, 16], ub_bytes=200),
    case(loop_step_zero, "step (0) must be > 0"),
    case(loop_step_negative, "step (-1) must be > 0"),
    case(loop_unroll_factor_zero, "unroll factor (0) must be >= 1"),
    case(loop_in_unrolled_loop, "loop 'inner' is nested in loop 'outer', which is unrolled",
         "only the innermost loop may be unrolled"),
    case(loop_in_loop_unrolled_past_its_trips, "nested in loop 'outer'"),
    case(add_no_broadcast, "op 'add': shapes [1, 8, 32] and [1, 4, 32] do not broadcast"),
    case(sum_dim_outside_rank, "op 'sum': dim 3 is outside rank 3"),
    case(amax_dim_outside_rank, "op 'amax': dim -4 is outside rank 3"),
    case(gathermask_mode_3, "op 'gathermask': mode 3 is not 1 (even) or 2 (odd)"),
    case(deinterleave_odd_last_dim, "op 'deinterleave': last dim 15 must be even"),
    case(interleave_mismatch, "op 'interleave'", "must match in shape and dtype"),
    case(expand_clone_no_broadcast, "op 'expand_clone'", "do not broadcast"),
    case(reshape_non_contiguous,
         "op 'reshape': [1, 8, 16] must be a fully valid view of contiguous memory"),
    case(reshape_partially_valid, "op 'reshape'", "must be a fully valid view"),
    case(reshape_of_computed, "op 'reshape'", "must be a fully valid view"),
    case(reshape_element_count, "op 'reshape': [1, 8, 32] has 256 elements, [8, 16] has 128"),
    case(cast_odd, "CAST_ODD", "not supported"),
]


@pytest.mark.parametrize("body,needles,kernel_options", RULES)
def test_rule(body, needles, kernel_options):
    """Each rule broken once: TileError with the tile layer's message at the breaking line."""
    breaks(body, body.__name__, *needles, **kernel_options)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_mixed_dtypes_in_arithmetic(op):
    """add / sub / mul / div take one dtype: cast one input first."""

    def body(x, out):
        pypto.set_vec_tile_shapes(1, 8, 32)
        a = pypto.view(x, [1, 8, 32], [0, 0, 0])
        getattr(pypto, op)(a, pypto.cast(a, BF16))  # <- mixed_dtypes

    breaks(body, "mixed_dtypes", f"op '{op}': dtypes differ (f32 and bf16)", "cast one first")


def test_tile_shape_does_not_survive_into_the_executing_pass():
    """The tile shape is kernel state: each pass starts with none set."""
    calls = []

    def body(x, out):
        if not calls:
            pypto.set_vec_tile_shapes(1, 8, 32)
        calls.append(1)
        pypto.add(pypto.view(x, [1, 8, 32], [0, 0, 0]), 1.0)  # <- tile_not_kept

    breaks(body, "tile_not_kept", "op 'add': no tile shape set", prelude=False)
    assert len(calls) == 2


def test_view_then_assemble_one_tensor_is_a_cycle():
    """A tensor the kernel views is an input: assembling into it too is a cycle."""
    t = torch.full((8, 32), 2.0)

    @pypto.frontend.jit
    def cycle(t: pypto.Tensor([8, 32], F32)):
        pypto.set_vec_tile_shapes(8, 32)
        v = pypto.neg(pypto.view(t, [8, 32], [0, 0]))
        pypto.assemble(v, [0, 0], t)  # <- one_tensor_cycle

    with pytest.raises(pypto.TileError, match=re.escape(
            "assemble into 't' after viewing it: viewing and assembling one tensor in a kernel "
            "is a cycle")) as info:
        cycle(t)
    assert_at(str(info.value), "one_tensor_cycle")
    assert bool((t == 2.0).all())


def test_error_after_a_valid_assemble_writes_nothing():
    """The checking pass raises before the executing pass runs: nothing is written."""
    runs = []

    def body(x, out):
        runs.append(1)
        pypto.set_vec_tile_shapes(1, 8, 32)
        pypto.assemble(pypto.neg(pypto.view(x, [1, 8, 32], [0, 0, 0])), [0, 0, 0], out)
        v = pypto.neg(pypto.view(x, [1, 8, 32], [1, 0, 0]))
        pypto.assemble(v, [4, 0, 0], out)  # <- late_error

    breaks(body, "late_error", "out of bounds", prelude=False)
    assert len(runs) == 1


def test_ub_exact_fit():
    """mul(a, a) on a [1, 8, 32] f32 tile holds 3 KiB: 3071 bytes overflow, 3072 fit."""

    def body(x, out):
        pypto.set_vec_tile_shapes(1, 8, 32)
        a = pypto.view(x, [1, 8, 32], [0, 0, 0])
        pypto.assemble(pypto.mul(a, a), [0, 0, 0], out)  # <- ub_exact_fit

    breaks(body, "ub_exact_fit", "UB overflow", ub_bytes=3071, prelude=False)
    kernel = make_kernel(body, ub_bytes=3072, prelude=False)
    x, out = arange(SHAPE), torch.full(SHAPE, SENTINEL)
    kernel(x, out)
    assert kernel.last_report["peak_ub_bytes"] == 3072
    assert torch.equal(out[0], x[0] * x[0])
    assert untouched(out[1:])


def stray_tensor():
    """A pypto.Tensor that was bound in a kernel which has ended (and the array behind it)."""
    kept = []
    data = torch.zeros(32)

    @pypto.frontend.jit
    def keep(stray: pypto.Tensor([32], F32)):
        kept.append(stray)

    keep(data)
    return kept[-1], data


def test_view_of_a_tensor_of_another_kernel():
    """A kernel views only its own parameters."""
    stray, _data = stray_tensor()

    def body(x, out):
        pypto.view(stray, [32], [0])  # <- stray_view

    breaks(body, "stray_view",
           "view of 'stray': the tensor is not an input or output of kernel 'rule_kernel'")


OUTSIDE = {
    "view": lambda t: pypto.view(t, [32], [0]),  # <- outside_view
    "set_vec_tile_shapes": lambda t: pypto.set_vec_tile_shapes(8),  # <- outside_set_vec_tile_shapes
    "neg": lambda t: pypto.neg(t),  # <- outside_neg
    "loop": lambda t: pypto.loop(4),  # <- outside_loop
}


@pytest.mark.parametrize("op", list(OUTSIDE))
def test_op_outside_a_kernel(op):
    """Tile ops run only in the body of a jit kernel."""
    stray, data = stray_tensor()
    with pytest.raises(pypto.TileError, match=f"pypto.{op} called outside a kernel") as info:
        OUTSIDE[op](stray)
    assert_at(str(info.value), f"outside_{op}")
    assert bool((data == 0).all())


def test_kernels_do_not_nest():
    """A kernel cannot be called from the body of another."""
    y = torch.full(SHAPE, SENTINEL)

    @pypto.frontend.jit
    def inner(y: pypto.Tensor(SHAPE, F32)):
        pypto.set_vec_tile_shapes(1, 8, 32)

    def body(x, out):
        inner(y)  # <- nested_kernel

    breaks(body, "nested_kernel", "kernels do not nest")
    assert untouched(y)


def test_ub_below_32_bytes():
    """The unified buffer holds at least one 32-byte vector."""
    with pytest.raises(ValueError, match=r"ub_bytes must be an int >= 32, got 16"):
        pypto.frontend.jit(ub_bytes=16)


@pytest.mark.parametrize("bad,error,message", [
    ("dtype", TypeError, r"parameter 'x' is annotated pypto.DT_FP32 but got dtype torch.float16"),
    ("shape", ValueError,
     r"parameter 'out' is annotated with shape \[4, 8, 32\] but got shape \[4, 8, 16\]"),
    ("rank", ValueError,
     r"parameter 'x' is annotated with shape \[4, 8, 32\] \(rank 3\) but got shape \[32, 32\]"),
    ("not an array", TypeError, r"parameter 'x' is annotated pypto.Tensor but got list"),
])
def test_argument_must_match_its_annotation(bad, error, message):
    """An array argument has the dtype and shape of its pypto.Tensor annotation."""

    @pypto.frontend.jit
    def copy(x: pypto.Tensor(SHAPE, F32), out: pypto.Tensor(SHAPE, F32)):
        pypto.assemble(pypto.view(x, SHAPE, [0, 0, 0]), [0, 0, 0], out)

    x, out = arange(SHAPE), torch.full(SHAPE, SENTINEL)
    args = {
        "dtype": (x.half(), out),
        "shape": (x, torch.full([4, 8, 16], SENTINEL)),
        "rank": (x.reshape(32, 32), out),
        "not an array": (x.tolist(), out),
    }[bad]
    with pytest.raises(error, match=message):
        copy(*args)
    assert untouched(args[1])


def test_named_dynamic_dim_has_one_extent():
    """Every dim named S has one extent in a call."""
    S = pypto.frontend.dynamic("S")

    @pypto.frontend.jit
    def add_kernel(x: pypto.Tensor([S, 32], F32), y: pypto.Tensor([S, 32], F32),
                   out: pypto.Tensor([pypto.DYNAMIC, 32], F32)):
        pypto.set_vec_tile_shapes(4, 32)
        out[:] = pypto.add(x, y)

    x, out = arange([8, 32]), torch.full([8, 32], SENTINEL)
    with pytest.raises(ValueError, match=r"dynamic dim 'S' is 8 in 'x' \(dim 0\) but 4 in 'y'"):
        add_kernel(x, arange([4, 32]), out)
    assert untouched(out)
    add_kernel(x, x, out)
    assert torch.equal(out, 2 * x)


def assert_in_kernel(message: str, name: str, marker: str) -> None:
    """The message names kernel `name`, defined at the line marked `marker` in this file."""
    site = re.search(rf"in kernel '{name}' \((?P<file>.+):(?P<line>\d+)\)", message)
    assert site, message
    assert os.path.samefile(site["file"], __file__), message
    assert int(site["line"]) == line_of(marker), message


@pytest.mark.parametrize("overlap", ["same tensor", "one row apart"])
def test_output_sharing_memory_with_an_input(overlap):
    """A kernel's output may not share memory with its input."""
    buf = arange([8, 32])
    x, out = (buf, buf) if overlap == "same tensor" else (buf[0:4], buf[1:5])

    @pypto.frontend.jit  # <- share_kernel
    def share(x: pypto.Tensor([pypto.DYNAMIC, 32], F32),
              out: pypto.Tensor([pypto.DYNAMIC, 32], F32)):
        pypto.set_vec_tile_shapes(4, 32)
        pypto.assemble(pypto.neg(pypto.view(x, x.shape, [0, 0])), [0, 0], out)

    with pytest.raises(pypto.TileError,
                       match="input 'x' and output 'out' share memory") as info:
        share(x, out)
    assert_in_kernel(str(info.value), "share", "share_kernel")
    assert torch.equal(buf, arange([8, 32]))
    share(buf[0:4], buf[4:8])  # disjoint rows of one buffer are fine
    assert torch.equal(buf[4:8], -buf[0:4])


def test_two_outputs_sharing_memory():
    """Two outputs of a kernel may not share memory."""
    src, buf = arange([4, 32]), torch.full([8, 32], SENTINEL)

    @pypto.frontend.jit  # <- two_outputs_kernel
    def two(src: pypto.Tensor([4, 32], F32), x: pypto.Tensor([8, 32], F32),
            y: pypto.Tensor([4, 32], F32)):
        pypto.set_vec_tile_shapes(4, 32)
        v = pypto.neg(pypto.view(src, [4, 32], [0, 0]))
        pypto.assemble(v, [0, 0], x)
        pypto.assemble(v, [0, 0], y)

    with pytest.raises(pypto.TileError, match="output 'x' and output 'y' share memory") as info:
        two(src, buf, buf[1:5])
    assert_in_kernel(str(info.value), "two", "two_outputs_kernel")
    assert untouched(buf)
