#!/usr/bin/env python3
"""PyTorch reference for `spotrain bench` on a GPU: torchvision ResNet-50 training steps on
one synthetic batch (generated once, as spotrain bench does), channels_last, torch.autocast
(fp16 with GradScaler, bf16) or TF32 math, SGD with momentum. Prints and writes (--json) one
JSON object per precision: images/s (median, p10, p90 over the timed steps) and peak memory.

  python3 bench/torch_gpu_resnet50.py --precision fp16,bf16,tf32 --batch-size 256 --json out.json
  python3 bench/torch_gpu_resnet50.py --device cpu --batch-size 2 --image-size 64 --steps 2 --warmup 1
  python3 bench/torch_gpu_resnet50.py --precision fp16 --profile     (kernels by GPU time)
  python3 bench/torch_gpu_resnet50.py --precision fp16 --compile     (torch.compile)
  python3 bench/torch_gpu_resnet50.py --precision fp16,bf16 --compile reduce-overhead
                                                   (torch.compile with CUDA Graphs, its fastest)

Exit code 3 and one line "no CUDA device" when --device cuda finds no GPU.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torchvision


def percentile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    i = int(pos)
    f = pos - i
    return v[i] * (1 - f) + v[i + 1] * f if i + 1 < len(v) else v[i]


def run(precision, args, device):
    torch.manual_seed(args.seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # algorithm choice by measurement, as spotrain
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    model = torchvision.models.resnet50(num_classes=args.num_classes)
    model = model.to(device=device, memory_format=torch.channels_last).train()
    if args.compile == "default":
        model = torch.compile(model)
    elif args.compile:
        model = torch.compile(model, mode=args.compile)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if amp_dtype is torch.float16 and not cuda:
        amp_dtype = torch.bfloat16  # CPU autocast has no fp16 in older PyTorch: smoke test only
    use_scaler = precision == "fp16" and cuda
    scaler = None
    if use_scaler:
        scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        off_dtype = torch.float16 if cuda else torch.bfloat16  # unused when disabled
        with torch.autocast(device_type=device.type, dtype=amp_dtype or off_dtype,
                            enabled=amp_dtype is not None):
            loss = loss_fn(model(x), y)
        if use_scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t0)
    if args.profile and cuda:
        # Where a step's GPU time goes, kernel by kernel, to set beside `spotrain bench --profile`.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        key = ("self_device_time_total" if hasattr(events[0], "self_device_time_total")
               else "self_cuda_time_total")
        print(f"profile {precision} (3 steps; times are totals over them):")
        print(events.table(sort_by=key, row_limit=30, max_name_column_width=70), flush=True)
    ips = [args.batch_size / t for t in times]
    res = {
        "engine": "pytorch",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "model": "resnet50",
        "precision": precision,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "steps": args.steps,
        "images_per_sec": statistics.median(ips),
        "images_per_sec_p10": percentile(ips, 0.1),
        "images_per_sec_p90": percentile(ips, 0.9),
        "final_loss": float(loss.detach().float().cpu()),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "compiled": bool(args.compile),
        "compile_mode": args.compile or "eager",
    }
    if precision == "fp16" and not cuda:
        res["note"] = "CPU smoke test: fp16 ran as bf16 autocast"
    if cuda:
        res["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        res["cuda"] = torch.version.cuda
        res["cudnn"] = torch.backends.cudnn.version()
    del model, opt, x, y
    if cuda:
        torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="fp16,bf16,tf32",
                    help="comma-separated list of fp16, bf16, tf32, fp32")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--device", default="cuda", help="cuda (the GPU) or cpu (smoke test)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results (a list) to this file")
    ap.add_argument("--profile", action="store_true",
                    help="GPU: after timing, print the kernels of 3 profiled steps by GPU time")
    ap.add_argument("--compile", nargs="?", const="default", default=None,
                    choices=["default", "reduce-overhead", "max-autotune",
                             "max-autotune-no-cudagraphs"],
                    help="torch.compile the model, in this mode (default: torch's default; "
                         "reduce-overhead adds CUDA Graphs); the warm-up steps include compiling")
    args = ap.parse_args()
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    for p in precisions:
        if p not in ("fp16", "bf16", "tf32", "fp32"):
            ap.error(f"unknown precision '{p}'; use fp16, bf16, tf32 or fp32")
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        ap.error("--steps and --batch-size must be positive, --warmup not negative")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False "
              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        sys.exit(3)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    results = []
    for p in precisions:
        r = run(p, args, device)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
