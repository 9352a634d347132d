"""Regenerate expected_failures.py from a JUnit XML of the suite (the Unfused half is the reference):

    .venv/bin/python -m pytest tests/conformance --junitxml=/tmp/conformance.xml
    .venv/bin/python tests/conformance/update_expected.py /tmp/conformance.xml

It refuses to write when a test fails fused but not unfused: that is a bug in our rules or schedules.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

#: (reason shown in the README, regex on the failure message), first match wins
REASONS = [
    ("op not supported by TVM's ONNX importer", r"which TVM's ONNX importer does not support"),
    ("TVM's ONNX importer raises on the model", r"TVM's ONNX importer failed"),
    ("results differ from the ONNX reference (TVM's op implementation)", r"^AssertionError"),
    ("TVM fails to build or run the imported module", r"^tvm\.error\."),
    ("inputs or outputs TVM's VM does not take (sequences, optionals, strings, ...)",
     r"setting an array element with a sequence|object has no attribute|not supported|TypeError"),
    ("other error inside TVM", r""),
]


def outcomes(xml_path: str) -> dict[str, dict[str, tuple[str, str]]]:
    out: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        mode = "Unfused" if case.get("classname").endswith("Unfused") else "Fused"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            out[case.get("name")][mode] = ("fail", (failure.get("message") or "").strip())
        elif case.find("skipped") is not None:
            out[case.get("name")][mode] = ("skip", case.find("skipped").get("message") or "")
        else:
            out[case.get("name")][mode] = ("pass", "")
    return out


def main(xml_path: str) -> None:
    results = outcomes(xml_path)
    differ = [n for n, r in results.items() if r.get("Fused", ("?",))[0] != r.get("Unfused", ("?",))[0]
              and "xpass" not in str(r)]
    if differ:
        raise SystemExit(f"fused and unfused differ on {differ}: fix the rule or schedule, do not list it")
    grouped: dict[str, list[str]] = defaultdict(list)
    for name, r in sorted(results.items()):
        status, message = r.get("Unfused", r.get("Fused"))
        if status != "fail" and "expected failure" not in message:
            continue
        reason = next(label for label, pattern in REASONS if re.search(pattern, message))
        grouped[reason].append(name.removesuffix("_cpu"))
    lines = [f'"""{Path(__file__).with_name("expected_failures.py").read_text().split(chr(34) * 3)[1]}"""', "",
             "EXPECTED_FAILURES: dict[str, list[str]] = {"]
    for reason, _ in REASONS:
        if grouped.get(reason):
            lines.append(f"    {reason!r}: [")
            lines += [f"        {n!r}," for n in grouped[reason]]
            lines.append("    ],")
    lines.append("}")
    Path(__file__).with_name("expected_failures.py").write_text("\n".join(lines) + "\n")
    print({k: len(v) for k, v in grouped.items()})


if __name__ == "__main__":
    main(sys.argv[1])
