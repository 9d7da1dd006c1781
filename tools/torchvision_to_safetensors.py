#!/usr/bin/env python3
"""Converts a torchvision ResNet's weights into a safetensors file loom reads.

loom's ResNets (examples/models.c) carry torchvision's state_dict names
(conv1.weight, layer1.0.bn1.running_var, layer2.0.downsample.0.weight,
fc.bias, ...), so the conversion is only a change of container:

  tools/torchvision_to_safetensors.py resnet18 resnet18.safetensors --pretrained
  tools/torchvision_to_safetensors.py resnet18 r18.safetensors --from resnet18-f37072fd.pth
  tools/torchvision_to_safetensors.py resnet18 r18.safetensors          (random init)

  --pretrained  torchvision's ImageNet weights (IMAGENET1K_V1; downloads them
                into ~/.cache/torch once: needs the network)
  --from FILE   a state_dict saved with torch.save (e.g. torchvision's .pth)
  neither       torchvision's own random initialisation (to check names)

Then, in loom:
  resnet50_synthetic --depth 18 --size 224 --init-from resnet18.safetensors
      (the ImageNet model: every tensor loads, strict)
  cifar_ddp --init-from resnet18.safetensors --reinit conv1,fc
      (fine-tuning on CIFAR-10: loom's CIFAR stem is a 3x3 conv1 and the
       head has 10 classes, so both start from loom's initialisation)
  tools/torch_golden.py-style check: `check FILE` below loads loom's export
  back into torchvision's model (strict) and prints its logits.

PyTorch, torchvision and safetensors from PyPI; never part of loom's build.
"""
import argparse
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file


def build(arch, pretrained):
    ctor = getattr(torchvision.models, arch)
    return ctor(weights="IMAGENET1K_V1" if pretrained else None)


def convert(a):
    torch.manual_seed(a.seed)
    model = build(a.arch, a.pretrained)
    if a.source:
        state = torch.load(a.source, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, a.out, metadata={"format": "pt", "producer":
                                      f"tools/torchvision_to_safetensors.py, torchvision "
                                      f"{torchvision.__version__} {a.arch}"})
    if a.keys:
        with open(a.keys, "w") as f:
            for k, v in state.items():
                dt = {torch.float32: "F32", torch.int64: "I64"}[v.dtype]
                f.write(f"{k} {dt} {' '.join(str(d) for d in v.shape)}".rstrip() + "\n")
    n = sum(v.numel() for k, v in state.items() if not k.endswith("num_batches_tracked"))
    print(f"wrote {a.out}: {a.arch}, {len(state)} tensors, {n} values"
          f"{' (ImageNet weights)' if a.pretrained else ' (from ' + a.source + ')' if a.source else ' (random init)'}")


def check(a):
    model = build(a.arch, False)
    model.load_state_dict(load_file(a.out), strict=True)
    model.eval()
    torch.manual_seed(1)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        y = model(x)
    print(f"{a.out}: loaded into torchvision's {a.arch} (strict); logits[0][:5] on a random "
          f"batch: {[round(v, 5) for v in y[0][:5].tolist()]}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", choices=["resnet18", "resnet34", "resnet50"])
    p.add_argument("out", help="the .safetensors file (written, or read by --check)")
    p.add_argument("--pretrained", action="store_true")
    p.add_argument("--from", dest="source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keys", metavar="TXT",
                   help="also write 'name dtype shape' per state_dict entry (the list "
                        "tests/e2e/test_torchvision_names compares loom's export with)")
    p.add_argument("--check", action="store_true",
                   help="load OUT (e.g. loom's --export) into torchvision's model instead")
    a = p.parse_args()
    if a.pretrained and a.source:
        sys.exit("torchvision_to_safetensors: --pretrained or --from, not both")
    check(a) if a.check else convert(a)


if __name__ == "__main__":
    main()
