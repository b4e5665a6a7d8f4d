#!/usr/bin/python3
"""bench-gloo.py: PyTorch's Gloo all-reduce timed as bench-avg times beed's.

For tools/bench/run-avg; a benchmark tool, never a runtime dependency.
--procs ranks on loopback (torch.distributed, backend 'gloo', TCP store on
127.0.0.1), fp32 tensors of each size.  For every size: --warmup uncounted
rounds, then --reps rounds, each after a barrier; a round's time is the
slowest rank's (all_reduce with MAX of the times).  The sum is divided by
the number of ranks afterwards, as a mean needs, and checked.

Output: "RESULT impl=gloo procs=N bytes=S reps=R ms_median=... ms_min=...
busbw_gbs=...", one line per size, from rank 0.

With --rank R --master ADDR:PORT this process is rank R alone, rank 0
holding the TCP store at ADDR:PORT, and --ifname names the interface
Gloo uses: tools/bench/run-avg-wan starts one such process in each host
of a WAN lab.
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, args, port, addr="127.0.0.1", ifname="lo"):
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    for size in args.sizes:
        n = size // 4
        x = torch.empty(n, dtype=torch.float32)
        times = []
        for r in range(-args.warmup, args.reps):
            x.fill_(float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            x.div_(args.procs)
            mine = torch.tensor([(time.perf_counter() - t0) * 1e3],
                                dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            if abs(float(x[0]) - (args.procs + 1) / 2) > 1e-6 * args.procs:
                print(f"bench-gloo: rank {rank}: wrong mean", file=sys.stderr)
                sys.exit(1)
            if r >= 0:
                times.append(float(mine[0]))
        if rank == 0:
            med = statistics.median(times)
            bus = 2.0 * (args.procs - 1) / args.procs * size
            print(f"RESULT impl=gloo procs={args.procs} bytes={size} "
                  f"reps={args.reps} ms_median={med:.4f} "
                  f"ms_min={min(times):.4f} "
                  f"busbw_gbs={bus / (med * 1e-3) / 1e9:.4f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sizes", default="4,1048576,104857600")
    p.add_argument("--rank", type=int, help="run as this rank alone")
    p.add_argument("--master", help="ADDR:PORT of rank 0's store (--rank)")
    p.add_argument("--ifname", default="lo", help="Gloo's interface (--rank)")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.rank is not None:
        if args.master is None or not 0 <= args.rank < args.procs:
            p.error("--rank needs --master and 0 <= rank < procs")
        addr, _, port = args.master.rpartition(":")
        rank_main(args.rank, args, int(port), addr, args.ifname)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args, port), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
