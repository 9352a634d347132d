"""The first stage: an ONNX model in, a Relax module out.

`importer` loads, checks and sanitizes the model, binds the input shapes and imports it (`import_onnx`);
`simplify` is the ONNX simplifier at the front door; `recurrent` and `loop` rewrite LSTM / GRU / RNN and
Loop nodes into what TVM's importer takes (`recurrent_kernel` is the TIR kernel of a recurrence).
"""

from tvm_fusion.frontend.importer import (UPPER_BOUND_ATTR, SymDim, check_sizes, concrete_shapes, format_shape,
                                          import_onnx, load_onnx, onnx_node_names, parse_shape, sizes_text,
                                          symbolic_dims)

__all__ = ["SymDim", "import_onnx", "load_onnx", "parse_shape", "onnx_node_names", "concrete_shapes",
           "check_sizes", "sizes_text", "symbolic_dims", "format_shape", "UPPER_BOUND_ATTR"]
