"""What the PyTorch interop tests (test_torch_interop.py, test_finetune.py) share: they skip
(exit 77) without torch, torchvision, h5py or numpy; their arguments (SPOTRAIN_BIN SCRIPTS_DIR);
and run(), which runs a command, prints its output and ends the test when it exits otherwise."""
import os
import subprocess
import sys

try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)

BIN, SCRIPTS = sys.argv[1], sys.argv[2]
INTEROP = os.path.join(SCRIPTS, "torch_interop.py")


def run(*cmd, expect=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    if r.returncode != expect:
        print(f"FAILED (exit {r.returncode}, expected {expect}): {' '.join(cmd)}")
        sys.exit(1)
    return r.stdout
