"""What one thread block can move inside one GPU: copy and reduce rates, and launch latency.

The runtime cost model (hw_profiles/runtimes.json) charges a thread block `tb_GBps` on a link and
a local copy or reduction (cpy, re) a block's Simple rate. Both rest on one block's memory
throughput being about the per-channel cap: this script measures it on a real GPU, for the copy (what a send
or receive does) and the two-input sum (rrc, rrs), with 1 to 16 sixteen-byte loads in flight per
thread (NCCL's primitives unroll for the same reason), and the launch latency of an empty kernel.

    python benchmarks/block_rates.py [--json FILE]      # needs cupy and a CUDA GPU

Prints one row per (kernel, blocks, threads, unroll, size): median time of 20 runs (CUDA events)
and GB/s counted as bytes written (the payload a step moves); `net` takes the empty kernel's time
between events (launch included) off first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

UNROLLS = (1, 4, 8, 16)
SOURCE = r"""
#define BODY(NAME, U, LOAD, EXPR)                                                            \
extern "C" __global__ void NAME(const float4* __restrict__ a, const float4* __restrict__ b,  \
                                float4* __restrict__ o, long n) {                             \
  long stride = (long)gridDim.x * blockDim.x * U;                                            \
  for (long base = (long)blockIdx.x * blockDim.x * U + threadIdx.x; base < n; base += stride) { \
    float4 r[U];                                                                              \
    _Pragma("unroll") for (int u = 0; u < U; u++) {                                           \
      long i = base + (long)u * blockDim.x;                                                   \
      if (i < n) { LOAD; }                                                                    \
    }                                                                                         \
    _Pragma("unroll") for (int u = 0; u < U; u++) {                                           \
      long i = base + (long)u * blockDim.x;                                                   \
      if (i < n) { o[i] = EXPR; }                                                             \
    }                                                                                         \
  }                                                                                           \
}
#define COPY_LOAD r[u] = a[i]
#define SUM_LOAD float4 x = a[i], y = b[i]; r[u] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w)
""" + "".join(f"BODY(copy_{u}, {u}, COPY_LOAD, r[u])\nBODY(sum_{u}, {u}, SUM_LOAD, r[u])\n" for u in UNROLLS) + r"""
extern "C" __global__ void empty() {}
"""


def timed(cp, launch, reps: int = 20, warm: int = 3) -> float:
    for _ in range(warm):
        launch()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--sizes", default="1048576,16777216,268435456", help="bytes written per run")
    args = ap.parse_args(argv)
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    sms = props["multiProcessorCount"]
    print(f"# {name}, {sms} SMs, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    rows = []
    empty = mod.get_function("empty")
    t_gpu = timed(cp, lambda: empty((1,), (1,), ()))
    walls = []
    for _ in range(200):
        t0 = time.perf_counter()
        empty((1,), (1,), ())
        cp.cuda.Stream.null.synchronize()
        walls.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(1000):
        empty((1,), (1,), ())
    cp.cuda.Stream.null.synchronize()
    per_launch = (time.perf_counter() - t0) / 1000
    print(f"empty kernel: {t_gpu * 1e6:.2f} us between events, launch+sync {statistics.median(walls) * 1e6:.2f} us "
          f"(median of 200), {per_launch * 1e6:.2f} us per launch back to back")
    rows.append({"kernel": "empty", "event_us": t_gpu * 1e6, "launch_sync_us": statistics.median(walls) * 1e6,
                 "back_to_back_us": per_launch * 1e6})
    print(f"{'kernel':8} {'blocks':>6} {'thr':>5} {'unroll':>6} {'bytes':>10} {'us':>10} {'GB/s':>8} {'net':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        n = size // 16
        a = cp.random.random(n * 4, dtype=cp.float32)
        b = cp.random.random(n * 4, dtype=cp.float32)
        o = cp.empty_like(a)
        for kind in ("copy", "sum"):
            for blocks, threads in ((1, 256), (1, 512), (1, 1024), (8, 512), (sms, 512)):
                for u in UNROLLS:
                    f = mod.get_function(f"{kind}_{u}")
                    try:
                        t = timed(cp, lambda: f((blocks,), (threads,), (a, b, o, cp.int64(n))))
                    except cp.cuda.driver.CUDADriverError as e:  # too many registers for this block size
                        print(f"{kind:8} {blocks:6d} {threads:5d} {u:6d} {size:10d}  not launched: {e}")
                        continue
                    want = a + b if kind == "sum" else a
                    ok = bool(cp.array_equal(o, want))
                    rows.append({"kernel": kind, "blocks": blocks, "threads": threads, "unroll": u, "bytes": size,
                                 "us": t * 1e6, "GBps": size / t / 1e9,
                                 "net_GBps": size / max(t - t_gpu, 1e-9) / 1e9, "correct": ok})
                    print(f"{kind:8} {blocks:6d} {threads:5d} {u:6d} {size:10d} {t * 1e6:10.2f} "
                          f"{size / t / 1e9:8.1f} {size / max(t - t_gpu, 1e-9) / 1e9:8.1f}{'' if ok else '  WRONG'}")
        a = b = o = None  # free before the next size
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "sms": sms, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
