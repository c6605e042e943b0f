"""The plain twin of a gpt-<size> run (``bench run --reference``): the plainest PyTorch loop that trains the same
GPT (backends/models/gpt.py, the model definition the harness trains) on the same random token sequences, at the
same precision, batch and compile setting, on one device, with the same warm-up, settle step and windows. No harness
code: torch, the model definition and the step and windows of loop.py beside it, so a reader can check it line by
line. The harness compares every world-size-1 run of the same configuration with it (docs/close-to-the-machine.md).

    PYTHONPATH=. python bench/twins/gpt.py SETTINGS.json OUT.json

SETTINGS.json holds plain values (model shape as gpt = [layers, width, heads, vocabulary], seq_len, batch, precision,
compile, device, threads, seed, warmup, settle, steps, windows); OUT.json gets each window's wall and CPU time.
"""
import json
import sys

import torch
import torch.nn.functional as F

from backends.models.gpt import GPT
from bench.twins import loop


def setup(c):
    """The model, its optimizer and the one fixed batch: the same values the harness's rank 0 trains on."""
    device = torch.device("cuda", 0) if c["device"] == "cuda" else torch.device("cpu")
    layers, width, heads, vocab = c["gpt"]
    torch.manual_seed(c["seed"])
    model = GPT(layers, width, heads, vocab, c["seq_len"]).to(device)
    gen = torch.Generator().manual_seed(1000)  # rank 0's batch: 1000 + rank
    tokens = torch.randint(0, vocab, (c["batch"], c["seq_len"] + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)  # next-token targets
    impl = c.get("optimizer_impl") or "fused"  # fused, as torchtitan runs it, unless --optimizer-impl foreach
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=impl == "fused" or None, foreach=impl == "foreach" or None)
    return model, optimizer, x, y, device


def main(settings, out_path):
    c = json.load(open(settings))
    torch.set_num_threads(c["threads"])
    model, optimizer, x, y, device = setup(c)

    def loss_of(net):
        logits = net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))  # next-token loss

    loop.run(c, model, optimizer, loss_of, device, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
