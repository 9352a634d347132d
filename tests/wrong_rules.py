"""A deliberately wrong rule, loaded with `--rules tests/wrong_rules.py` by the tests that prove a wrong
fusion fails loudly (test_cli) and is found and blamed (test_differential).

    conv2d -> relu  ==>  conv2d_relu(x, 1.01 * W)      (wrong on purpose: the weights are scaled by 1.01)
"""

from tvm_fusion import rule
from tvm_fusion.patterns.conv_epilogue import conv_epilogue


def _wrong(match):
    low = conv_epilogue(bn=False, bias=False, activation="relu").lower(match)
    low.constants[0] = low.constants[0] * 1.01
    return low


@rule("conv2d_relu_wrong", priority=10_000)
def conv2d_relu_wrong():
    """conv2d -> relu  ==>  conv2d_relu(x, 1.01 * W)   (wrong on purpose)"""
    spec = conv_epilogue(bn=False, bias=False, activation="relu")
    return type(spec)(spec.pattern, spec.annotations, _wrong)
