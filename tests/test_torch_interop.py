#!/usr/bin/python3
"""Interop round trip (CTest, label unit): a ResNet-50 checkpoint of ours is exported to a
PyTorch state_dict, loaded into torchvision's resnet50, and its logits on the same inputs
match ours (relative error < 1e-4, fp32); torchvision weights imported into our format give
the same logits in `spotrain eval`, and our checkpoint survives export -> import bit for bit.
Usage: test_torch_interop.py SPOTRAIN_BIN SCRIPTS_DIR. Exits 77 (skip) without torch."""
import os
import tempfile

from interop_common import BIN, INTEROP, run  # first: exits 77 where torch is missing

import h5py
import numpy as np
import torch
import torchvision


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


with tempfile.TemporaryDirectory() as d:
    ck = os.path.join(d, "ck")
    # Two SGD steps, so BN running statistics and weights are no longer the initial ones.
    run(BIN, "train", "--model", "resnet50", "--data", "synthetic", "--train-limit", "32",
        "--test-limit", "8", "--steps", "2", "--batch-size", "8", "--threads", "2", "--lr", "0.001",
        "--ckpt-dir", ck)
    ckpt = os.path.join(ck, "ckpt-00000002.h5")
    dump = os.path.join(d, "ours")
    run(BIN, "eval", "--ckpt", ckpt, "--data", "synthetic", "--test-limit", "8",
        "--batch-size", "8", "--threads", "2", "--dump-logits", dump)

    # 1. ours -> torchvision: same logits.
    pt = os.path.join(d, "export.pt")
    run(INTEROP, "export", ckpt, pt)
    out = run(INTEROP, "check", ckpt, dump, "--tolerance", "1e-4")
    assert "max_rel_err" in out
    sd = torch.load(pt)
    assert int(sd["bn1.num_batches_tracked"]) == 2, sd["bn1.num_batches_tracked"]
    model = torchvision.models.resnet50(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    model.load_state_dict(sd, strict=True)
    model.eval()
    x = torch.from_numpy(np.load(dump + ".inputs.npy"))
    with torch.no_grad():
        theirs = model(x).numpy()
    ours = np.load(dump + ".logits.npy")
    e1 = rel_err(ours, theirs)
    print(f"export: max relative logits error {e1:.3g}")
    assert e1 < 1e-4, e1

    # 2. export -> import gives back our tensors bit for bit.
    back = os.path.join(d, "back.h5")
    run(INTEROP, "import", pt, back, "--arch", "resnet50", "--data", "synthetic")
    run(BIN, "ckpt", "verify", back)
    with h5py.File(ckpt, "r") as a, h5py.File(back, "r") as b:
        assert set(a["model"].keys()) == set(b["model"].keys())
        for k in a["model"]:
            assert np.array_equal(a["model"][k][...], b["model"][k][...]), k

    # 3. torchvision -> ours: fresh torchvision weights with non-trivial BN statistics.
    torch.manual_seed(0)
    tv = torchvision.models.resnet50(num_classes=10)
    tv.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    for m in tv.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    tv_pt = os.path.join(d, "tv.pt")
    torch.save(tv.state_dict(), tv_pt)
    imported = os.path.join(d, "imported.h5")
    run(INTEROP, "import", tv_pt, imported, "--arch", "resnet50", "--data", "synthetic")
    dump2 = os.path.join(d, "imported")
    run(BIN, "eval", "--ckpt", imported, "--test-limit", "8", "--batch-size", "8",
        "--threads", "2", "--dump-logits", dump2)
    tv.eval()
    with torch.no_grad():
        theirs = tv(torch.from_numpy(np.load(dump2 + ".inputs.npy"))).numpy()
    e3 = rel_err(np.load(dump2 + ".logits.npy"), theirs)
    print(f"import: max relative logits error {e3:.3g}")
    assert e3 < 1e-4, e3
print("OK")
