#!/usr/bin/python3
"""Moves ResNet weights between spotrain checkpoints and PyTorch / torchvision.

  torch_interop.py export CKPT.h5 OUT.pt     our checkpoint -> a state_dict for torchvision
  torch_interop.py import IN.pt OUT.h5 --arch resnet50
                                             a torchvision state_dict -> our checkpoint
                                             (weights only: usable by eval / as a start)
  torch_interop.py check CKPT.h5 PREFIX      loads CKPT into torchvision and compares its
                                             logits on PREFIX.inputs.npy with our
                                             PREFIX.logits.npy (`spotrain eval --dump-logits`)

Our tensors already carry torchvision's names (conv1.weight, layer1.0.downsample.1.running_var,
fc.bias, ...); export adds BN's num_batches_tracked (the global step). Models with a stem
for other than 3 input channels get torchvision's resnet with conv1 replaced to match.
The format is docs/CHECKPOINT_FORMAT.md; every dataset carries the CRC-32 of its bytes.
"""
import argparse
import datetime
import json
import os
import sys
import zlib

import h5py
import numpy as np

FORMAT_VERSION = 1


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_checkpoint(path):
    """-> (attrs dict, {name: float32 array}) of /model."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"cannot open checkpoint {path}: {e}")
    with f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        version = int(attrs.get("format_version", 0))
        if not 1 <= version <= FORMAT_VERSION:
            fail(f"checkpoint {path} has format version {version}; this script reads 1 to {FORMAT_VERSION}")
        if "model" not in f:
            fail(f"checkpoint {path} has no /model group")
        tensors = {}
        for name, ds in f["model"].items():
            a = np.asarray(ds[...], dtype="<f4")
            crc = int(ds.attrs.get("crc32", -1))
            if crc != zlib.crc32(a.tobytes()):
                fail(f"checkpoint {path}: tensor '{name}' fails its checksum (the file is corrupt)")
            tensors[name] = a
    return attrs, tensors


def torchvision_model(arch, num_classes, in_channels):
    import torch
    import torchvision
    if not hasattr(torchvision.models, arch):
        return None
    m = getattr(torchvision.models, arch)(num_classes=num_classes)
    if in_channels != 3:
        m.conv1 = torch.nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


def to_state_dict(attrs, tensors):
    import torch
    sd = {name: torch.from_numpy(a.copy()) for name, a in tensors.items()}
    step = int(attrs.get("global_step", 0))
    for name in list(sd):
        if name.endswith(".running_mean"):
            sd[name[: -len("running_mean")] + "num_batches_tracked"] = torch.tensor(step, dtype=torch.long)
    return sd


def cmd_export(args):
    import torch
    attrs, tensors = read_checkpoint(args.ckpt)
    sd = to_state_dict(attrs, tensors)
    arch = attrs["model"]
    model = torchvision_model(arch, int(attrs["num_classes"]), int(attrs["in_channels"]))
    if model is None:
        print(f"note: torchvision has no {arch}; the state_dict keeps our (torchvision-style) names")
    else:
        model.load_state_dict(sd, strict=True)  # fails loudly on any name or shape mismatch
    torch.save(sd, args.out)
    print(f"exported {len(tensors)} tensors of {arch} (step {attrs.get('global_step', 0)}) to {args.out}")


def cmd_import(args):
    import torch
    sd = torch.load(args.state_dict, map_location="cpu")
    if isinstance(sd, dict) and "state_dict" in sd:
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or "fc.weight" not in sd or "conv1.weight" not in sd:
        fail(f"{args.state_dict} is not a ResNet state_dict (no conv1.weight / fc.weight)")
    sd = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
    num_classes = int(sd["fc.weight"].shape[0])
    in_channels = int(sd["conv1.weight"].shape[1])
    model = torchvision_model(args.arch, num_classes, in_channels)
    if model is not None:
        model.load_state_dict(sd, strict=True)  # names and shapes are those of the arch
    config = {"model": args.arch, "data": args.data, "imported_from": args.state_dict}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    tmp = args.out + ".tmp"
    with h5py.File(tmp, "w") as f:
        ints = {"format_version": FORMAT_VERSION, "epoch": 0, "global_step": 0, "batch_in_epoch": 0,
                "samples_in_epoch": 0, "global_batch": 0, "world_size": 0, "seed": 0,
                "num_classes": num_classes, "in_channels": in_channels}
        for k, v in ints.items():
            f.attrs.create(k, v, dtype="<i8")
        for k, v in {"engine_version": "spotrain 0.1.0 (torch_interop import)", "created": now,
                     "config": json.dumps(config), "model": args.arch, "precision": "fp32"}.items():
            f.attrs[k] = np.bytes_(v)
        g = f.create_group("model")
        n = 0
        for name, t in sd.items():
            if name.endswith("num_batches_tracked"):
                continue
            a = np.ascontiguousarray(t.detach().float().numpy(), dtype="<f4")
            ds = g.create_dataset(name, data=a)
            ds.attrs.create("crc32", zlib.crc32(a.tobytes()), dtype="<i8")
            n += 1
    os.replace(tmp, args.out)
    print(f"imported {n} tensors ({args.arch}, {num_classes} classes, {in_channels} input channels) to {args.out}")


def cmd_check(args):
    import torch
    attrs, tensors = read_checkpoint(args.ckpt)
    model = torchvision_model(attrs["model"], int(attrs["num_classes"]), int(attrs["in_channels"]))
    if model is None:
        fail(f"torchvision has no {attrs['model']}")
    model.load_state_dict(to_state_dict(attrs, tensors), strict=True)
    model.eval()
    x = torch.from_numpy(np.load(args.prefix + ".inputs.npy"))
    ours = np.load(args.prefix + ".logits.npy")
    with torch.no_grad():
        theirs = model(x).numpy()
    rel = float(np.abs(theirs - ours).max() / max(np.abs(theirs).max(), 1e-30))
    print(json.dumps({"model": attrs["model"], "batch": int(x.shape[0]), "max_rel_err": rel}))
    if rel >= args.tolerance:
        fail(f"logits differ: max relative error {rel:.3g} >= {args.tolerance}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="our checkpoint -> PyTorch state_dict")
    e.add_argument("ckpt")
    e.add_argument("out")
    i = sub.add_parser("import", help="PyTorch / torchvision state_dict -> our checkpoint")
    i.add_argument("state_dict")
    i.add_argument("out")
    i.add_argument("--arch", required=True, help="resnet18|34|50|101|152")
    i.add_argument("--data", default="", help="recorded as the data the model is for (eval's default)")
    c = sub.add_parser("check", help="compare torchvision's logits with ours")
    c.add_argument("ckpt")
    c.add_argument("prefix")
    c.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()
    {"export": cmd_export, "import": cmd_import, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
