"""PyTorch reference definitions of the models spotrain trains, for side-by-side benchmarks
and weight-interop checks. Parameter names match torchvision (and so spotrain checkpoints):
`conv1.weight`, `layer1.0.conv1.weight`, `layer2.0.downsample.0.weight`, `fc.weight`, ...

    from torch_models import build
    model = build("resnet20", num_classes=10, in_channels=1)
"""

import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock

__all__ = ["ResNet20", "build", "MODELS"]


def _init_weights(module):
    """torchvision's ResNet init: Kaiming normal (fan_out, relu) for convs, BN weight 1 bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


class ResNet20(nn.Module):
    """Small-input ResNet (CIFAR-style) for 28x28 / 32x32 data: 3x3 stem, no max-pool,
    three stages of 3 BasicBlocks (widths 16, 32, 64; strides 1, 2, 2), global average
    pool, Linear(64, num_classes). Shortcut is 1x1 conv + BN where the shape changes."""

    def __init__(self, num_classes=10, in_channels=3, blocks_per_stage=3, widths=(16, 32, 64)):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(in_channels, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(widths[0], blocks_per_stage, stride=1)
        self.layer2 = self._make_layer(widths[1], blocks_per_stage, stride=2)
        self.layer3 = self._make_layer(widths[2], blocks_per_stage, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[2], num_classes)
        _init_weights(self)

    def _make_layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        for _ in range(1, blocks):
            layers.append(BasicBlock(planes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = self.avgpool(x).flatten(1)
        return self.fc(x)


def _torchvision(fn):
    def make(num_classes, in_channels):
        model = fn(num_classes=num_classes)
        if in_channels != 3:
            old = model.conv1
            model.conv1 = nn.Conv2d(in_channels, old.out_channels, kernel_size=old.kernel_size,
                                    stride=old.stride, padding=old.padding, bias=False)
            nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        return model
    return make


MODELS = {
    "resnet18": _torchvision(torchvision.models.resnet18),
    "resnet34": _torchvision(torchvision.models.resnet34),
    "resnet50": _torchvision(torchvision.models.resnet50),
    "resnet101": _torchvision(torchvision.models.resnet101),
    "resnet152": _torchvision(torchvision.models.resnet152),
    "resnet20": lambda num_classes, in_channels: ResNet20(num_classes, in_channels),
}


def build(name, num_classes=1000, in_channels=3):
    """Return a freshly initialised model by spotrain's name for it."""
    try:
        make = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(sorted(MODELS))}") from None
    return make(num_classes, in_channels)


if __name__ == "__main__":
    import sys
    m = build(sys.argv[1] if len(sys.argv) > 1 else "resnet20", 10, 1)
    n = sum(p.numel() for p in m.parameters())
    print(f"{type(m).__name__}: {n} parameters")
    for k, v in m.state_dict().items():
        print(f"  {k} {tuple(v.shape)}")
