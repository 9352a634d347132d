"""Two deliberately wrong rules at different priorities that make the same mistake, loaded with
`--rules tests/wrong_rules_twice.py` by the test that proves bisect keeps going (test_differential):
disabling the first lets the second take the same match, so both must be blamed.

    conv2d -> relu  ==>  conv2d_relu(x, 1.01 * W)      (wrong on purpose, twice: priorities 10000 and 9000)
"""

from tvm_fusion import rule
from tvm_fusion.patterns.conv_epilogue import conv_epilogue


def _wrong(match):
    low = conv_epilogue(bn=False, bias=False, activation="relu").lower(match)
    low.constants[0] = low.constants[0] * 1.01
    return low


def _wrong_spec():
    spec = conv_epilogue(bn=False, bias=False, activation="relu")
    return type(spec)(spec.pattern, spec.annotations, _wrong)


@rule("conv2d_relu_wrong_high", priority=10_000)
def conv2d_relu_wrong_high():
    """conv2d -> relu  ==>  conv2d_relu(x, 1.01 * W)   (wrong on purpose)"""
    return _wrong_spec()


@rule("conv2d_relu_wrong_low", priority=9_000)
def conv2d_relu_wrong_low():
    """conv2d -> relu  ==>  conv2d_relu(x, 1.01 * W)   (wrong on purpose, the same mistake at a lower priority)"""
    return _wrong_spec()
