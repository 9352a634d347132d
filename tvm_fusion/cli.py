"""`tvm-fusion`: compile / compare / explain / rules, from the command line.

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
    p.add_argument("--target", default=target, choices=["llvm", "cuda"], help=f"build target (default: {target})")
    p.add_argument("--arch", default="sm_90", help="CUDA arch for --target cuda (default: sm_90)")
    p.add_argument("--rules", action="append", default=[], metavar="FILE.py", help="load extra rules from a file")
    p.add_argument("--only", default="", metavar="RULE,...", help="use only these rules")
    p.add_argument("--disable", action="append", default=[], metavar="RULE", help="disable a rule (repeatable)")
    p.add_argument("--no-simplify", action="store_true",
                   help="import the exporter's graph as written (skip the ONNX simplifier before TVM's importer)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="fuse and build a model into a loadable library + JSON manifest")
    _common(c, target="cuda")
    c.add_argument("-o", "--output", required=True, help="library path to write (e.g. model.so)")
    c.add_argument("--no-counts", action="store_true", help="skip counting the unfused/tvm builds' kernels")
    c.add_argument("--no-verify", action="store_true",
                   help="write the library without first checking the fused build against onnxruntime")
    m = sub.add_parser("compare", help="build unfused / tvm / fused, run them and onnxruntime, report")
    _common(m)
    m.add_argument("--repeat", type=int, default=10, help="timed runs per build (interleaved)")
    m.add_argument("--modes", default="unfused,tvm,fused", help="builds to make (comma separated)")
    m.add_argument("--per-group", action="store_true",
                   help="check each fused group against its unfused subgraph on the real intermediate values, "
                        "and name the first group over tolerance")
    m.add_argument("--bisect", action="store_true",
                   help="--per-group, then disable the rules to blame, rebuild, and report which rule broke what")
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
    rules = _rules(args)
    model, shapes = _model(args), _shapes(args)
    if args.command == "explain":
        from .explain import explain

        print(explain(model, args.target, shapes=shapes, rules=rules))
        return 0
    if args.command == "compile":
        from .compile import compile_model

        result = compile_model(model, args.output, args.target, arch=args.arch, shapes=shapes, rules=rules,
                               counts_of_other_builds=not args.no_counts, verify=not args.no_verify,
                               seed=args.seed)
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
    from .simplify import enabled

    args = _parser().parse_args(argv)
    try:
        with enabled(not getattr(args, "no_simplify", False)):
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
