"""What the commands print on a terminal: plain-text tables and progress bars."""

from __future__ import annotations

__all__ = ["progress", "status", "table"]


def table(header: list, rows: list[list]) -> str:
    """Columns padded to their widest cell, a dashed line under the header, no trailing spaces."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


class progress:
    """A progress bar on a terminal (tqdm; silent elsewhere, and without tqdm), over items or named steps:

        for mode in progress(modes, "building"): ...      # iterate: one tick per item
        with progress(["import", "build"]) as bar:         # named steps: the bar shows the current step
            ...; bar.update()
    """

    def __init__(self, items, desc: str | None = None):
        self.items, self.named = list(items), desc is None
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover
            self.bar = None
            return
        first = self.items[0] if self.named and self.items else desc
        self.bar = tqdm(total=len(self.items), desc=first, leave=False, disable=None)  # None: only on a terminal

    def __iter__(self):
        try:
            for item in self.items:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self):
        return self

    def update(self) -> None:
        if self.bar is None:
            return
        self.bar.update()
        if self.named and self.bar.n < len(self.items):
            self.bar.set_description(self.items[self.bar.n])

    def describe(self, text: str) -> None:
        """Show `text` as the bar's description (e.g. the item being worked on)."""
        if self.bar is not None:
            self.bar.set_description(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __exit__(self, *exc) -> None:
        self.close()


class status:
    """One line on a terminal (tqdm on stderr; silent elsewhere, and without tqdm) saying which step of an
    open-ended search runs and for how long, against its time bound when it has one:

        with status("culprit search", limit=120) as line:
            line.step("per-group check"); ...
            line.step("disable conv2d_bn_relu"); ...
    """

    def __init__(self, what: str, limit: float | None = None):
        self.what, self.n = what, 0
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover
            self.bar = None
            return
        bound = f" of {limit:g}s" if limit else ""
        self.bar = tqdm(total=None, desc=what, bar_format="{desc} [{elapsed}" + bound + "]", leave=False,
                        disable=None)  # None: only on a terminal

    def step(self, text: str) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.set_description(f"{self.what}: step {self.n}: {text}")
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
