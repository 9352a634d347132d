"""`tvm-fusion`: compile / compare / profile / explain / rules, from the command line.

Every error the user can act on is one line `error: ...` and exit status 2; a compare whose fused build
exceeds its dtype tolerance prints the table and exits 1.
"""

from __future__ import annotations

import argparse
import sys

from .errors import FusionError, ToleranceExceeded

__all__ = ["main"]


def _common(p: argparse.ArgumentParser, target: str = "llvm") -> None:
    p.add_argument("model", nargs="?", help="path of the ONNX model (or use --example)")
    from .examples import EXAMPLES

    p.add_argument("--example", choices=EXAMPLES, help="use a model made on the fly (seeded random weights)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example's weights and of the inputs")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="bind an input's shape (repeatable); required for symbolic dims")
    p.add_argument("--target", default=target,
                   help=f"build target (default: {target}): llvm (this CPU, or TVM_FUSION_CPU), cuda, a JSON dict "
                        "such as '{\"kind\":\"llvm\",\"mcpu\":\"x86-64-v3\"}', a TVM target kind or a tag")
    p.add_argument("--arch", default="sm_90", help="CUDA arch for --target cuda (default: sm_90)")
    p.add_argument("--rules", action="append", default=[], metavar="FILE.py", help="load extra rules from a file")
    p.add_argument("--only", default="", metavar="RULE,...", help="use only these rules")
    p.add_argument("--disable", action="append", default=[], metavar="RULE", help="disable a rule (repeatable)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="fuse and build a model into a loadable library + JSON manifest")
    _common(c, target="cuda")
    c.add_argument("-o", "--output", required=True, help="library path to write (e.g. model.so)")
    c.add_argument("--no-counts", action="store_true", help="skip counting the unfused/tvm builds' kernels")
    c.add_argument("--no-verify", action="store_true",
                   help="write the library without first checking the fused build against onnxruntime")
    c.add_argument("--external-weights", action="store_true",
                   help="write the weights to <output>.weights instead of into the library")
    bnd = sub.add_parser("bundle", help="copy a compiled library, its weights and the TVM runtime alone (no "
                         "compiler) into a folder that runs with plain Python: python DIR/run.py")
    bnd.add_argument("library", help="a library written by tvm-fusion compile (with its .json manifest)")
    bnd.add_argument("-o", "--output", required=True, help="folder to write")
    bnd.add_argument("--python", default=None, help="Python version of the target machine (default: this one's)")
    m = sub.add_parser("compare", help="build unfused / tvm / fused, run them and onnxruntime, report")
    _common(m)
    m.add_argument("--repeat", type=int, default=10, help="timed runs per build (interleaved)")
    m.add_argument("--modes", default="unfused,tvm,fused", help="builds to make (comma separated)")
    m.add_argument("--per-group", action="store_true",
                   help="check each fused group against its unfused subgraph on the real intermediate values, "
                        "and name the first group over tolerance")
    m.add_argument("--bisect", action="store_true",
                   help="--per-group, then disable the rules to blame, rebuild, and report which rule broke what")
    pr = sub.add_parser("profile", help="time every kernel unfused and fused; memory traffic, roofline, "
                                        "what to fuse next; --html report")
    _common(pr)
    pr.add_argument("--modes", default="unfused,fused", help="builds to profile (unfused and fused needed; tvm optional)")
    pr.add_argument("--repeat", type=int, default=5, help="timed inferences per build (medians)")
    pr.add_argument("--json", metavar="OUT.json", help="write the profile's data as JSON")
    pr.add_argument("--html", metavar="REPORT.html", help="write a self-contained HTML report")
    e = sub.add_parser("explain", help="which rule took each chain, why others declined, what is left to TVM")
    _common(e)
    r = sub.add_parser("rules", help="list the rules in priority order")
    r.add_argument("--rules", action="append", default=[], metavar="FILE.py")
    r.add_argument("--only", default="")
    r.add_argument("--disable", action="append", default=[])
    return parser


def _rules(args):
    from .loader import load_rules_for

    disable = [n for d in args.disable for n in d.split(",") if n]
    return load_rules_for(args.rules, only=[n for n in args.only.split(",") if n], disable=disable)


def _model(args):
    if args.example and args.model:
        raise FusionError("give either a model path or --example, not both")
    if args.example:
        from .examples import example_path

        return str(example_path(args.example, args.seed))
    if not args.model:
        raise FusionError("no model given: pass a path to an .onnx file, or --example resnet50")
    return args.model


def _shapes(args) -> dict:
    from .frontend import parse_shape

    return dict(parse_shape(s) for s in args.shape)


def _run(args) -> int:
    if args.command == "rules":
        for r in _rules(args):
            print(f"{r.priority:5d}  {r.name:24s} {','.join(r.targets):10s} {r.doc}")
        return 0
    if args.command == "bundle":
        from .bundle import bundle

        print(bundle(args.library, args.output, args.python))
        return 0
    from .build import resolve_target

    resolve_target(args.target, args.arch)  # a bad --target fails here, before any work
    rules = _rules(args)
    model, shapes = _model(args), _shapes(args)
    if args.command == "explain":
        from .explain import explain

        print(explain(model, args.target, shapes=shapes, rules=rules))
        return 0
    if args.command == "profile":
        return _profile(args, model, shapes, rules)
    if args.command == "compile":
        from .compile import compile_model

        result = compile_model(model, args.output, args.target, arch=args.arch, shapes=shapes, rules=rules,
                               counts_of_other_builds=not args.no_counts, verify=not args.no_verify,
                               seed=args.seed, external_weights=args.external_weights)
        print(result)
        return 0
    if args.per_group or args.bisect:
        return _differential(args, model, shapes, rules)
    from .compare import compare

    modes = [m for m in args.modes.split(",") if m]
    report = compare(model, args.target, shapes=shapes, rules=rules, repeat=args.repeat, seed=args.seed,
                     arch=args.arch, modes=modes)
    print(report)
    if report.executed and not report.ok:
        raise ToleranceExceeded("fused build exceeds the tolerance: " + "; ".join(report.failures()))
    return 0


def _profile(args, model, shapes, rules) -> int:
    from .profile import profile

    report = profile(model, args.target, shapes=shapes, rules=rules, modes=[m for m in args.modes.split(",") if m],
                     repeat=args.repeat, seed=args.seed, arch=args.arch)
    print(report)
    for path, write in ((args.json, report.write_json), (args.html, report.write_html)):
        if path:
            write(path)
            print(f"wrote {path}")
    return 0


def _differential(args, model, shapes, rules) -> int:
    from .differential import bisect, check_groups

    kw = {"shapes": shapes, "rules": rules, "seed": args.seed, "arch": args.arch}
    if args.bisect:
        report = bisect(model, args.target, **kw)
        print(report)
        if not report.first.ok:
            raise ToleranceExceeded(report.first.first_failure() + "; " + report.verdict)
        return 0
    report = check_groups(model, args.target, **kw)
    print(report)
    if not report.ok:
        raise ToleranceExceeded(report.first_failure() + "; run with --bisect to find the rule to blame")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ToleranceExceeded as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except FusionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
