"""What `esqbe ray-encode` costs on one node: papers/s end to end (the local cluster's start and every actor's
model load included) and in steady state (from the times its Parquet files were finished), and the hours
per million papers per node that follow. Beside it, `--engine encode` runs plain `esqbe encode` (one
process) over the same files, for Ray's own overhead.

    python benchmarks/bench_ray.py FILES... --out OUT \
        --encoder-backend onnx-int8 --actors 2 --cpus-per-actor 1 --papers-per-file 128

Run it on a quiet machine; OUT is emptied first."""
from __future__ import annotations

import argparse
import os
import shutil
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", choices=("ray", "encode"), default="ray")
    ap.add_argument("--encoder-backend", default=None)
    ap.add_argument("--actors", type=int, default=None)
    ap.add_argument("--cpus-per-actor", type=float, default=1.0)
    ap.add_argument("--papers-per-file", type=int, default=128)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    shutil.rmtree(args.out, ignore_errors=True)
    overrides = {"encoder_backend": args.encoder_backend} if args.encoder_backend else {}
    start = time.perf_counter()
    ray_cpu = None
    if args.engine == "ray":
        import psutil  # a dependency of ray
        import ray

        from esqbe.distributed import ray_encode

        ray.init(include_dashboard=False, log_to_driver=False)  # as ray_encode would, but kept up to read its CPU time
        try:
            report = ray_encode(args.files, args.out, actors=args.actors, cpus_per_actor=args.cpus_per_actor,
                                papers_per_file=args.papers_per_file, **overrides)
            # the cluster's daemons and workers are not this process's waited-for children: their CPU time is
            # not counted as this job's by a tool that measures the rest of the machine, so it is printed here
            ray_cpu = 0.0
            for child in psutil.Process().children(recursive=True):
                try:
                    t = child.cpu_times()
                    ray_cpu += t.user + t.system + t.children_user + t.children_system
                except psutil.Error:
                    pass
        finally:
            ray.shutdown()
    else:
        import esqbe

        report = esqbe.encoder_only(**overrides).encode_files(args.files, args.out)
    wall = time.perf_counter() - start
    print(f"engine {args.engine}, backend {args.encoder_backend or 'default'}, actors {args.actors}, "
          f"cpus/actor {args.cpus_per_actor}, papers/file {args.papers_per_file}, CPUs here {os.cpu_count()}")
    if ray_cpu is not None:
        print(f"Ray's processes (cluster daemons, workers) used {ray_cpu:.1f} CPU-s: part of [quiet]'s 'other processes'")
    print(f"read {report.read}, encoded {report.encoded}, tagged {report.tagged}, errors {len(report.errors)}")
    print(f"end to end (start-up and model loads included): {wall:.1f} s, {report.encoded / wall:.1f} papers/s")
    if args.engine == "ray" and len(report.files) > 2:
        import pyarrow.parquet as pq

        done = sorted((os.path.getmtime(f), pq.ParquetFile(f).metadata.num_rows) for f in report.files)
        papers = sum(n for _, n in done[1:])
        rate = papers / (done[-1][0] - done[0][0])
        print(f"steady state ({len(done) - 1} files after the first, {papers} papers): {rate:.1f} papers/s "
              f"-> {1e6 / rate / 3600:.1f} h per million papers on this node")
    else:
        print(f"-> {1e6 / (report.encoded / wall) / 3600:.1f} h per million papers at the end-to-end rate")


if __name__ == "__main__":
    main()
