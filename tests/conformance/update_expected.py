"""Regenerate expected_failures.py from a JUnit XML of the suite (the Fused half is the reference):

    .venv/bin/python -m pytest tests/conformance -m conformance --junitxml=/tmp/conformance.xml
    .venv/bin/python tests/conformance/update_expected.py /tmp/conformance.xml

It refuses to write when a test failed with a FusionMismatch (the fused build disagreed with the unfused
one, which every run checks): that is a bug in our rules or schedules, never an expected failure.
The Simplified half (fused, through the ONNX simplifier) gives SIMPLIFIER_FIXES (fail as written, pass
there) and SIMPLIFIER_BREAKS (pass as written, fail there, by reason); without it in the XML the lists
are kept. Each test is written once: the expected failures are split into FAIL_WITH_SIMPLIFIER and
FIXED_BY_SIMPLIFIER, from which the file derives EXPECTED_FAILURES and SIMPLIFIER_FIXES.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

#: (reason shown in docs/testing.md, regex on the failure message), first match wins
REASONS = [
    ("op not supported by TVM's ONNX importer", r"which TVM's ONNX importer does not support"),
    ("a Loop whose trip count is a graph input (TVM imports no Loop; one with a constant trip count is unrolled)",
     r"Loop node .* runs a number of iterations computed at run time"),
    ("TVM's ONNX importer raises on the model", r"TVM's ONNX importer failed"),
    ("results differ from the ONNX reference (TVM's op implementation)", r"^AssertionError"),
    ("TVM fails to build or run the imported module", r"^tvm\.error\.|TVM's FoldConstant failed"),
    ("inputs or outputs TVM's VM does not take (sequences, optionals, strings, ...)",
     (r"setting an array element with a sequence|object has no attribute|not supported|TypeError"
      r"|does not fit the model's declared shape \[\]|unknown dtype `object`")),  # an optional or sequence input
    ("other error inside TVM", r""),
]

#: the line of expected_failures.py after which it derives EXPECTED_FAILURES and SIMPLIFIER_FIXES (kept as is)
DERIVED = "# ---- derived from the tables above"


def outcomes(xml_path: str) -> dict[str, dict[str, tuple[str, str]]]:
    out: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        classname = case.get("classname")
        mode = "Simplified" if classname.endswith("Simplified") else "Fused"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            out[case.get("name")][mode] = ("fail", (failure.get("message") or "").strip())
        elif case.find("skipped") is not None:
            skipped = case.find("skipped")
            status = "xfail" if skipped.get("type") == "pytest.xfail" else "skip"
            out[case.get("name")][mode] = (status, skipped.get("message") or "")
        else:
            out[case.get("name")][mode] = ("pass", "")
    return out


def failed(status: str, message: str) -> bool:
    """Did the test itself fail? (an expected failure did; an unexpected success of one did not)"""
    if status == "fail":
        return "Unexpected success" not in message
    return status == "xfail" or (status == "skip" and "expected failure" in message)


def _reason(message: str) -> str:
    return next(label for label, pattern in REASONS if re.search(pattern, message))


def fused_failures(results: dict, known: dict[str, list[str]]) -> dict[str, list[str]] | None:
    """EXPECTED_FAILURES from the Fused half, by reason; None when the XML does not have it.
    A test that failed as expected (xfail) keeps its reason in `known`."""
    reason_of = {n: reason for reason, names in known.items() for n in names}
    grouped: dict[str, list[str]] = defaultdict(list)
    runs = {n: r["Fused"] for n, r in sorted(results.items()) if "Fused" in r}
    if not runs:
        return None
    for name, (status, message) in runs.items():
        short = name.removesuffix("_cpu")
        if status == "xfail" and short in reason_of:
            grouped[reason_of[short]].append(short)
        elif status == "fail" or "expected failure" in message:
            grouped[_reason(message)].append(short)
    return {label: grouped[label] for label, _ in REASONS if grouped.get(label)}


def simplifier_lists(results: dict, expected: set[str]) -> tuple[list[str], dict[str, list[str]]] | None:
    """(fixes, breaks by reason) of the Simplified half against the Fused one (or, when the XML has only
    the Simplified half, against `expected`, the current expected failures); None without it."""
    fixes, breaks = [], defaultdict(list)
    simplified = {n: r for n, r in sorted(results.items()) if "Simplified" in r}
    if not simplified:
        return None
    for name, r in simplified.items():
        short = name.removesuffix("_cpu")
        before = failed(*r["Fused"]) if "Fused" in r else short in expected
        after = failed(*r["Simplified"])
        if before and not after:
            fixes.append(short)
        elif after and not before:
            breaks[_reason(r["Simplified"][1])].append(short)
    return fixes, dict(breaks)


def _lines(name: str, comment: str, value) -> list[str]:
    out = [f"#: {comment}", f"{name}: dict[str, list[str]] = {{"]
    for reason, names in value.items():
        out += [f"    {reason!r}: [", *[f"        {n!r}," for n in names], "    ],"]
    return out + ["}"]


def split_fixed(expected: dict[str, list[str]], fixes: list[str]) -> tuple[dict, dict]:
    """EXPECTED_FAILURES by reason split in two: (also failing through the simplifier, fixed by it), so that
    each test is written once."""
    listed = {n for names in expected.values() for n in names}
    if not set(fixes) <= listed:
        raise SystemExit(f"simplifier fixes that are not expected failures: {sorted(set(fixes) - listed)}")
    fixed = set(fixes)
    still = {r: [n for n in names if n not in fixed] for r, names in expected.items()}
    moved = {r: [n for n in names if n in fixed] for r, names in expected.items()}
    return {r: v for r, v in still.items() if v}, {r: v for r, v in moved.items() if v}


def render(text: str, expected: dict[str, list[str]], fixes: list[str], breaks: dict[str, list[str]]) -> str:
    """expected_failures.py with these tables; its docstring and what follows DERIVED are kept from `text`."""
    doc = text.split(chr(34) * 3)[1]
    tail = text[text.index(DERIVED):]
    still, fixed = split_fixed(expected, fixes)
    lines = [f'"""{doc}"""', "",
             *_lines("FAIL_WITH_SIMPLIFIER", "by reason, from the Fused half: tests that fail as the exporter "
                     "wrote them and also through the ONNX simplifier", still),
             "", *_lines("FIXED_BY_SIMPLIFIER", "by reason, from the Fused half: tests that fail as written but "
                         "pass through the ONNX simplifier (SimplifiedBackend)", fixed),
             "", *_lines("SIMPLIFIER_BREAKS", "tests that pass as written but fail through the ONNX simplifier, "
                         "by reason", breaks), "", ""]
    return "\n".join(lines) + tail


def main(xml_path: str) -> None:
    import expected_failures as current

    results = outcomes(xml_path)
    differ = sorted({n for n, r in results.items() for status, message in r.values()
                     if status == "fail" and "FusionMismatch" in message})
    if differ:
        raise SystemExit(f"fused and unfused differ on {differ}: fix the rule or schedule, do not list it")
    expected = fused_failures(results, current.EXPECTED_FAILURES) or current.EXPECTED_FAILURES
    fixes, breaks = (simplifier_lists(results, {n for names in expected.values() for n in names})
                     or (current.SIMPLIFIER_FIXES, current.SIMPLIFIER_BREAKS))
    path = Path(__file__).with_name("expected_failures.py")
    path.write_text(render(path.read_text(), expected, fixes, breaks))
    print({k: len(v) for k, v in expected.items()}, "simplifier fixes", len(fixes),
          "breaks", {k: len(v) for k, v in breaks.items()})


if __name__ == "__main__":
    main(sys.argv[1])
