# The cases of `metrale-gpu bench comm` through torch.distributed (NCCL backend), two processes
# spawned with torch.multiprocessing, one GPU each, timed the same way:
#  - all_reduce_<size> / all_gather_<size>: BF16, events on rank 0's stream around one call,
#    median; GB/s is the bus bandwidth (all-reduce bytes * 2(n-1)/n, all-gather output bytes *
#    (n-1)/n per second), as ours;
#  - all_reduce_<size>_graph: 32 all-reduces captured in a CUDA graph on each rank, replay
#    timed with events, per call;
#  - tp_mlp_b<B>_tp2 / _one: hidden 4096, intermediate 14336, F.linear + silu * up + F.linear
#    (+ all-reduce of y for tp2), CUDA-graph replay, median.
# Writes JSON rows keyed "comm/<case>" (report.py's peer format) to --out.
import argparse, json, os, socket, sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

GRAPH_CALLS = 32
KIB = [8, 32, 128, 512, 2048, 8192, 32768, 65536, 131072, 262144, 524288, 1048576]


def events(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.synchronize()
    return g


def size_text(b):
    return f"{b >> 30}GiB" if b >= 1 << 30 else f"{b >> 20}MiB" if b >= 1 << 20 else f"{b >> 10}KiB"


def worker(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    rows = {}
    largest = (1 << 20) if args.quick else (1 << 30)

    def put(key, metric, value, how, **extra):
        if rank == 0:
            rows["comm/" + key] = {"metric": metric, "value": value, "how": how, **extra}
            print(f"{key:28s} {metric} {value:10.3f}", flush=True)

    for kind in ("all_reduce", "all_gather"):
        for kib in KIB:
            b = kib << 10
            if b > largest:
                break
            it = 20 if b >= 256 << 20 else args.iters
            wu = 5 if b >= 256 << 20 else args.warmup
            if kind == "all_reduce":
                x = torch.randn(b // 2, device=dev, dtype=torch.bfloat16)
                fn = lambda: dist.all_reduce(x)
                bus = b
            else:
                x = torch.randn(b // 4, device=dev, dtype=torch.bfloat16)
                out = torch.empty(b // 2, device=dev, dtype=torch.bfloat16)
                fn = lambda: dist.all_gather_into_tensor(out, x)
                bus = b / 2
            us = events(fn, wu, it)
            extra = {"target_ratio": 0.97} if b >= 64 << 20 else {}
            put(f"{kind}_{size_text(b)}", "gbps", bus / us / 1e3,
                f"torch.distributed {kind}, bf16, events, bus bandwidth", median_us=us, **extra)
            del x
            torch.cuda.synchronize()
    for kib in (8, 64):
        x = torch.randn((kib << 10) // 2, device=dev, dtype=torch.bfloat16)
        def burst():
            for _ in range(GRAPH_CALLS):
                dist.all_reduce(x)
        g = capture(burst)
        us = events(g.replay, args.warmup, args.iters)
        put(f"all_reduce_{kib}KiB_graph", "per_item_us", us / GRAPH_CALLS,
            f"{GRAPH_CALLS} all_reduce in a CUDA graph, replay, per call",
            **({"target_ratio": 1.0} if kib == 8 else {}))
        del g

    hidden, inter = (512, 1536) if args.quick else (4096, 14336)
    gen = torch.Generator(device="cpu").manual_seed(5)
    wg = (torch.rand(inter, hidden, generator=gen) * 2 - 1).to(torch.bfloat16) / hidden
    wu_ = (torch.rand(inter, hidden, generator=gen) * 2 - 1).to(torch.bfloat16) / hidden
    wd = (torch.rand(hidden, inter, generator=gen) * 2 - 1).to(torch.bfloat16) / inter
    il = inter // world
    sl = slice(rank * il, (rank + 1) * il)
    gu_tp = torch.cat([wg[sl], wu_[sl]]).to(dev)
    down_tp = wd[:, sl].contiguous().to(dev)
    gu_one = torch.cat([wg, wu_]).to(dev) if rank == 0 else None
    down_one = wd.to(dev) if rank == 0 else None

    def mlp(x, gu_w, down_w, reduce):
        g, u = F.linear(x, gu_w).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down_w)
        if reduce:
            dist.all_reduce(y)
        return y

    for batch in (1, 64):
        x = torch.randn(batch, hidden, device=dev, dtype=torch.bfloat16)
        one_us = None
        if rank == 0:
            g = capture(lambda: mlp(x, gu_one, down_one, False))
            one_us = events(g.replay, args.warmup, args.iters)
            put(f"tp_mlp_b{batch}_one", "median_us", one_us, "one GPU, CUDA graph replay")
            del g
        dist.barrier()
        g = capture(lambda: mlp(x, gu_tp, down_tp, True))
        us = events(g.replay, args.warmup, args.iters)
        put(f"tp_mlp_b{batch}_tp2", "median_us", us,
            f"two GPUs, all-reduce of y, CUDA graph replay; {one_us / us:.2f}x torch's one GPU"
            if one_us else "two GPUs")
        del g
        dist.barrier()
    if rank == 0:
        props = torch.cuda.get_device_properties(0)
        queue.put({"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
                   "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()), "rows": rows})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if torch.cuda.device_count() < 2:
        print("peers_comm: needs two GPUs", file=sys.stderr)
        sys.exit(77)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(worker, args=(2, port, args, queue), nprocs=2, join=True)
    result = queue.get()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
