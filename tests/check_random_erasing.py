#!/usr/bin/env python3
"""Replays spotrain's random-erasing draws through torchvision's own RandomErasing.

Each case holds the image size, the options and the draws spotrain made, in order, with the
box it chose. torchvision's RandomErasing runs on an image of ones with its random calls
(torch.rand, torch.empty().uniform_, torch.randint) answered from that list; the test fails
unless torchvision asks for the same draws, in the same order, over the same ranges, and
erases the same box.
"""
import json
import sys

import numpy as np
import torch
import torchvision.transforms.transforms as T


class Replay:
    """Stands in for the torch module inside torchvision.transforms.transforms."""

    def __init__(self, events):
        self.events = list(events)

    def _next(self, kind):
        assert self.events, f"torchvision asked for a {kind} draw that spotrain did not make"
        e = self.events.pop(0)
        assert e["kind"] == kind, f"torchvision asked for {kind}, spotrain drew {e['kind']}"
        return e

    def rand(self, *size, **kw):
        e = self._next("uniform")
        assert (e["lo"], e["hi"]) == (0.0, 1.0), e
        return torch.tensor([e["value"]], dtype=torch.float32)

    def empty(self, *size, **kw):
        replay = self

        class Uniform:
            def uniform_(self, lo, hi):
                e = replay._next("uniform")
                # the same range, up to the last bit of float32 log()
                assert np.isclose(float(lo), e["lo"], rtol=1e-6, atol=1e-7) and \
                    np.isclose(float(hi), e["hi"], rtol=1e-6, atol=1e-7), (lo, hi, e)
                return torch.tensor([e["value"]], dtype=torch.float32)

        return Uniform()

    def randint(self, low, high, size=None, **kw):
        e = self._next("randint")
        assert low == 0 and high == e["n"], (low, high, e)
        return torch.tensor([e["value"]])

    def __getattr__(self, name):
        return getattr(torch, name)


def main(path):
    cases = json.load(open(path))
    real = T.torch
    for i, c in enumerate(cases):
        replay = Replay(c["events"])
        T.torch = replay
        try:
            t = T.RandomErasing(p=c["p"], scale=tuple(c["scale"]), ratio=tuple(c["ratio"]), value=0)
            img = real.ones(3, c["h"], c["w"])
            out = t(img)
        finally:
            T.torch = real
        assert not replay.events, f"case {i}: spotrain made draws torchvision did not ask for: {replay.events}"
        zero = (out == 0).all(dim=0).nonzero()
        if c["box"] is None:
            assert zero.numel() == 0, f"case {i}: torchvision erased, spotrain did not"
            continue
        top, left, h, w = c["box"]
        assert zero.numel() > 0, f"case {i}: spotrain erased {c['box']}, torchvision nothing"
        got = [int(zero[:, 0].min()), int(zero[:, 1].min()),
               int(zero[:, 0].max() - zero[:, 0].min() + 1), int(zero[:, 1].max() - zero[:, 1].min() + 1)]
        assert got == [top, left, h, w], f"case {i}: torchvision erased {got}, spotrain {c['box']}"
        assert int((out == 0).sum()) == 3 * h * w, f"case {i}: not one box"
    print(f"{len(cases)} cases agree with torchvision {__import__('torchvision').__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
