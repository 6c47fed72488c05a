#!/usr/bin/python3
"""Fine-tuning (CTest, label unit): torchvision ResNet-18 weights for 1000 classes, imported with
scripts/torch_interop.py, start a 10-class run through --init-from: every tensor whose name and
shape match is taken (checked value for value after a step at learning rate 0), the head starts
fresh at the new class count, the run starts at step 0 with a new optimizer, a resumed run
ignores --init-from, and a file that does not fit is one error line.
Usage: test_finetune.py SPOTRAIN_BIN SCRIPTS_DIR. Exits 77 (skip) without torch."""
import os
import tempfile

from interop_common import BIN, INTEROP, run  # first: exits 77 where torch is missing

import h5py
import numpy as np
import torch
import torchvision

COMMON = ["--data", "synthetic", "--train-limit", "32", "--test-limit", "8", "--batch-size", "8",
          "--threads", "2", "--weight-decay", "0"]


with tempfile.TemporaryDirectory() as d:
    torch.manual_seed(1)
    tv = torchvision.models.resnet18(num_classes=1000)
    tv.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)  # the synthetic data's one channel
    for m in tv.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    sd = tv.state_dict()
    pt, imported = os.path.join(d, "tv.pt"), os.path.join(d, "tv.h5")
    torch.save(sd, pt)
    run(INTEROP, "import", pt, imported, "--arch", "resnet18")

    # One step at learning rate 0: the parameters stay what --init-from loaded.
    ft = os.path.join(d, "ft")
    out = run(BIN, "train", "--model", "resnet18", *COMMON, "--steps", "1", "--lr", "0",
              "--ckpt-dir", ft, "--init-from", imported)
    assert "--init-from" in out and "100 of 102 tensors loaded" in out, "no report of what was loaded"
    assert "fc.weight (shape (1000, 512) there, (10, 512) here)" in out, "the head's skip is not reported"
    ck = os.path.join(ft, "ckpt-00000001.h5")
    with h5py.File(ck, "r") as f:
        assert int(f.attrs["global_step"]) == 1, "a fine-tuning run starts at step 0"
        assert int(f["optimizer"].attrs["steps"]) == 1, "a fine-tuning run starts with a new optimizer"
        names = [k for k in f["model"] if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
        taken = 0
        for k in names:
            ours = f["model"][k][...]
            if k.startswith("fc."):
                assert ours.shape[0] == 10, (k, ours.shape)
                continue
            assert np.array_equal(ours, sd[k].numpy()), f"{k} is not torchvision's"
            taken += 1
        assert taken == 60, taken  # every conv and BN weight and bias of ResNet-18

    # Without --init-from the same run has its own initial weights (the check above can fail).
    fresh = os.path.join(d, "fresh")
    run(BIN, "train", "--model", "resnet18", *COMMON, "--steps", "1", "--lr", "0", "--ckpt-dir", fresh)
    with h5py.File(os.path.join(fresh, "ckpt-00000001.h5"), "r") as f:
        assert not np.array_equal(f["model"]["conv1.weight"][...], sd["conv1.weight"].numpy())

    # A resume continues its own checkpoint; --init-from is not applied again.
    out = run(BIN, "train", "--model", "resnet18", *COMMON, "--steps", "2", "--lr", "0",
              "--ckpt-dir", ft, "--init-from", imported, "--resume", "auto")
    assert "resumed from" in out and "tensors loaded" not in out, "a resumed run re-initialized"

    # Files that do not fit: one error line, exit 1, no traceback or crash.
    for bad, why in [(os.path.join(d, "none.h5"), "does not exist"), (pt, "not an HDF5 file")]:
        out = run(BIN, "train", "--model", "resnet18", *COMMON, "--steps", "1",
                  "--ckpt-dir", os.path.join(d, "bad"), "--new-run", "--init-from", bad, expect=1)
        assert why in out, out
print("OK")
