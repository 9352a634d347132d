"""The apache-tvm-ffi pin (setup.py): with apache-tvm-ffi 0.1.15.post2, apache-tvm 0.27.0.post1's
tvm.ir.save_json segfaults in ffi::ToJSONGraph (even on tirx.const(1, "int32")), which takes down
MetaSchedule (tune_tir serializes its tasks) and Schedule.tensorize. 0.1.14.post0 round-trips.

The round-trip runs in a child process so a segfault fails this test instead of killing the pytest run."""

import subprocess
import sys
import textwrap

ROUND_TRIP = textwrap.dedent(
    """
    import tvm
    from tvm import te, tirx

    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(tirx.const(1, "int32"))),
                                   tirx.const(1, "int32"))
    A = te.placeholder((64, 64), "float32", name="A")
    B = te.placeholder((64, 64), "float32", name="B")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    f = te.create_prim_func([A, B, C])
    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(f)), f)
    print("ok")
    """
)


def test_save_json_round_trips_a_primfunc():
    proc = subprocess.run([sys.executable, "-c", ROUND_TRIP], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        from importlib.metadata import version

        raise AssertionError(
            f"save_json/load_json round-trip failed (rc={proc.returncode}, apache-tvm-ffi "
            f"{version('apache-tvm-ffi')}; setup.py pins the version that works):\n{proc.stderr[-3000:]}"
        )
    assert proc.stdout.strip() == "ok"
