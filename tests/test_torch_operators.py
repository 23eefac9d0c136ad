"""Operators TVM 0.27's torch frontend lacked, converted wrongly or could not schedule, as
``tvm_ext.relax.torch_import`` converts them: each ``torch.export`` program run on PoCL (some on
CUDA too, ``gpu``) against torch's own outputs in float64, and the refusals by name.  Needs torch
(the test extra installs the CPU build)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tvm_ext.core.errors import TvmExtError  # noqa: E402
from tvm_ext.relax.torch_import import import_exported_program  # noqa: E402


class _Reductions(nn.Module):
    """What TVM 0.27's torch frontend has no converter for (``amax``, ``amin``, ``prod``, ``min.dim``;
    ``logsumexp`` decomposes to ``amax``; adaptive max pools), makes a top-k of (``max.dim``, which
    only TVM's GPU sort runs), or could not schedule (an adaptive pool whose output does not divide
    its input)."""

    def forward(self, x, y):
        values, indices = torch.max(x, dim=1)
        low, where = torch.min(x, dim=0, keepdim=True)
        return (values, indices, low, where, x.amax((0, 2)) + x.amin(), torch.prod(x, 2), torch.prod(x),
                torch.logsumexp(x, 1), nn.functional.adaptive_avg_pool1d(y, 3),
                nn.functional.adaptive_avg_pool2d(y.unsqueeze(0), (2, 2)), nn.functional.adaptive_max_pool1d(y, 3),
                nn.functional.adaptive_max_pool2d(y.unsqueeze(0), (2, 3)))


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_reductions_the_frontend_lacked_run_as_torch_gives_them(kind):
    """Each output against torch's own in float64 (ties in ``max`` / ``min`` resolved to the first
    index, as torch does)."""
    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.target import resolve_target

    target = resolve_target(kind, 0)

    x = torch.tensor([[[1., 3., 3.], [3., 0., 2.]], [[0.5, 2., 2.], [1., 3., 0.]]])  # ties in rows and columns
    y = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(2))
    program = torch.export.export(_Reductions(), (x, y))
    model = load_model(import_exported_program(program), target, None, function="main", log=None)
    outputs = model(x.numpy(), y.numpy())
    with torch.no_grad():
        expected = _Reductions()(x.double(), y.double())
    assert len(outputs) == len(expected)
    for ours, theirs in zip(outputs, expected):
        assert ours.shape == tuple(theirs.shape)
        if theirs.dtype == torch.int64:
            np.testing.assert_array_equal(ours, theirs.numpy())
        else:
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)


class _ConvertedAsTorch(nn.Module):
    """Operators TVM 0.27's torch frontend converted wrongly, silently (SELU's scale dropped, a
    mask's cumulative sum kept in bool, an integer tensor divided as integers, a grid taken in
    the wrong layout) or stopped on (a scalar of another type in a rounding division, an integer
    clamped on one side, ``atan2`` in OpenCL C)."""

    def forward(self, x, i, grid):
        mask = x > 0
        return (nn.functional.selu(x), torch.ops.aten.elu(x, 0.7, 1.3, 0.5), torch.cumsum(mask, 1),
                torch.cumsum(i.int(), 0) + torch.cumprod(i.int(), 1), i / 3, i / i.clamp(min=1),
                torch.div(i, 2, rounding_mode="trunc"), torch.div(i, i.clamp(min=2), rounding_mode="floor"),
                torch.div(x, 0.3, rounding_mode="floor"), x.clamp(max=0.2) + torch.clamp(x, x.flip(0), x.flip(0) + 1),
                i.clamp(max=2), torch.atan2(x, x.flip(1)),
                nn.functional.grid_sample(x[None, None], grid, align_corners=False),
                nn.functional.grid_sample(x[None, None], grid, mode="nearest", padding_mode="border",
                                          align_corners=True))


class _GroupedConvolutions(nn.Module):
    """Grouped convolutions (SqueezeBERT's pointwise ones; a kernel of three; 2-D), which TVM's
    ``Reduction`` rule scheduled into wrong sums or a kernel that did not build."""

    def __init__(self):
        super().__init__()
        self.pointwise = nn.Conv1d(32, 32, 1, groups=4)
        self.wide = nn.Conv1d(32, 16, 3, groups=4, padding=1)
        self.planar = nn.Conv2d(8, 16, 1, groups=2)

    def forward(self, x, y):
        return self.pointwise(x), self.wide(x), self.planar(y)


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_grouped_convolutions_run_as_torch_gives_them(kind):
    """Each output against torch's in float64."""
    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.target import resolve_target

    torch.manual_seed(4)
    module = _GroupedConvolutions().eval()
    x, y = torch.randn(2, 32, 8), torch.randn(2, 8, 5, 3)
    model = load_model(import_exported_program(torch.export.export(module, (x, y))), resolve_target(kind, 0), None,
                       function="main", log=None)
    with torch.no_grad():
        expected = module.double()(x.double(), y.double())
    for ours, theirs in zip(model(x.numpy(), y.numpy()), expected, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_a_concatenation_of_an_empty_slice_runs(opencl):
    """A partial rotary embedding whose rotated part is the whole head (Phi-3's): the pass-through
    slice ``x[..., 4:]`` of a 4-wide head is empty, and the fused kernel concatenating it had
    loops of extent 0, which dlight's fallback divided by ("no schedule")."""
    from tvm_ext.relax.pipeline import load_model

    class PartialRotary(nn.Module):
        def forward(self, x, cos):
            rotated = x[..., :4] * cos + torch.cat((-x[..., 2:4], x[..., :2]), -1)
            return torch.cat((rotated, x[..., 4:]), -1)

    x, cos = torch.randn(2, 3, 4), torch.randn(3, 4)
    model = load_model(import_exported_program(torch.export.export(PartialRotary(), (x, cos))), opencl, None,
                       function="main", log=None)
    (out,) = model(x.numpy(), cos.numpy())
    np.testing.assert_allclose(out, PartialRotary()(x, cos).numpy(), rtol=1e-6, atol=1e-6)


class _SqueezeExcite(nn.Module):
    """A squeeze-and-excitation gate (RegNet's, EfficientNet's): a 1x1 convolution of the pooled
    channels, fused with the gating multiply, which dlight schedules as two kernels with a
    buffer between them that the host function allocates."""

    def __init__(self):
        super().__init__()
        self.squeeze = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return x[:, :4] * torch.sigmoid(self.squeeze(x.mean((2, 3), keepdim=True)))


def test_a_buffer_the_host_allocates_between_kernels_is_given_on_opencl(opencl):
    """Such a function was refused on OpenCL (its kernels took ``workspace:...`` from the host
    function: LeViT, RegNet and MobileViT stopped); the OpenCL executor now allocates the buffer
    as a value of the plan, and the output matches torch."""
    from tvm_ext.relax.pipeline import load_model

    torch.manual_seed(6)
    module, x = _SqueezeExcite().eval(), torch.randn(2, 8, 5, 5)
    model = load_model(import_exported_program(torch.export.export(module, (x,))), opencl, None, function="main",
                       log=None)
    assert [name for step in model._exec.plan.steps for name, _ in step.artifact.workspaces] == \
        ["conv2d_nchw_intermediate"]
    (out,) = model(x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(out, module(x).numpy(), rtol=1e-5, atol=1e-6)


class _Indexing(nn.Module):
    """Advanced indexing as models write it: ``F.unfold`` (ConvBERT's im2col: an index of four
    dimensions beside full slices, which TVM's converter refused), rows, a column per row, two
    broadcast index tensors apart (the broadcast shape first), negative and int32 indices; and
    ``Tensor.unfold``'s sliding windows (no converter in the frontend)."""

    def forward(self, x, rows, cols):
        image = x[:, :, :, None]
        unfolded = nn.functional.unfold(image, kernel_size=[3, 1], padding=[1, 0])
        return (unfolded, x[rows], x[:, cols], x[rows[:, None], :, cols[None, :2]], x[..., -1],
                x[rows.int(), (cols % 4).int() - 4], x.unfold(2, 3, 2), x.unfold(-2, 2, 1))


def test_advanced_indexing_runs_as_torch_gives_it(opencl):
    """Each output on PoCL equal to torch's."""
    from tvm_ext.relax.pipeline import load_model

    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(7))
    rows, cols = torch.tensor([2, -1, 0]), torch.tensor([1, 3, -2])
    model = load_model(import_exported_program(torch.export.export(_Indexing(), (x, rows, cols))), opencl, None,
                       function="main", log=None)
    expected = _Indexing()(x, rows, cols)
    for ours, theirs in zip(model(x.numpy(), rows.numpy(), cols.numpy()), expected, strict=True):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_array_equal(ours, theirs.numpy())


class _Descending(nn.Module):
    """Relative positions counted down (Funnel Transformer's ``arange(8, -8, -1)``), an odd step
    past the end, a float step, each added to an input of its length."""

    def forward(self, x, y, z):
        return (torch.arange(8, -8, -1) + x, torch.arange(5, 0, -2) + y,
                torch.arange(1.0, -1.0, -0.5) + z)


def test_a_descending_arange_has_torchs_length_and_values(opencl):
    """TVM's arange gave ``arange(8, -8, -1)`` a length of 18 (its kernel wrote 16): the import
    stopped at the broadcast after it.  Each output equal to torch's."""
    from tvm_ext.relax.pipeline import load_model

    x, y, z = torch.zeros(16, dtype=torch.int64), torch.ones(3, dtype=torch.int64), torch.zeros(4)
    model = load_model(import_exported_program(torch.export.export(_Descending(), (x, y, z))), opencl, None,
                       function="main", log=None)
    for ours, theirs in zip(model(x.numpy(), y.numpy(), z.numpy()), _Descending()(x, y, z), strict=True):
        np.testing.assert_array_equal(ours, theirs.numpy())


class _OrderStatistics(nn.Module):
    """What the frontend had no converter for: a stable sort (both ways), ``kthvalue``, ``median``
    over a dimension (rows with NaN) and over everything."""

    def forward(self, x, y):
        return (*torch.sort(x, dim=1, stable=True), *torch.sort(x, dim=0, descending=True, stable=True),
                *torch.kthvalue(x, 2, dim=1), *torch.median(y, dim=0, keepdim=True), torch.median(y),
                torch.median(x))


def test_order_statistics_run_as_torch_gives_them(opencl):
    """Sorts equal to torch's, indices too (stable: ties in input order); ``kthvalue`` and
    ``median`` values equal to torch's (NaN where a column holds one), their indices where those
    values are (torch names no particular one of tied elements)."""
    from tvm_ext.relax.pipeline import load_model

    nan = float("nan")
    x = torch.tensor([[3., 1., 3., 2., 1.], [0., 0., 5., -1., 0.], [2., 2., 2., 2., 2.]])
    y = torch.tensor([[1., nan, 3.], [2., 0., 1.], [0., 4., nan], [5., 1., 2.]])
    model = load_model(import_exported_program(torch.export.export(_OrderStatistics(), (x, y))), opencl, None,
                       function="main", log=None)
    ours, theirs = model(x.numpy(), y.numpy()), [t.numpy() for t in _OrderStatistics()(x, y)]
    assert len(ours) == len(theirs)
    for got, expected in zip(ours[:4] + ours[6:7] + ours[8:], theirs[:4] + theirs[6:7] + theirs[8:]):
        np.testing.assert_array_equal(got, expected)  # sorts, the medians' values (NaN alike)
    np.testing.assert_array_equal(ours[4], theirs[4])
    np.testing.assert_array_equal(np.take_along_axis(x.numpy(), ours[5][:, None], 1)[:, 0], theirs[4])
    np.testing.assert_array_equal(ours[7], theirs[7])  # a NaN column: the first NaN, as torch


class _Assignments(nn.Module):
    """Indexed writes as models write them (each refused by TVM's frontend, or left with no
    schedule): rows assigned, a column per row assigned, a mask zeroed, rows added with
    duplicates (``index_put_(..., accumulate=True)``), ``index_add``, negative indices."""

    def forward(self, x, rows, cols, v):
        a, b, c, d = x.clone(), x.clone(), x.clone(), x.clone()
        a[rows] = v
        b[:, cols] = v[0, :4, None]
        c[x < 0] = 0
        d.index_put_((rows[:1].repeat(3),), v, accumulate=True)
        return a, b, c, d, x.index_add(0, rows.abs(), v), x.index_add(1, cols, x[:, :2] * 2)


def test_indexed_writes_run_as_torch_gives_them(opencl):
    """Each output on PoCL against torch's; a boolean mask with several values (a shape torch
    knows only at run time) is refused in one line."""
    from tvm_ext.relax.pipeline import load_model

    gen = torch.Generator().manual_seed(8)
    x, v = torch.randn(4, 5, generator=gen), torch.randn(3, 5, generator=gen)
    rows, cols = torch.tensor([2, 0, -1]), torch.tensor([1, 4])
    model = load_model(import_exported_program(torch.export.export(_Assignments(), (x, rows, cols, v))), opencl,
                       None, function="main", log=None)
    for ours, theirs in zip(model(x.numpy(), rows.numpy(), cols.numpy(), v.numpy()),
                            _Assignments()(x, rows, cols, v), strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)

    class ValuesUnderAMask(nn.Module):
        def forward(self, x, v):
            y = x.clone()
            y[x < 0] = v[:2]
            return y

    with pytest.raises(TvmExtError, match="for a mask of the leading dimensions and one value"):
        import_exported_program(torch.export.export(ValuesUnderAMask(), (x, torch.ones(3))))


class _Buckets(nn.Module):
    """``bucketize`` (values on the boundaries, both sides) and ``searchsorted`` in one sequence
    and in a sequence a row, int32 out (TVM's binary search had no GPU schedule)."""

    def forward(self, x, boundaries, rows, values):
        return (torch.bucketize(x, boundaries), torch.bucketize(x, boundaries, right=True),
                torch.searchsorted(rows, values), torch.searchsorted(rows, values, right=True, out_int32=True),
                torch.searchsorted(boundaries, x, side="right"))


def test_buckets_and_sorted_positions_run_as_torch_gives_them(opencl):
    """Each output equal to torch's, its dtype too."""
    from tvm_ext.relax.pipeline import load_model

    x, boundaries = torch.tensor([[-2., -1., 0., 0.5], [1., 2., -0.5, 0.]]), torch.tensor([-1., 0., 0., 1.])
    rows = torch.sort(torch.randn(3, 5, generator=torch.Generator().manual_seed(9)), -1).values
    values = torch.cat([rows[:, :1], rows[:, 2:3] + 0.1], 1)
    model = load_model(import_exported_program(torch.export.export(_Buckets(), (x, boundaries, rows, values))),
                       opencl, None, function="main", log=None)
    for ours, theirs in zip(model(x.numpy(), boundaries.numpy(), rows.numpy(), values.numpy()),
                            _Buckets()(x, boundaries, rows, values), strict=True):
        assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(ours, theirs.numpy())


class _PoolsStridedAsTheirKernels(nn.Module):
    """Pools given no stride but a dilation or a padding after it: torch exports the stride as
    ``[]`` (the kernel's), which TVM's converter read as strides of no dimensions."""

    def forward(self, x):
        return (nn.functional.max_pool2d(x, 2, dilation=2), nn.functional.avg_pool2d(x, 3, padding=1),
                nn.functional.max_pool3d(x[None], 2, padding=1))


def test_pools_strided_as_their_kernels_run_as_torch_gives_them(opencl):
    """Each output equal to torch's; a max pool whose indices the model reads is refused by name
    (TVM's converter gave them as a placeholder)."""
    from tvm_ext.relax.pipeline import load_model

    x = torch.randn(2, 3, 7, 6, generator=torch.Generator().manual_seed(10))
    model = load_model(import_exported_program(torch.export.export(_PoolsStridedAsTheirKernels(), (x,))), opencl,
                       None, function="main", log=None)
    for ours, theirs in zip(model(x.numpy()), _PoolsStridedAsTheirKernels()(x), strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)

    class Unpooled(nn.Module):
        def forward(self, x):
            values, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
            return nn.functional.max_unpool2d(values, indices, 2)

    with pytest.raises(TvmExtError, match="max_pool2d_with_indices's indices are not converted"):
        import_exported_program(torch.export.export(Unpooled(), (x,)))


def test_copysign_and_rrelu_in_eval_run_as_torch_gives_them(opencl):
    """``copysign`` (a zero of either sign, a scalar) and ``rrelu`` in eval mode (the mean slope),
    which the frontend had no converter for, equal to torch's; ``rrelu`` training is refused."""
    from tvm_ext.relax.pipeline import load_model

    class Signs(nn.Module):
        def forward(self, a, b):
            return (torch.copysign(a, b), torch.copysign(a, -2.0), nn.functional.rrelu(a, 0.1, 0.3),
                    nn.RReLU().eval()(a))

    a, b = torch.randn(2, 4, generator=torch.Generator().manual_seed(11)), torch.tensor([[0., -0., 1., -1.]] * 2)
    model = load_model(import_exported_program(torch.export.export(Signs(), (a, b))), opencl, None,
                       function="main", log=None)
    for ours, theirs in zip(model(a.numpy(), b.numpy()), Signs()(a, b), strict=True):
        np.testing.assert_array_equal(ours, theirs.numpy())
    training = torch.export.export(nn.RReLU().train(), (a,))
    with pytest.raises(TvmExtError, match="rrelu in training mode"):
        import_exported_program(training)


def test_an_adaptive_max_pools_indices_are_refused_by_name():
    """The pool's values are converted; a model that reads its indices (an unpooling) is refused
    in one line, not given indices that are not torch's."""
    class WithIndices(nn.Module):
        def forward(self, x):
            return nn.functional.adaptive_max_pool2d(x, 2, return_indices=True)

    with pytest.raises(TvmExtError, match="adaptive_max_pool2d's indices are not converted"):
        import_exported_program(torch.export.export(WithIndices(), (torch.randn(1, 2, 5, 5),)))


def test_the_reduction_rule_still_takes_other_reductions(opencl):
    """The guard passes only the grouped convolution on: a row sum keeps TVM's ``Reduction``."""
    import tvm

    from tvm_ext.relax.pipeline import legalize_and_fuse
    from tvm_ext.relax.reduction_rule import guarded_reduction_rule

    class SumAndConvolve(nn.Module):
        def __init__(self):
            super().__init__()
            self.pointwise = nn.Conv1d(8, 8, 1, groups=2)

        def forward(self, x):
            return x.sum(-1), self.pointwise(x)

    program = torch.export.export(SumAndConvolve(), (torch.randn(2, 8, 6),))
    funcs = {gv.name_hint: f for gv, f in legalize_and_fuse(import_exported_program(program), opencl).functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    target = tvm.target.Target(opencl.tvm_target())
    taken = {name: guarded_reduction_rule().apply(f, target, False) is not None for name, f in funcs.items()}
    assert taken == {"sum": True, "fused_conv1d_add": False}, taken


def test_operators_the_frontend_converted_wrongly_run_as_torch_gives_them(opencl):
    """Each output on PoCL against torch's on the same inputs (integers exactly)."""
    from tvm_ext.relax.pipeline import load_model

    gen = torch.Generator().manual_seed(5)
    x, i = torch.randn(3, 4, generator=gen), torch.randint(-9, 9, (3, 4), generator=gen)
    grid = torch.rand(1, 2, 3, 2, generator=gen) * 2.4 - 1.2
    program = torch.export.export(_ConvertedAsTorch(), (x, i, grid))
    model = load_model(import_exported_program(program), opencl, None, function="main", log=None)
    outputs = model(x.numpy(), i.numpy(), grid.numpy())
    with torch.no_grad():
        expected = _ConvertedAsTorch()(x, i, grid)
    assert len(outputs) == len(expected)
    for ours, theirs in zip(outputs, expected):
        assert ours.shape == tuple(theirs.shape) and str(ours.dtype) == str(theirs.dtype).removeprefix("torch.")
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-6)


class _LowestMasked(nn.Module):
    """Attention masked as transformers masks it (``masked_fill`` with the lowest float32), a
    query row that sees no key, the max of a row of lowest values, and a third (0.33333334 in
    float32; seven printed digits read back as 0.3333333), in float64 too."""

    def forward(self, scores, keep, x, y):
        hidden = ~(keep[:, None, :] & keep[:, :, None])
        lowest = torch.finfo(scores.dtype).min
        masked = scores.masked_fill(hidden, lowest)
        return torch.softmax(masked, -1), masked.amax(-1), x * (1 / 3), y * (-1 / 3)


def test_the_lowest_float32_and_other_constants_are_exact_in_opencl_kernels(opencl):
    """TVM 0.27's OpenCL code prints float constants to seven digits: the lowest float32 became
    ``-3.402823e+38f``, above it, and a fully masked row's softmax was NaN (torch: uniform).  Each
    output against torch's bit for bit, and the kernels name the lowest by its bits."""
    from tvm_ext.lowering.opencl_constants import prints_exactly
    from tvm_ext.relax.pipeline import load_model

    gen = torch.Generator().manual_seed(3)
    scores, x = torch.randn(2, 5, 5, generator=gen), torch.randn(4, 7, generator=gen)
    keep, y = torch.tensor([[True] * 5, [True, True, True, False, False]]), x.double() * 3.7
    program = torch.export.export(_LowestMasked(), (scores, keep, x, y))
    model = load_model(import_exported_program(program), opencl, None, function="main", log=None)
    outputs = model(scores.numpy(), keep.numpy(), x.numpy(), y.numpy())
    with torch.no_grad():
        expected = _LowestMasked()(scores, keep, x, y)
    np.testing.assert_allclose(outputs[0], expected[0].numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(outputs[0][1, 3:], np.full((2, 5), 0.2, np.float32))
    for ours, theirs in zip(outputs[1:], expected[1:]):
        np.testing.assert_array_equal(ours, theirs.numpy())
    assert "as_float((uint)4286578687)" in "".join(model.sources().values())  # the lowest's bits
    assert not prints_exactly(float(np.finfo(np.float32).min)) and prints_exactly(0.1) and prints_exactly(float("-inf"))
    assert not prints_exactly(-1 / 3, "float64") and prints_exactly(0.1, "float64")


def test_a_kernel_the_device_cannot_compile_is_one_error(opencl):
    """A float16 model on PoCL (no half precision there): the driver's first error as one
    ``TvmExtError``, not pyopencl's build log."""
    from tvm_ext.relax.pipeline import load_model

    class Half(nn.Module):
        def forward(self, h):
            return h * 2

    from tvm_ext.measure.executors import opencl_context

    context, _ = opencl_context(opencl.device_id)
    if "cl_khr_fp16" in context.devices[0].extensions:
        pytest.skip("this OpenCL device computes in half precision")
    program = torch.export.export(Half(), (torch.ones(2, 3, dtype=torch.float16),))
    with pytest.raises(TvmExtError, match=r"^the model's OpenCL kernels do not build on this device: \S"):
        load_model(import_exported_program(program), opencl, None, function="main", log=None)


def test_a_frontends_check_of_the_inputs_runs_on_pocl(opencl):
    """``one_hot``: TVM's frontend checks the class values on the device (``relax.run.assert_op``);
    on OpenCL the check's value is read after the run: the right rows for good ids, one
    ``TvmExtError`` with the frontend's message for an id past the classes (refused before)."""
    from tvm_ext.relax.pipeline import load_model

    class OneHot(nn.Module):
        def forward(self, ids):
            return nn.functional.one_hot(ids, 6)

    ids = torch.tensor([[0, 5, 2]])
    model = load_model(import_exported_program(torch.export.export(OneHot(), (ids,))), opencl, None,
                       function="main", log=None)
    (rows,) = model(ids.numpy())
    np.testing.assert_array_equal(rows, nn.functional.one_hot(ids, 6).numpy())
    with pytest.raises(TvmExtError, match="^one_hot: Class values must be smaller than num_classes"):
        model(np.array([[0, 6, 2]], np.int64))
    (rows,) = model(np.array([[1, 1, 3]]))
    np.testing.assert_array_equal(rows, nn.functional.one_hot(torch.tensor([[1, 1, 3]]), 6).numpy())


class _Scatters(nn.Module):
    """``scatter`` (no two indices alike: torch orders duplicates no way) and ``scatter_add`` /
    ``scatter_reduce`` with duplicates, along both axes, indices smaller than the data; ``mean``
    (integers floored) and each reduction without the data's own values."""

    def forward(self, x, index, rows, i):
        src = x[:, :3]
        return (x.scatter(1, rows, x[:, :2] * 10), x.scatter_add(1, index, src),
                x.scatter_reduce(1, index, src, "prod"), x.scatter_reduce(0, rows[:2] % 3, -x[:2, :3], "amax"),
                x.scatter_reduce(1, index, src - 1, "amin"), x.scatter_reduce(1, index, src, "mean"),
                i.scatter_reduce(1, index, i[:, 1:4], "mean"),
                *(x.scatter_reduce(1, index, src, reduce, include_self=False)
                  for reduce in ("sum", "prod", "mean", "amax", "amin")),
                i.scatter_reduce(1, index, i[:, :3], "mean", include_self=False))


@pytest.mark.parametrize("kind", ["opencl", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_scatters_run_as_torch_gives_them(kind):
    """Each output against torch's: TVM's frontend had no ``scatter_add`` / ``scatter_reduce`` and
    its legalization of ``scatter_elements`` took the CPU kernel no GPU schedule takes ("no
    schedule", ``tvm_ext.relax.scatters``)."""
    from tvm_ext.relax.pipeline import load_model
    from tvm_ext.target import resolve_target

    target = resolve_target(kind, 0)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, generator=gen)
    index = torch.tensor([[0, 0, 4], [2, 3, 2], [1, 1, 1]])
    rows, i = torch.tensor([[4, 1], [0, 2], [3, 0]]), torch.randint(-9, 9, (3, 5), generator=gen)
    model = load_model(import_exported_program(torch.export.export(_Scatters(), (x, index, rows, i))), target, None,
                       function="main", log=None)
    outputs = model(x.numpy(), index.numpy(), rows.numpy(), i.numpy())
    with torch.no_grad():
        expected = _Scatters()(x, index, rows, i)
    for ours, theirs in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_a_bfloat16_scatter_without_the_datas_values_starts_from_an_infinity():
    """``amax`` / ``amin`` without the data's values start each reached position from -inf / +inf,
    in bfloat16 too (numpy has no bfloat16 range to read: its import stopped)."""
    import tvm
    import tvm_ffi

    class Extremes(nn.Module):
        def forward(self, x, index, src):
            return (x.scatter_reduce(1, index, src, "amax", include_self=False),
                    x.scatter_reduce(1, index, src, "amin", include_self=False))

    x, src = torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(2, 2, dtype=torch.bfloat16)
    mod = import_exported_program(torch.export.export(Extremes(), (x, torch.tensor([[0, 0], [1, 3]]), src)))
    starts = []

    def constant(node):
        if str(node.ty.dtype) == "bfloat16" and node.value.numpy().size == 1:
            starts.append(float(node.value.numpy().astype("float32")))

    tvm_ffi.structural_walk(mod["main"], [(tvm.ir.expr.GenericConst, constant)])
    assert {float("-inf"), float("inf")} <= set(starts), starts  # besides the counts' zeros


class _Elementwise(nn.Module):
    """Operators TVM 0.27's torch frontend had no converter for: ``fmax`` / ``fmin`` (NaN only
    where both are), ``hypot``, ``cdist`` at p = 2 and p = 1."""

    def forward(self, a, b, rows, cols):
        return (torch.fmax(a, b), torch.fmin(b, a), torch.hypot(a, b), torch.cdist(rows, cols),
                torch.cdist(rows, cols, p=1))


def test_elementwise_operators_the_frontend_lacked_run_as_torch_gives_them(opencl):
    """Each output on PoCL against torch's, NaN where torch has it."""
    from tvm_ext.relax.pipeline import load_model

    nan = float("nan")
    a, b = torch.tensor([[1.0, nan, 3.0], [nan, nan, -1.0]]), torch.tensor([[nan, 2.0, 0.0], [4.0, nan, 5.0]])
    gen = torch.Generator().manual_seed(8)
    rows, cols = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    program = torch.export.export(_Elementwise(), (a, b, rows, cols))
    model = load_model(import_exported_program(program), opencl, None, function="main", log=None)
    outputs = model(a.numpy(), b.numpy(), rows.numpy(), cols.numpy())
    for ours, theirs in zip(outputs, _Elementwise()(a, b, rows, cols), strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-6)  # NaN matches NaN

    class Cube(nn.Module):
        def forward(self, rows, cols):
            return torch.cdist(rows, cols, p=3)

    with pytest.raises(TvmExtError, match=r"cdist with p=3 is not supported"):
        import_exported_program(torch.export.export(Cube(), (rows, cols)))

