"""DeepSpeed's plain engine loop at world size 1 (``bench run --reference`` beside ds_zero1/2/3): ``deepspeed.initialize``
with the run's DeepSpeed config (the settings file holds it, as a DeepSpeed script reads its ds_config.json), then
``engine(x)``, ``engine.backward(loss)``, ``engine.step()`` each step. Named ds_zero.py, not deepspeed.py: the twin runs
as a script, and its directory comes first on the import path. No harness code: torch and deepspeed only."""
import os

import torch

from bench.twins import ddp


def wrap(c, model, optimizer, device):
    """The engine (called like the model), its optimizer, no autocast of the loop's own (the engine's config has it),
    and the engine's step, its loss under the engine's autocast dtype (as the backend computes it, and single)."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    if device.type == "cpu":  # before deepspeed is imported: its CPU accelerator, and torch's own CUDA check (import
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # deepspeed sets the NVML one, which reloads libnvidia-ml
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "0")  # at every is_available() where there is none)
    import deepspeed

    if device.type == "cpu":  # not its shared-memory collective, which only inference uses (compiled at first use)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    ddp.init(device)
    if c["channels_last"]:
        model = model.to(memory_format=torch.contiguous_format)  # DeepSpeed views each parameter as bytes
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=c["loop"]["config"],
                                                   dist_init_required=False)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"])
    cast = half if c["loop"]["config"].get(c["precision"], {}).get("enabled") else None  # fp16/bf16 sections
    autocast = c["loop"]["config"]["torch_autocast"]["enabled"]  # the loss under it too, as the backend computes it

    def net(x):
        out = engine(x.to(cast) if cast is not None and x.is_floating_point() else x)
        return out if autocast else out.float()

    def step(loss_of):
        with torch.autocast(device.type, dtype=half, enabled=autocast):
            loss = loss_of(net)
        engine.backward(loss)
        engine.step()  # the optimizer step and zero_grad

    return net, optimizer, False, step
