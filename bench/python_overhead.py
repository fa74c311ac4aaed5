"""The binding's host cost per op call: a GEMM with prebuilt descriptors (gemm_plan and
gemm_tensors made once) called from Python, beside the same call made from C
(bench/python_overhead.c, compiled here against the same library). The CPU backend runs its
reference GEMM at enqueue, so a small shape keeps that part small; on CUDA (--backend cuda)
the launch is timed, rounds short enough (--iters 500) that the launch queue never fills, the
stream drained between rounds outside the timer. The difference of the two medians is what
Python and ctypes add.

    python3 bench/python_overhead.py [--library build/libmetrale_gpu.so] [--shape 8 8 16]
                                     [--backend cpu|cuda]
"""
import argparse
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

root = pathlib.Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", default=str(root / "build" / "libmetrale_gpu.so"))
    ap.add_argument("--shape", type=int, nargs=3, default=[8, 8, 16])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--iters", type=int, default=None, help="calls per round (cpu 20000, "
                    "cuda 500)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.iters is None:
        args.iters = 20000 if args.backend == "cpu" else 500
    os.environ["METRALE_GPU_LIBRARY"] = args.library
    sys.path.insert(0, str(root / "python"))
    import metrale_gpu as mg

    m, n, k = args.shape
    b = mg.Backend("cpu", 2) if args.backend == "cpu" else mg.Backend("cuda", 0)
    plan = mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n, out_type=mg.DTYPE_F32)
    act, weight, out = b.alloc((m, k), "bf16"), b.alloc((n, k), "bf16"), b.alloc((m, n), "f32")
    act.fill_bytes(0x3C)
    weight.fill_bytes(0x3C)
    t = mg.gemm_tensors(act=act, weight=weight, out=out)
    gemm = mg.gemm
    per = []
    for _ in range(args.rounds):
        t0 = time.perf_counter_ns()
        for _ in range(args.iters):
            gemm(b, None, plan, t)
        per.append((time.perf_counter_ns() - t0) / args.iters)
        b.synchronize()
    per.sort()
    py_ns = per[len(per) // 2]
    b.close()

    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "python_overhead"
        lib = pathlib.Path(args.library).resolve()
        subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-I", str(root / "include"),
                        str(root / "bench" / "python_overhead.c"), "-o", str(exe),
                        "-L", str(lib.parent), "-l:" + lib.name, "-Wl,-rpath," + str(lib.parent)],
                       check=True)
        c_ns = float(subprocess.run([str(exe), str(m), str(n), str(k), str(args.iters),
                                     str(args.rounds), args.backend], check=True, capture_output=True,
                                    text=True).stdout)
    print("machine: %s, %s, Python %s" % (platform.node(), platform.processor() or
                                         platform.machine(), platform.python_version()))
    print("GEMM BF16 %dx%dx%d on the %s backend, prebuilt descriptors, median of %d x %d calls"
          % (m, n, k, args.backend.upper(), args.rounds, args.iters))
    print("  C call (mg_gemm):        %8.2f us" % (c_ns / 1e3))
    print("  Python call (mg.gemm):   %8.2f us" % (py_ns / 1e3))
    print("  binding overhead:        %8.2f us per call" % ((py_ns - c_ns) / 1e3))


if __name__ == "__main__":
    main()
