"""What TVM writes onto the terminal around a call: C++ `LOG(WARNING)` lines on file descriptor 2 and Python
`print`s on stdout, captured for the call and re-emitted on stderr unless they are known noise.

    with tvm_output(drop=SCOPE_LINES):          # runtime.load, export: the VM's per-function warnings
        module = tvm.runtime.load_module(path)

Standard library only: the runtime (no compiler) imports it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile

__all__ = ["FAST_TAKE_LINES", "SCOPE_LINES", "IMPORTER_LINES", "tvm_output"]

#: TVM 0.27's VM executable logs a warning per function on every save and load (src/runtime/vm/executable.cc)
SCOPE_LINES = re.compile(r"executable\.cc:\d+: Warning: Scope (Loaded|Saving):")

#: TOPI's take logs a warning each time a Gather is legalized in its "fast" mode (the mode TVM's ONNX importer
#: asks for: its indices are normalized into range first); one line per Gather of the model on every build
FAST_TAKE_LINES = re.compile(r"transform\.h:\d+: Warning: Fast mode segfaults when there are out-of-bounds indices")
#: what TVM's ONNX importer leaves behind on fd 2 when a converter raises (the error is in the exception), and
#: its Gathers' take warnings
IMPORTER_LINES = re.compile(r"block_builder\.cc:\d+: Warning: BlockBuilder destroyed with remaining blocks!|"
                            + FAST_TAKE_LINES.pattern)


@contextlib.contextmanager
def tvm_output(drop: re.Pattern, stdout: bool = False):
    """Capture fd 2 during the block; afterwards write every captured line that `drop` does not match onto
    stderr, so real errors still reach the user. `stdout`: also discard Python's prints to sys.stdout (TVM's
    ONNX importer prints a failing converter's inputs, then raises). Where fd 2 cannot be duplicated
    (closed), the block runs uncaptured."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    printed = io.StringIO()
    with tempfile.TemporaryFile() as log:
        _flush()
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed) if stdout else contextlib.nullcontext():
                yield
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            text = log.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not drop.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
