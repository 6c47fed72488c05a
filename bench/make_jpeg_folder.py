#!/usr/bin/python3
"""Writes an ImageFolder of ImageNet-like JPEGs (DIR/train/<class>/*.JPEG, DIR/val/...) for
the loader benchmark: 1/f-spectrum colour images (the power law of natural photographs) with
sizes around ImageNet's typical 500x375, saved by PIL at quality 90 (4:2:0), so the decoder
does the work a real ImageNet file asks of it (files of about 100-150 KB).

usage: /usr/bin/python3 bench/make_jpeg_folder.py DIR [--train 2000] [--val 200] [--classes 10]
"""
import argparse
import os

import numpy as np
from PIL import Image


def natural_image(rng, w, h):
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    amp = 1.0 / f ** 1.1
    amp[0, 0] = 0.0
    base = None
    chans = []
    for c in range(3):
        phase = rng.uniform(0, 2 * np.pi, size=amp.shape)
        spec = amp * np.exp(1j * phase)
        img = np.fft.irfft2(spec, s=(h, w))
        if base is None:
            base = img
        else:  # colour channels of photos are strongly correlated
            img = 0.75 * base + 0.25 * img
        chans.append(img)
    x = np.stack(chans, axis=-1)
    x = (x - x.mean()) / (x.std() + 1e-9)
    x = 118 + 48 * x + rng.uniform(-3, 3, size=x.shape)  # a little sensor noise
    return Image.fromarray(np.clip(x, 0, 255).astype(np.uint8), "RGB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--val", type=int, default=200)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    total = 0
    for split, n in (("train", a.train), ("val", a.val)):
        for i in range(n):
            c = i % a.classes
            d = os.path.join(a.dir, split, "n%08d" % c)
            os.makedirs(d, exist_ok=True)
            # ImageNet-like sizes: mostly 500x375 / 375x500 / 500x333, some larger
            w, h = [(500, 375), (375, 500), (500, 333), (500, 400), (640, 480)][int(rng.integers(0, 5))]
            p = os.path.join(d, "img_%06d.JPEG" % i)
            natural_image(rng, w, h).save(p, quality=90)
            total += os.path.getsize(p)
    print("wrote %d images, mean %.1f KB, to %s" % (a.train + a.val, total / 1024 / (a.train + a.val), a.dir))


if __name__ == "__main__":
    main()
