#!/usr/bin/python3
"""Loader throughput, spotrain against PyTorch, on the same JPEG ImageFolder in the same run.

Both sides do the standard ImageNet training transform: read the file, decode the JPEG,
RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3), RandomHorizontalFlip, normalize with
ImageNet's mean/std, and batch (fp32). PyTorch: torchvision.datasets.ImageFolder + transforms
(PIL, which decodes with libjpeg-turbo too) + DataLoader. spotrain: build/bench/bench_loader.
Per core: spotrain with 1 decode thread, PyTorch with num_workers=0 (in the main process) and
torch.set_num_threads(1), both timing CPU seconds as well as wall time. Runs alternate and
repeat; the median of each is reported.

usage: /usr/bin/python3 bench/compare_loader.py DIR [--bench build/bench/bench_loader]
       [--workers 1,2] [--batch 64] [--batches 20] [--repeats 3] [--eval] [--markdown]
DIR is made by bench/make_jpeg_folder.py (DIR/train/<class>/*.JPEG).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def torch_run(root, workers, batch, batches, train):
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as T

    torch.set_num_threads(1)
    norm = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if train:
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    else:
        tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    ds = datasets.ImageFolder(os.path.join(root, "train"), tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=train, num_workers=workers,
                                     drop_last=True, persistent_workers=workers > 0,
                                     prefetch_factor=4 if workers > 0 else 2)
    it = iter(dl)
    for _ in range(4 + max(workers, 1) + 2):  # warm-up, as on the spotrain side
        try:
            next(it)
        except StopIteration:
            it = iter(dl)
            next(it)
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for _ in range(batches):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(dl)
            x, y = next(it)
        n += x.shape[0]
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    res = {"impl": "pytorch", "workers": workers, "batch": batch, "images": n, "seconds": secs,
           "images_per_sec": n / secs, "train": train}
    if workers == 0:  # everything ran in this process
        res["cpu_seconds"] = cpu
        res["images_per_cpu_sec"] = n / cpu
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--bench", default="build/bench/bench_loader")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eval", action="store_true", help="eval transform (resize 256, center crop 224)")
    ap.add_argument("--fast-decode", action="store_true", help="spotrain: fast IDCT/upsampling")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:  # one PyTorch measurement in its own process
        print(json.dumps(torch_run(a.dir, int(a.child), a.batch, a.batches, not a.eval)))
        return
    rows = []
    for w in [int(x) for x in a.workers.split(",")]:
        ours, theirs = [], []
        for _ in range(a.repeats):
            cmd = [a.bench, "--data", "imagefolder:" + a.dir, "--workers", str(w), "--batch", str(a.batch),
                   "--batches", str(a.batches)] + (["--eval"] if a.eval else []) + \
                  (["--fast-decode"] if a.fast_decode else [])
            ours.append(json.loads(subprocess.check_output(cmd, text=True)))
            # per core: PyTorch's single-process loader (num_workers=0) against our 1 thread
            tw = 0 if w == 1 else w
            cmd = [sys.executable, __file__, a.dir, "--child", str(tw), "--batch", str(a.batch),
                   "--batches", str(a.batches)] + (["--eval"] if a.eval else [])
            theirs.append(json.loads(subprocess.check_output(cmd, text=True)))
        med = lambda runs, k: statistics.median(r[k] for r in runs) if k in runs[0] else float("nan")
        rows.append({"workers": w, "torch_workers": 0 if w == 1 else w,
                     "spotrain_ips": med(ours, "images_per_sec"), "torch_ips": med(theirs, "images_per_sec"),
                     "spotrain_ips_per_cpu": med(ours, "images_per_cpu_sec"),
                     "torch_ips_per_cpu": med(theirs, "images_per_cpu_sec")})
    if a.markdown:
        print("| decode threads (spotrain) / DataLoader workers (PyTorch) | spotrain img/s | PyTorch img/s | ratio "
              "| spotrain img per CPU-s | PyTorch img per CPU-s | ratio per core |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| %d / %d | %.0f | %.0f | %.2fx | %.0f | %s | %s |" % (
                r["workers"], r["torch_workers"], r["spotrain_ips"], r["torch_ips"],
                r["spotrain_ips"] / r["torch_ips"], r["spotrain_ips_per_cpu"],
                "%.0f" % r["torch_ips_per_cpu"] if r["torch_ips_per_cpu"] == r["torch_ips_per_cpu"] else "-",
                "%.2fx" % (r["spotrain_ips_per_cpu"] / r["torch_ips_per_cpu"])
                if r["torch_ips_per_cpu"] == r["torch_ips_per_cpu"] else "-"))
    else:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
