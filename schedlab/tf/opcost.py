"""TensorFlow kernels: which torch op class each corresponds to, and its work (FLOPs, bytes).

One Profile format serves both frameworks: a TF node's class is the aten op class it
computes (MatMul -> mm, Conv2D -> convolution), where one corresponds; otherwise it stays
"tf.<Type>". oneDNN rewrites (`_Mkl*`, `_MklNative*`) and Grappler fusions (`_Fused*`)
map to the class of the op they compute. FLOPs follow the same conventions as
`schedlab.flops` (2 per multiply-add for matmuls and convolutions, one per output element
otherwise); bytes moved are the bytes read plus written, and views move nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.graph import TensorMeta

_CLASS = {
    "MatMul": "mm",
    "FusedMatMul": "addmm",
    "NativeFusedMatMul": "addmm",
    "BatchMatMul": "bmm",
    "BatchMatMulV2": "bmm",
    "BatchMatMulV3": "bmm",
    "Conv2D": "convolution",
    "FusedConv2D": "convolution",
    "NativeConv2D": "convolution",
    "NativeFusedConv2D": "convolution",
    "Conv2DBackpropInput": "convolution_backward",
    "Conv2DBackpropFilter": "convolution_backward",
    "NativeConv2DBackpropInput": "convolution_backward",
    "NativeConv2DBackpropFilter": "convolution_backward",
    "FusedBatchNormV3": "native_batch_norm",
    "FusedBatchNormGradV3": "native_batch_norm_backward",
    "Relu": "relu",
    "ReluGrad": "threshold_backward",
    "Tanh": "tanh",
    "TanhGrad": "tanh_backward",
    "Sigmoid": "sigmoid",
    "SigmoidGrad": "sigmoid_backward",
    "Softmax": "_softmax",
    "Erf": "erf",
    "Exp": "exp",
    "Rsqrt": "rsqrt",
    "Sqrt": "sqrt",
    "Add": "add",
    "AddV2": "add",
    "AddN": "add",
    "BiasAdd": "add",
    "Sub": "sub",
    "Mul": "mul",
    "RealDiv": "div",
    "Neg": "neg",
    "Square": "pow",
    "SquaredDifference": "sub",
    "Sum": "sum",
    "Mean": "mean",
    "Max": "amax",
    "BiasAddGrad": "sum",
    "GatherV2": "embedding",
    "ResourceGather": "embedding",
    "UnsortedSegmentSum": "embedding_dense_backward",
    "ConcatV2": "cat",
    "Pack": "stack",
    "Split": "split",
    "SplitV": "split",
    "Slice": "slice",
    "StridedSlice": "slice",
    "StridedSliceGrad": "slice_backward",
    "Transpose": "clone",  # TF transposes copy; torch's are views followed by a copy
    "Tile": "expand",
    "Fill": "full",
    "ZerosLike": "zeros_like",
    "OnesLike": "ones_like",
    "Cast": "_to_copy",
    "SparseSoftmaxCrossEntropyWithLogits": "nll_loss_forward",
    "ResourceApplyGradientDescent": "add",  # param.add_(grad, alpha=-lr)
}
_VIEWS = {"Reshape", "Identity", "ReadVariableOp", "ExpandDims", "Squeeze", "Snapshot", "StopGradient"}
_MATMULS = {"MatMul", "FusedMatMul", "NativeFusedMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}
_CONVS = {"Conv2D", "FusedConv2D", "NativeConv2D", "NativeFusedConv2D"}
_CONV_GRADS = {"Conv2DBackpropInput", "Conv2DBackpropFilter", "NativeConv2DBackpropInput", "NativeConv2DBackpropFilter"}


def base_type(op_type: str) -> str:
    """"_MklNativeFusedMatMul" -> "NativeFusedMatMul"; "_FusedConv2D" -> "FusedConv2D"."""
    return op_type.removeprefix("_").removeprefix("Mkl")


def tf_op_class(op_type: str) -> str:
    """The aten class a TF kernel computes, or "tf.<Type>" where none corresponds."""
    return _CLASS.get(base_type(op_type), f"tf.{op_type}")


def is_view(op_type: str) -> bool:
    return base_type(op_type) in _VIEWS


def _numel(m: TensorMeta | None) -> int:
    if m is None:
        return 0
    n = 1
    for s in m.shape:
        n *= s
    return n


def tf_op_work(
    op_type: str,
    in_metas: Sequence[TensorMeta | None],
    out_metas: Sequence[TensorMeta | None],
    attrs: dict[str, object],
) -> tuple[float, int]:
    """(FLOPs, bytes moved) of one TF node from its tensors' shapes and its attributes."""
    base = base_type(op_type)
    if base in _VIEWS:
        return 0.0, 0
    nbytes = sum(m.nbytes for m in in_metas if m is not None) + sum(m.nbytes for m in out_metas if m is not None)
    out = out_metas[0] if out_metas else None
    a = in_metas[0] if in_metas else None
    if base in _MATMULS and out is not None and a is not None and len(a.shape) >= 2:
        adj = bool(attrs.get("transpose_a") or attrs.get("adj_x"))
        k = a.shape[-2] if adj else a.shape[-1]
        return 2.0 * _numel(out) * k, nbytes
    if base in _CONVS and out is not None and len(in_metas) > 1 and in_metas[1] is not None:
        kh, kw, cin, _ = in_metas[1].shape  # HWIO filter
        return 2.0 * _numel(out) * kh * kw * cin, nbytes
    if base in _CONV_GRADS and out is not None:
        # Both gradients cost what the forward convolution does: 2 x the output-gradient
        # elements x the filter's kh * kw * cin.
        grad_out = in_metas[2] if len(in_metas) > 2 else None
        filt = out if base.endswith("Filter") else (in_metas[1] if len(in_metas) > 1 else None)
        if grad_out is not None and filt is not None and len(filt.shape) == 4:
            kh, kw, cin, _ = filt.shape
            return 2.0 * _numel(grad_out) * kh * kw * cin, nbytes
    return float(sum(_numel(m) for m in out_metas)), nbytes
