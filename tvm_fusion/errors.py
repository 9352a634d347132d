"""User-facing errors: one line naming the file, node or op, and the remedy."""


class FusionError(Exception):
    """An error the user can act on. The CLI prints `error: <message>` and exits 2."""


class ToleranceExceeded(FusionError):
    """A fused build disagreed with its reference beyond the dtype tolerance."""


class LoweringError(FusionError):
    """An internal error: a rule's lowering does not compute the type (shape, dtype) of the match it replaces."""
