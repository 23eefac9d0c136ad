"""An ONNX model's static shape arithmetic folded to constants before TVM imports it.

Exporters compute sizes from ``Shape`` at run time even where every shape is static: torch's
exporter writes ``chunk`` / ``tensor_split`` (GPT-NeoX's query, key and value), a padding
(MobileBERT's) and a reshape as ``Shape -> Gather -> Add -> Div -> Mul`` into a ``Slice``'s
ends or a ``Pad``'s pads.  TVM 0.27's ONNX frontend keeps such a chain as tensors, so the
``Slice`` after it has no shape and the import stops ("Reshape expects the input tensor to have
known shape", "Dynamic pads are not supported yet").

``fold_static_shapes`` runs ONNX's shape inference, makes each ``Shape`` of a tensor whose
shape it knows a constant, then evaluates every node whose inputs are all constant and whose
outputs are small integer or boolean tensors (sizes, indices, masks of sizes), or that generate
a window or a mel filter bank (``GENERATORS``), with ONNX's reference evaluator, one node at a
time, and writes the results as constants.  Floating-point
nodes are left to TVM (its folding keeps the model's own arithmetic); a symbolic dimension
stays symbolic.
"""
from __future__ import annotations

from typing import Any

import numpy as np

MAX_FOLDED_ELEMENTS = 4096  # a folded output larger than this stays a node (shape data is small)
# operators that make a constant of their constant inputs, float or not (a window, a mel filter
# bank): TVM's frontend has no converter for them, and ``STFT`` takes its window as a constant
GENERATORS = {"HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"}
MAX_GENERATED_ELEMENTS = 1 << 22
_NO_FOLD = {"If", "Loop", "Scan", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
            "Multinomial", "Bernoulli"}  # control flow and random draws are never constants


def _static_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Every value's shape that shape inference fixes to integers (graph inputs included)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - a model inference cannot type: nothing to fold from shapes
        return {}
    shapes = {}
    graph = inferred.graph
    for info in list(graph.value_info) + list(graph.input) + list(graph.output):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = tuple(d.dim_value for d in dims)
    return shapes


def _shape_value(node: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``Shape``'s output for a known shape, its ``start`` / ``end`` attributes applied."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)


def _evaluate(node: Any, inputs: list[np.ndarray | None], opset: Any) -> list[np.ndarray] | None:
    """One node on constant inputs through ONNX's reference evaluator; None where it cannot."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Tile" and len(inputs) > 1 and inputs[1] is not None and inputs[1].ndim > 1:
        inputs = [inputs[0], inputs[1].reshape(-1)]  # repeats as torch writes Mamba2's, (1, 1): read flat
    names = [f"i{k}" if value is not None else "" for k, value in enumerate(inputs)]
    one = helper.make_node(node.op_type, names, [f"o{k}" for k in range(len(node.output))], domain=node.domain,
                           **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    graph = helper.make_graph([one], "fold", [], [helper.make_empty_tensor_value_info(f"o{k}")
                                                  for k in range(len(node.output))],
                              [numpy_helper.from_array(v, n) for n, v in zip(names, inputs) if v is not None])
    try:
        return list(ReferenceEvaluator(helper.make_model(graph, opset_imports=opset)).run(None, {}))
    except Exception:  # noqa: BLE001 - an operator the evaluator lacks: the node stays for TVM
        return None


def _small_non_float(values: list[np.ndarray]) -> bool:
    return all(isinstance(v, np.ndarray) and v.dtype.kind in "biu" and v.size <= MAX_FOLDED_ELEMENTS for v in values)


def fold_static_shapes(model: Any) -> Any:
    """A copy of ``model`` with its static shape arithmetic as ``Constant`` nodes (see the module
    docstring); the model itself is unchanged.  Nodes only a folded node read are dropped."""
    import onnx
    from onnx import helper, numpy_helper

    shapes = _static_shapes(model)
    known: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
                                    if i.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)}
    nodes = []
    for node in model.graph.node:
        values: list[np.ndarray] | None = None
        if node.op_type == "Constant" and not node.domain:  # kept as it is, its value known
            if node.attribute[0].name == "value":
                known[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Shape" and node.input[0] in shapes:
            values = [_shape_value(node, shapes[node.input[0]])]
        elif node.op_type not in _NO_FOLD and not node.domain and node.input and \
                all(not name or name in known for name in node.input):
            values = _evaluate(node, [known[name] if name else None for name in node.input], model.opset_import)
        generated = node.op_type in GENERATORS and values is not None and \
            all(isinstance(v, np.ndarray) and v.size <= MAX_GENERATED_ELEMENTS for v in values)
        if values is None or not (_small_non_float(values) or generated):
            nodes.append(node)
            continue
        known.update(zip(node.output, values))
        nodes.extend(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.asarray(v), out))
                     for out, v in zip(node.output, values))
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    del folded.graph.node[:]
    folded.graph.node.extend(_live(nodes, {o.name for o in model.graph.output}))
    return folded


def _read_by(node: Any) -> set[str]:
    """The names a node reads: its inputs and, for control flow, what its subgraphs read."""
    from onnx import AttributeProto

    names = {name for name in node.input if name}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names |= _read_by(inner)
    return names


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """``nodes`` without those no graph output depends on (in order)."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed |= _read_by(node)
    return kept[::-1]
