#!/usr/bin/python3
"""Pixel fidelity of spotrain's transforms against torchvision/PIL on the same JPEGs.

Dumps one batch from build/bench/bench_loader (--dump) and recomputes every image with
torchvision: evaluation Resize(256) + CenterCrop(224); training F.resized_crop with the crop
box spotrain drew, then the flip. Prints the difference in 8-bit levels (max, mean, 99.9th
percentile). Crops that spotrain decodes at reduced DCT size (denom > 1) are reported apart.

usage: /usr/bin/python3 bench/check_transforms_pil.py DIR [--bench build/bench/bench_loader] [--batch 64]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--bench", default="build/bench/bench_loader")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    for mode in ("eval", "train"):
        with tempfile.TemporaryDirectory() as td:
            prefix = os.path.join(td, "dump")
            cmd = [a.bench, "--data", "imagefolder:" + a.dir, "--workers", "1", "--batch", str(a.batch),
                   "--dump", prefix] + (["--eval"] if mode == "eval" else [])
            subprocess.check_call(cmd)
            meta = json.load(open(prefix + ".json"))
            ours = np.fromfile(prefix + ".bin", np.float32).reshape(len(meta), 224, 224, 3)
        diffs, scaled = [], []
        for i, m in enumerate(meta):
            img = Image.open(m["file"]).convert("RGB")
            if mode == "eval":
                ref = T.CenterCrop(224)(T.Resize(256)(img))
            else:
                top, left = int(m["y"]), int(m["x"])
                ref = F.resized_crop(img, top, left, int(m["h"]), int(m["w"]), [224, 224])
                if m["flip"]:
                    ref = F.hflip(ref)
            ref = np.asarray(ref, np.float32)
            got = (ours[i] * STD + MEAN) * 255.0
            d = np.abs(got - ref)
            (scaled if m["denom"] > 1 else diffs).append(d)
        for name, ds in (("full-size decode", diffs), ("reduced DCT decode", scaled)):
            if not ds:
                continue
            d = np.stack(ds)
            print("%s, %s: %d images, |spotrain - torchvision| in 8-bit levels: max %.2f, mean %.3f, "
                  "99.9th pct %.2f" % (mode, name, len(ds), d.max(), d.mean(), np.percentile(d, 99.9)))


if __name__ == "__main__":
    main()
