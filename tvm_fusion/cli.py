"""`tvm-fusion`: compile / compare / profile / explain / rules, from the command line.

Exit status: 0 ok; 1 a comparison exceeds its dtype tolerance (the table is printed, the first failure is
the `error:` line; compile: fusion changed the result, or --strict and the unfused build differs from
onnxruntime too, which is otherwise a `warning:` line and exit 0); 2 bad input (one line `error: ...` naming the file, flag or node and the remedy);
3 an internal error (one line naming where; `--debug` prints the traceback).
"""

from __future__ import annotations

import argparse
import shlex
import re
import sys
import traceback

from .errors import FusionError, ToleranceExceeded
from tvm_fusion.examples import EXAMPLES, cache_dir, example_path

__all__ = ["main"]

# Each command imports its stage when it runs (the imports inside the functions below): `tvm-fusion --help` and
# a bad argument answer without loading TVM, and a test's patch of a stage function reaches the command.

def _common(p: argparse.ArgumentParser, target: str = "llvm") -> None:
    p.add_argument("model", nargs="?", help="path of the ONNX model (or use --example)")
    p.add_argument("--example", choices=EXAMPLES, help="use a model made on the fly (seeded random weights)")
    p.add_argument("--seed", type=int, default=0, help="seed (>= 0) of the example's weights and of the inputs")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="bind an input's shape (repeatable); required for symbolic dims. A letter keeps a dim "
                        "symbolic (the batch: NAME=Nx3x224x224, or N<=64 with an upper bound)")
    p.add_argument("--target", default=target,
                   help=f"build target (default: {target}): llvm (this CPU, or TVM_FUSION_CPU), cuda, a JSON dict "
                        "such as '{\"kind\":\"llvm\",\"mcpu\":\"x86-64-v3\"}', a TVM target kind or a tag")
    p.add_argument("--arch", default="sm_90", help="CUDA arch for --target cuda (default: sm_90)")
    _rule_selection(p)
    p.add_argument("--no-simplify", action="store_true",
                   help="import the exporter's graph as written (skip the ONNX simplifier before TVM's importer)")
    _debug(p)


def _rule_selection(p: argparse.ArgumentParser, documented: bool = True) -> None:
    """--rules, --only, --disable (`_rules` reads them); the `rules` command lists them undocumented."""
    def doc(**kw) -> dict:
        return kw if documented else {}

    p.add_argument("--rules", action="append", default=[], metavar="FILE.py",
                   **doc(help="load extra rules from a file"))
    p.add_argument("--only", default="", **doc(metavar="RULE,...", help="use only these rules"))
    p.add_argument("--disable", action="append", default=[], **doc(metavar="RULE", help="disable a rule (repeatable)"))


def _inputs(p: argparse.ArgumentParser, used_for: str, random: str) -> None:
    p.add_argument("--inputs", metavar="FILE.npz",
                   help=f"input values{used_for}: an .npz with an array per graph input name (the rest are seeded "
                        f"random values{random}); give token ids and masks this way")


def _precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="convert a float32 model to fp16 / bf16 before fusing (float32 accumulation; judged "
                        "against the float32 model with the half dtype's tolerance)")


def _tune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tune", type=int, metavar="TRIALS",
                   help="tune each fused kernel with MetaSchedule for TRIALS trials; a tuned schedule is kept where "
                        "it measured faster than the hand schedule (needs the 'tune' extra: cloudpickle, xgboost)")
    p.add_argument("--tune-db", metavar="DIR",
                   help="tuning database folder, reused by every model with the same fused kernels (default: "
                        "$TVM_FUSION_CACHE/tune, i.e. ~/.cache/tvm_fusion/tune)")
    p.add_argument("--tune-rpc", metavar="HOST:PORT:KEY",
                   help="measure on the servers a TVM RPC tracker knows under KEY (python -m tvm.exec.rpc_tracker / "
                        "rpc_server --tracker HOST:PORT --key KEY) instead of on this machine")
    p.add_argument("--tune-kernels", metavar="NAME,...",
                   help="tune only these fused kernels (the manifest's group `function` names, e.g. the slowest "
                        "ones `tvm-fusion profile` lists); default: every fused kernel")
    p.add_argument("--tune-rpc-workers", type=int, default=1, metavar="N",
                   help="measurements in flight at once over --tune-rpc (one per server to keep busy; default 1)")


def _tune_options(args):
    """TuneOptions from the compile flags, None without --tune; the other --tune-* flags need --tune."""
    if args.tune is None:
        given = [f for f, v in (("--tune-db", args.tune_db), ("--tune-rpc", args.tune_rpc),
                                ("--tune-kernels", args.tune_kernels)) if v]
        if given:
            raise FusionError(f"{' and '.join(given)} without --tune: add --tune TRIALS (e.g. --tune 64)")
        return None
    from tvm_fusion.build.tune import TuneOptions, check_options

    kernels = tuple(k for k in (args.tune_kernels or "").split(",") if k) or None
    return check_options(TuneOptions(args.tune, args.tune_db or cache_dir("tune"), args.tune_rpc,
                                     args.tune_rpc_workers, kernels=kernels))


def _debug(p: argparse.ArgumentParser) -> None:
    # also accepted after the subcommand; SUPPRESS keeps the global flag's value when absent here
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="print the traceback of an internal error")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_compile_parser, _bundle_parser, _compare_parser, _profile_parser):
        add(sub)
    e = sub.add_parser("explain", help="which rule took each chain, why others declined, what is left to TVM")
    _common(e)
    _precision(e)
    r = sub.add_parser("rules", help="list the rules in priority order")
    _rule_selection(r, documented=False)
    _debug(r)
    return parser


def _compile_parser(sub) -> None:
    c = sub.add_parser("compile", help="fuse and build a model into a loadable library + JSON manifest",
                       description="Fuse and build a model into a loadable library + JSON manifest. Before writing "
                                   "it, the fused build is checked against onnxruntime element by element; an output "
                                   "over tolerance is checked against the unfused build: a difference fusion made "
                                   "is refused (exit 1, naming the rule to blame), one the unfused build shares is "
                                   "written with a warning (--strict: refused).")
    _common(c, target="cuda")
    c.add_argument("-o", "--output", required=True, help="library path to write (e.g. model.so)")
    _precision(c)
    c.add_argument("--no-counts", action="store_true", help="skip counting the unfused/tvm builds' kernels")
    c.add_argument("--no-verify", action="store_true",
                   help="write the library without first checking the fused build against onnxruntime")
    c.add_argument("--strict", action="store_true",
                   help="refuse (exit 1) also a difference from onnxruntime that the unfused TVM build shares (by "
                        "default written with a warning: TVM's importer and onnxruntime disagree, not fusion)")
    c.add_argument("--search-timeout", type=float, default=None, metavar="SECONDS",
                   help="when the fused build differs from the unfused one, stop the search for the rule to blame "
                        "after SECONDS (default: 120; 0: no search)")
    _inputs(c, " for the verify step", "")
    graph = c.add_mutually_exclusive_group()
    graph.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", default=None,
                       help="launch every kernel on its own (default for --target cuda with static shapes: capture "
                            "them in a CUDA graph, replayed with one launch per inference)")
    graph.add_argument("--cuda-graph", dest="cuda_graph", action="store_true",
                       help="a CUDA graph also with --external-weights (off by default there: the graph keeps the "
                            "first call's weight tensors, so every call must pass the same ones)")
    c.add_argument("--external-weights", action="store_true",
                   help="write the weights to <output>.weights instead of into the library")
    c.add_argument("--no-blocked-layout", dest="blocked_layout", action="store_false",
                   help="keep every kernel's tensors NCHW (by default an AVX-512 CPU target's conv chains pass "
                        "their activations in NCHW16c)")
    _tune_flags(c)


def _bundle_parser(sub) -> None:
    bnd = sub.add_parser("bundle", help="copy a compiled library, its weights and the TVM runtime alone (no "
                         "compiler) into a folder that runs with plain Python: python DIR/run.py")
    bnd.add_argument("library", help="a library written by tvm-fusion compile (with its .json manifest)")
    bnd.add_argument("-o", "--output", required=True, help="folder to write")
    bnd.add_argument("--python", default=None, help="Python version of the target machine (default: this one's)")
    bnd.add_argument("--numpy", action="store_true", help="carry numpy's wheel for the target Python (unpacked "
                     "by run.py where the target has no numpy)")


def _compare_parser(sub) -> None:
    m = sub.add_parser("compare", help="build unfused / tvm / fused, run them and onnxruntime, report",
                       description="Build unfused / tvm / fused, run them and onnxruntime on the same inputs, and "
                                   "judge every element: |a - r| <= atol * max(rms(r), max|r|/10) + rtol * |r| + "
                                   "noise(r), (rtol, atol) by the output's dtype, noise(r) where onnxruntime's "
                                   "optimized and as-written runs differ. Exit 1 when a comparison is over it.")
    _common(m)
    _precision(m)
    m.add_argument("--repeat", type=int, default=10, help="timed runs per build (interleaved; 0: no timing)")
    m.add_argument("--modes", default="unfused,tvm,fused",
                   help="builds to make (comma separated); each is compared with onnxruntime, fused also with unfused")
    _inputs(m, "", ": floats ~N(0, 1), integers in [0, 8)")
    m.add_argument("--per-group", action="store_true",
                   help="check each fused group against its unfused subgraph on the real intermediate values, "
                        "and name the first group over tolerance")
    m.add_argument("--bisect", action="store_true",
                   help="--per-group, then disable the rules to blame, rebuild, and report which rule broke what")


def _profile_parser(sub) -> None:
    pr = sub.add_parser("profile", help="time every kernel unfused and fused; memory traffic, roofline, "
                                        "what to fuse next; --html report")
    _common(pr)
    pr.add_argument("--modes", default="unfused,fused", help="builds to profile (unfused and fused needed; tvm optional)")
    pr.add_argument("--repeat", type=int, default=5, help="timed inferences per build (medians)")
    pr.add_argument("--json", metavar="OUT.json", help="write the profile's data as JSON")
    pr.add_argument("--html", metavar="REPORT.html", help="write a self-contained HTML report")
    _precision(pr)


def _rules(args):
    from tvm_fusion.fusion.loader import load_rules_for

    disable = [n for d in args.disable for n in d.split(",") if n]
    return load_rules_for(args.rules, only=[n for n in args.only.split(",") if n], disable=disable)


def _model(args, shapes: dict | None = None):
    """The model path; for --example with a symbolic outermost --shape dim, the example's dynamic-batch variant."""
    if args.example and args.model:
        raise FusionError("give either a model path or --example, not both")
    if args.example:
        from tvm_fusion.frontend.importer import SymDim

        dynamic = any(shape and isinstance(shape[0], SymDim) for shape in (shapes or {}).values())
        return str(example_path(args.example, args.seed, dynamic_batch=dynamic))
    if not args.model:
        raise FusionError("no model given: pass a path to an .onnx file, or --example resnet50")
    return args.model


def _shapes(args) -> dict:
    from tvm_fusion.frontend.importer import format_shape, parse_shape

    shapes: dict = {}
    for text in args.shape:
        name, shape = parse_shape(text)
        if shapes.get(name, shape) != shape:
            raise FusionError(f"--shape {name} is given twice, as {format_shape(shapes[name])} and "
                              f"{format_shape(shape)}; keep one")
        shapes[name] = shape
    return shapes


def _check_args(args) -> None:
    """Flags that are wrong before anything is loaded."""
    if getattr(args, "seed", 0) < 0:
        raise FusionError(f"--seed {args.seed}: the seed must be >= 0")
    if getattr(args, "repeat", 0) < 0:
        raise FusionError(f"--repeat {args.repeat}: use 0 (no timing) or more")
    if getattr(args, "strict", False) and args.no_verify:
        raise FusionError("--strict and --no-verify: --strict refuses what the verify step finds; drop one")
    timeout = getattr(args, "search_timeout", None)
    if timeout is not None and not timeout >= 0:  # also NaN
        raise FusionError(f"--search-timeout {timeout:g}: use 0 (no search) or more seconds")
    arch = getattr(args, "arch", None)
    if arch is not None:
        from tvm_fusion.build.builder import check_arch

        check_arch(arch, nvcc=args.target == "cuda")


def _run(args) -> int:
    _check_args(args)
    if args.command == "rules":
        return _list_rules(args)
    if args.command == "bundle":
        from tvm_fusion.deploy.bundle import bundle

        print(bundle(args.library, args.output, args.python, numpy_wheel=args.numpy))
        return 0
    from tvm_fusion.build.builder import resolve_target

    target = resolve_target(args.target, args.arch)  # a bad --target fails here, before any work; resolved once
    rules = _rules(args)
    shapes = _shapes(args)
    model = _model(args, shapes)
    if args.command == "explain":
        from tvm_fusion.check.explain import explain

        print(explain(model, target, shapes=shapes, rules=rules, simplify=not args.no_simplify,  # --arch included
                      precision=args.precision))
        return 0
    if args.command == "profile":
        return _profile(args, model, target, shapes, rules)
    if args.command == "compile":
        return _compile(args, model, target, shapes, rules)
    return _compare(args, model, target, shapes, rules)


def _compare(args, model, target, shapes, rules) -> int:
    from tvm_fusion.check.compare import check_modes

    modes = check_modes(args.modes)
    if args.per_group or args.bisect:
        return _differential(args, model, target, shapes, rules)
    from tvm_fusion.check.compare import compare

    report = compare(model, target, shapes=shapes, rules=rules, repeat=args.repeat, seed=args.seed,
                     arch=args.arch, modes=modes, inputs=args.inputs, precision=args.precision,
                     simplify=not args.no_simplify)
    print(report)
    print(_profile_hint(args))
    if report.executed and not report.ok:
        raise ToleranceExceeded(f"{' and '.join(report.failing_builds())} build exceeds the tolerance: "
                                + "; ".join(report.failures()))
    return 0


def _list_rules(args) -> int:
    from .patterns.priority import convention

    for r in _rules(args):
        print(f"{r.priority:5d}  {r.name:24s} {','.join(r.targets):10s} {r.doc}")
    print("\n" + convention())
    return 0


def _compile(args, model, target, shapes, rules) -> int:
    from tvm_fusion.deploy.compile import compile_model

    tune = _tune_options(args)
    from tvm_fusion.check.verify import DEFAULT_SEARCH_TIMEOUT

    timeout = DEFAULT_SEARCH_TIMEOUT if args.search_timeout is None else args.search_timeout
    result = compile_model(model, args.output, target, arch=args.arch, shapes=shapes, rules=rules,
                           counts_of_other_builds=not args.no_counts, verify=not args.no_verify,
                           seed=args.seed, external_weights=args.external_weights, inputs=args.inputs,
                           cuda_graph=args.cuda_graph, precision=args.precision, tune=tune,
                           strict=args.strict, search_timeout=timeout, simplify=not args.no_simplify,
                           blocked_layout=args.blocked_layout)
    warning = (result.manifest.verification or {}).get("warning")
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(result)
    print(_profile_hint(args))
    return 0


def _profile_hint(args) -> str:
    """The profile command for the same model, target and shapes: where the time and the traffic go."""
    model = ["--example", args.example] if args.example else [args.model]
    shapes = [a for s in args.shape for a in ("--shape", s)]
    precision = ["--precision", args.precision] if getattr(args, "precision", "fp32") != "fp32" else []
    cmd = ["tvm-fusion", "profile", *model, *shapes, "--target", args.target, *precision, "--html", "report.html"]
    return "per-kernel time, memory traffic and what to fuse next: " + shlex.join(cmd)


def _profile(args, model, target, shapes, rules) -> int:
    from tvm_fusion.profile.measure import profile

    report = profile(model, target, shapes=shapes, rules=rules, modes=[m for m in args.modes.split(",") if m],
                     repeat=args.repeat, seed=args.seed, arch=args.arch, simplify=not args.no_simplify,
                     precision=args.precision)
    print(report)
    for path, write in ((args.json, report.write_json), (args.html, report.write_html)):
        if path:
            write(path)
            print(f"wrote {path}")
    return 0


def _differential(args, model, target, shapes, rules) -> int:
    from tvm_fusion.check.differential import bisect, check_groups

    kw = {"shapes": shapes, "rules": rules, "seed": args.seed, "arch": args.arch, "inputs": args.inputs,
          "precision": args.precision, "simplify": not args.no_simplify}
    if args.bisect:
        report = bisect(model, target, **kw)
        print(report)
        if not report.first.ok:
            raise ToleranceExceeded(report.first.first_failure() + "; " + report.verdict)
        return 0
    report = check_groups(model, target, **kw)
    print(report)
    if not report.ok:
        raise ToleranceExceeded(report.first_failure() + "; run with --bisect to find the rule to blame")
    return 0


def _where(err: BaseException, command: str) -> str:
    """`compare (tvm_fusion/build/builder.py:85 in build)`: the command and the innermost frame of our package."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if re.search(r"[/\\]tvm_fusion[/\\]", f.filename)]
    if not frames:
        return command
    f = frames[-1]
    path = f.filename[f.filename.rfind("tvm_fusion"):]
    return f"{command} ({path}:{f.lineno} in {f.name})"


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def main(argv=None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 tolerance exceeded, 2 bad input, 3 internal error)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse: usage errors are bad input (2), --help is 0
        return exit_.code if isinstance(exit_.code, int) else 2
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
    except Exception as err:  # noqa: BLE001 - anything else is our bug: one line, the traceback on request
        if args.debug:
            traceback.print_exc()
        print(f"error: internal error in {_where(err, args.command)}: {type(err).__name__}: {_first_line(err)} "
              "(run with --debug for the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
