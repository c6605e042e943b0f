"""The plain twin of a vision run (``bench run --reference``): the plainest PyTorch loop that trains the same
torchvision model as the harness, at the same precision, batch, memory format and compile setting, on the same
synthetic batch, on one device, with the same warm-up, settle step and windows. No harness code: torch,
torchvision and the step and windows of loop.py beside it, so a reader can check it line by line. The harness compares every world-size-1 run of the same
configuration with it (docs/close-to-the-machine.md).

    PYTHONPATH=. python bench/twins/vision.py SETTINGS.json OUT.json

SETTINGS.json holds plain values (model, image_size, batch, precision, channels_last, compile, device, threads,
seed, warmup, settle, steps, windows); OUT.json gets each window's wall and CPU time.
"""
import json
import sys

import torch
import torch.nn.functional as F
import torchvision

from bench.twins import loop


def setup(c):
    """The model, its optimizer and the one fixed batch: the same values the harness's rank 0 trains on."""
    device = torch.device("cuda", 0) if c["device"] == "cuda" else torch.device("cpu")
    torch.manual_seed(c["seed"])
    extra = {"aux_logits": False} if c["model"] in ("googlenet", "inception_v3") else {}
    model = torchvision.models.get_model(c["model"], weights=None, num_classes=1000, **extra)
    if c["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    model = model.to(device)
    gen = torch.Generator().manual_seed(1000)  # rank 0's batch: 1000 + rank
    x = torch.randn(c["batch"], 3, c["image_size"], c["image_size"], generator=gen).to(device)
    y = torch.randint(0, 1000, (c["batch"],), generator=gen).to(device)
    if c["channels_last"]:
        x = x.contiguous(memory_format=torch.channels_last)
    impl = c.get("optimizer_impl") or "fused"  # fused, as torchtitan runs it, unless --optimizer-impl foreach
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4,
                                fused=impl == "fused" or None, foreach=impl == "foreach" or None)
    return model, optimizer, x, y, device


def main(settings, out_path):
    c = json.load(open(settings))
    torch.set_num_threads(c["threads"])
    if c["device"] == "cuda":
        torch.backends.cudnn.benchmark = bool(c["cudnn_benchmark"])
    model, optimizer, x, y, device = setup(c)
    loop.run(c, model, optimizer, lambda net: F.cross_entropy(net(x), y), device, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
