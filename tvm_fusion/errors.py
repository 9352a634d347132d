"""Errors: one line naming the file, node or op, and the remedy (FusionError, exit 2; ToleranceExceeded,
exit 1), or saying that tvm_fusion itself is wrong (InternalError, exit 3)."""


class FusionError(Exception):
    """An error the user can act on. The CLI prints `error: <message>` and exits 2."""


class ToleranceExceeded(FusionError):
    """A fused build disagreed with its reference beyond the dtype tolerance."""


class InternalError(Exception):
    """Our bug, not the user's input: the CLI prints one line and exits 3 (the traceback with --debug)."""


class LoweringError(InternalError):
    """An internal error: a rule's lowering does not compute the type (shape, dtype) of the match it replaces."""


class FusionMismatch(InternalError):
    """The fused build disagrees with the unfused build of the same module (an output element beyond the
    dtype tolerance, or one build failing where the other ran): a bug in a rule, its compute or schedule."""
