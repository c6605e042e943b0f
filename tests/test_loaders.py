"""Every loader (bench/loaders) on a generated JPEG tree: shards, corrupt and odd images, empty classes,
symlinks, flat val/, the loader ceiling and the report's input-bound section. GPU decode paths are marked gpu."""
import argparse
import json
import os
import random

import pytest
import torch
from PIL import Image

from bench.commands import report
from bench.core import results
from bench.rank import data, folders, loaders
from bench.rank.loaders import tv
from tests.conftest import bench_inproc, cli_error, records, skip_without
from tests.fake_gpu import FakeGpuMachine

CLASSES = ("n01440764", "n01443537", "n01484850")
EMPTY, LINKED = "n09999999", "n05555555"
SMALL = ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--workers", "0",
         "--warmup", "2", "--steps", "2", "--windows", "2"]
N_FILES = 35  # 3 x 8 RGB + gray, CMYK, palette PNG, tiny, large, corrupt + 4 in a symlinked folder + 1 symlinked file


RNG = random.Random(0)


def jpeg(path, mode="RGB", size=(48, 40), rng=RNG):
    bands = {"RGB": 3, "L": 1, "CMYK": 4, "P": 1}[mode]
    Image.frombytes(mode, size, rng.randbytes(size[0] * size[1] * bands)).save(path)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    train = root / "train"
    for c in CLASSES:
        (train / c).mkdir(parents=True)
        for i in range(8):
            jpeg(train / c / f"{c}_{i}.JPEG")
    jpeg(train / CLASSES[0] / "gray.JPEG", "L")
    jpeg(train / CLASSES[1] / "cmyk.JPEG", "CMYK")
    jpeg(train / CLASSES[2] / "palette.png", "P")
    jpeg(train / CLASSES[0] / "tiny.JPEG", size=(2, 2))
    Image.new("RGB", (1600, 1200), (200, 30, 90)).save(train / CLASSES[1] / "large.JPEG")
    (train / CLASSES[2] / "corrupt.JPEG").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (train / EMPTY).mkdir()
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    for i in range(4):
        jpeg(elsewhere / f"linked_{i}.JPEG")
    os.symlink(elsewhere, train / LINKED)
    jpeg(root / "single.JPEG")
    os.symlink(root / "single.JPEG", train / CLASSES[0] / "symlinked.JPEG")
    val = root / "val"
    val.mkdir()
    lines = ["ImageId,PredictionString"]
    for i, c in enumerate(CLASSES + CLASSES):
        jpeg(val / f"ILSVRC2012_val_{i:08d}.JPEG")
        lines.append(f"ILSVRC2012_val_{i:08d},{c} 10 20 30 40 {c} 1 2 3 4")
    jpeg(val / "ILSVRC2012_val_99999999.JPEG")  # no label: left out
    (root / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.mutation
def test_scan_follows_symlinks_and_skips_empty_classes(tree):
    classes, samples, empty = folders.scan(tree / "train")
    assert classes == sorted(CLASSES + (EMPTY, LINKED)) and empty == [EMPTY]
    assert len(samples) == N_FILES == data.check_imagenet(str(tree), 4)
    assert sum(p.endswith("symlinked.JPEG") for p, _ in samples) == 1
    assert [c for p, c in samples if "linked_" in p] == [classes.index(LINKED)] * 4  # labels of the full set


def sources(tree, name, decode="cpu", world=1, batch=4):
    return [loaders.build(name, decode, str(tree), 32, batch, 0, r, world, distributed=world > 1,
                          device=torch.device("cpu")) for r in range(world)]


def read_epoch(source, n):
    """(sample indices this rank read in epoch n, batches as read), through the loader's own epoch loop (``epoch(n)``:
    the torchvision loader's set_epoch is what reshuffles, so the test must not call it itself)."""
    got, batches = [], []
    if hasattr(source, "loader"):  # torchvision: the samples the dataset is asked for (recorded, not decoded)
        dataset = source.loader.dataset
        index = {path: i for i, (path, _) in enumerate(dataset.samples)}
        dataset.load = lambda path: (got.append(index[path]), torch.zeros(3, 32, 32))[1]
    for batch in source.epoch(n):
        if not hasattr(source, "loader"):  # DALI says which samples made the batch
            got += source.last_indices
        batches.append(batch)
    return got, batches


@pytest.mark.mutation
@pytest.mark.parametrize("name", loaders.LOADERS)
def test_each_rank_reads_a_disjoint_shard_and_the_shards_cover_the_set(tree, name):
    if name == "dali":
        skip_without("dali")
    # torchvision: 18 samples a rank (35 padded to 36), read in full batches of 3 with nothing dropped
    ranks = sources(tree, name, world=2, batch=3 if name == "torchvision" else 4)
    n = N_FILES if name == "torchvision" else N_FILES - 1  # DALI's list is pre-filtered (the corrupt file)
    orders = []
    for epoch in (0, 1):
        shards = [set(read_epoch(s, epoch)[0]) for s in ranks]
        # DistributedSampler pads the epoch to a multiple of the ranks by repeating samples; DALI's shards never meet
        padding = -n % 2 if name == "torchvision" else 0
        assert len(shards[0] & shards[1]) == padding and shards[0] | shards[1] == set(range(n)), (epoch, shards)
        orders.append(shards[0])
    assert orders[0] != orders[1]  # reshuffled every epoch, the same way on every rank


@pytest.mark.mutation
def test_the_torchvision_source_pins_memory_for_a_gpu_and_passes_rank_and_seed_on(tree, monkeypatch):
    """Built, never iterated (no GPU needed): pinned host memory only for CPU decode into a GPU; ``--decode gpu`` reads
    bytes and lets the GPU decode, counting what nvJPEG refused with what the workers skipped."""
    from torch.utils.data import DistributedSampler

    def source(device, decode=None, **kw):
        args = (str(tree), 32, 3, 0, 1, 2, True, torch.device(device))
        return loaders.tv.TorchvisionSource(*args, **kw) if decode is None else loaders.tv.TorchvisionSource(
            *args, decode, **kw)

    gpu_cpu_decode = source("cuda", seed=3)
    assert gpu_cpu_decode.loader.pin_memory is True and gpu_cpu_decode.decode == "cpu"  # the default decode
    s = gpu_cpu_decode.loader.sampler
    assert type(s) is DistributedSampler and (s.rank, s.num_replicas, s.seed) == (1, 2, 3)
    assert source("cpu").loader.pin_memory is False and source("cpu").loader.sampler.seed == 0
    gpu_decode = source("cuda", "gpu")
    assert gpu_decode.loader.pin_memory is False and gpu_decode.loader.collate_fn is loaders.tv.collate_encoded
    assert isinstance(gpu_decode.loader.dataset.load, loaders.tv.ReadForGpu)
    assert isinstance(source("cpu", "cpu").loader.dataset.load, loaders.tv.PilTransform)
    assert gpu_decode.empty_classes == [EMPTY]
    cpu_gpu = source("cpu", "gpu")
    cpu_gpu.loader.dataset.load = lambda path: torch.zeros(3, dtype=torch.uint8)  # "encoded" bytes, never decoded
    monkeypatch.setattr(loaders.tv, "decode_and_augment", lambda items, size, device: (torch.zeros(len(items), 3), 2))
    batch = next(cpu_gpu.epoch(0))
    assert batch[2] == 2  # nothing skipped by the workers, 2 refused by the decoder


@pytest.mark.mutation
@pytest.mark.parametrize("name,decode", [("torchvision", "cpu"), ("torchvision", "gpu"), ("dali", "cpu")])
def test_every_loader_reads_odd_images_skips_corrupt_ones_and_keeps_batches_full(tree, name, decode, capfd):
    """torchvision's gpu path runs here with decode_jpeg on the CPU device: the same code the GPU runs."""
    if name == "dali":
        skip_without("dali")
    if name == "torchvision" and decode == "gpu":
        source = loaders.tv.TorchvisionSource(str(tree), 32, 4, 0, 0, 1, False, torch.device("cpu"), "gpu")
    else:
        (source,) = sources(tree, name)
    timed = data.TimedBatches(source, torch.device("cpu"))
    seen = 0
    while timed.epoch == 0:
        images, targets = next(timed)
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and torch.isfinite(images).all()
        assert targets.shape == (4,) and targets.dtype == torch.int64
        seen += 4
    assert seen >= N_FILES - 4 and timed.skipped == 1 and timed.empty_classes == 1
    assert timed.wait_seconds > 0
    err = capfd.readouterr().err
    assert "warning: skipping unreadable image" in err and "corrupt.JPEG" in err


@pytest.mark.mutation
def test_gray_cmyk_palette_tiny_and_large_images_come_out_rgb(tree):
    ds = data.SkippingImageFolder(tree / "train", load=loaders.tv.ReadForGpu())
    kinds = {os.path.basename(p): ds[i][0] for i, (p, _) in enumerate(ds.samples)
             if os.path.basename(p) in ("gray.JPEG", "cmyk.JPEG", "palette.png", "tiny.JPEG", "large.JPEG")}
    assert kinds["gray.JPEG"].dim() == 1 and kinds["large.JPEG"].dim() == 1  # nvJPEG decodes these (with mode RGB)
    assert kinds["cmyk.JPEG"].shape == (3, 40, 48) and kinds["palette.png"].shape == (3, 40, 48)  # decoded here
    images, refused = loaders.tv.decode_and_augment(list(kinds.values()), 32, torch.device("cpu"))
    assert images.shape == (5, 3, 32, 32) and refused == 0


@pytest.mark.mutation
def test_a_jpeg_the_gpu_decoder_refuses_is_replaced_within_its_batch_and_counted(tree, monkeypatch, capfd):
    import torchvision.io

    real = torchvision.io.decode_jpeg
    bad = torch.frombuffer(bytearray(b"\xff\xd8 broken past a good header"), dtype=torch.uint8)

    def decode(data, **kw):
        items = data if isinstance(data, list) else [data]
        if any(t is bad for t in items):
            raise RuntimeError("nvjpeg: bitstream error")
        return real(data, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", decode)
    ds = data.SkippingImageFolder(tree / "train", load=loaders.tv.ReadForGpu())
    good = [ds[i][0] for i in range(3)]
    images, refused = loaders.tv.decode_and_augment([good[0], bad, good[1], good[2]], 32, torch.device("cpu"))
    assert images.shape == (4, 3, 32, 32) and refused == 1 and torch.isfinite(images).all()
    assert "warning: skipping image the GPU decoder refused: nvjpeg: bitstream error" in capfd.readouterr().err


@pytest.mark.mutation
@pytest.mark.parametrize("labels", ["LOC_val_solution.csv", "val.txt"])
def test_flat_val_with_a_labels_file(tree, tmp_path, labels):
    root = tree
    if labels == "val.txt":  # the same set as "filename label" lines, labels as wnids and as indices
        root = tmp_path / "copy"
        root.mkdir()
        os.symlink(tree / "train", root / "train")
        os.symlink(tree / "val", root / "val")
        classes = folders.class_dirs(tree / "train")
        (root / "val.txt").write_text("".join(
            f"ILSVRC2012_val_{i:08d}.JPEG {c if i % 2 else classes.index(c)}\n" for i, c in enumerate(CLASSES * 2)))
    samples, layout = folders.val_samples(root)
    classes = folders.class_dirs(tree / "train")
    assert layout == f"flat with {labels} (1 images without a label left out)"
    assert [c for _, c in samples] == [classes.index(c) for c in CLASSES * 2]
    data.check_eval(str(root))
    ds = data.ValFolder(str(root), 32)
    assert len(ds) == 6 and ds[0][0].shape == (3, 32, 32) and ds[0][1] == classes.index(CLASSES[0])


@pytest.mark.slow
def test_dali_ddp_run_with_eval_on_flat_val_records_loader_empty_classes_and_skips(tree, results_dir):
    skip_without("dali")
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *SMALL, "--data", "imagenet", "--data-dir", tree,
                        "--loader", "dali", "--eval", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert (rec["loader"], rec["decode"], rec["empty_classes"]) == ("dali", "cpu", 1)
    assert rec["loader_info"]["shuffle"] == "file list shuffled once (seeded), then random_shuffle"
    assert rec["corrupt_images_skipped"] == 1  # pre-filtered once, counted by the rank whose share it was in
    assert rec["eval_samples"] == 6 and rec["replicas_consistent"] is True
    assert all(0 < w <= t for w, t in zip(rec["data_wait_seconds"], rec["window_seconds"]))
    assert proc.stderr.count(f"empty class folder(s) in {tree / 'train'} skipped (labels unchanged): {EMPTY}") == 1
    key = dict(zip(results.CONFIG_KEYS, results.config_key(rec)))
    assert (key["loader"], key["decode"]) == ("dali", "cpu")


@pytest.mark.slow  # bench loader --ranks 2 starts its ranks as processes (spawn: each imports torch, and DALI), as a run does
def test_loader_ceiling_for_every_loader_and_the_input_bound_report(tree, tmp_path, capsys):
    skip_without("dali")  # every loader, DALI included
    raw = tmp_path / "raw"
    proc = bench_inproc("loader", "--data-dir", tree, "--workers", 0, "--batch-size", 4, "--image-size", 32, "--batches", 3,
                        "--warmup-batches", 1, "--ranks", 2, "--results", raw)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[1].strip() for ln in lines[:4]] == ["torchvision decode cpu", "torchvision decode gpu",
                                                               "dali decode cpu", "dali decode gpu"]
    assert "img/s with 0 workers per rank, 2 rank(s)" in lines[0] and "img/s with 0 workers" in lines[2]
    assert "skipped: --decode gpu decodes on a CUDA device" in lines[1]
    (path,) = (raw / "loader").glob("*.json")
    rec = json.loads(path.read_text())
    ok = {(r["loader"], r["decode"]): r for r in rec["results"] if r["status"] == "ok"}
    assert set(ok) == {("torchvision", "cpu"), ("dali", "cpu")} and rec["ranks"] == 2
    for r in ok.values():
        assert len(r["per_rank_img_s"]) == 2 and r["node_img_s"] > 0 and r["empty_classes"] == 1
    # a real-data run that waited for input most of its time, and the same configuration on synthetic data
    from tests.test_report import make

    real = make("ddp", 2, 50.0, device="cpu", data="imagenet", loader="torchvision", decode="cpu", image_size=32,
                batch_per_device=4)
    real["data_wait_seconds"] = [0.6 * s for s in real["window_seconds"]]
    synthetic = make("ddp", 2, 400.0, device="cpu", image_size=32, batch_per_device=4)
    for r in (real, synthetic):
        r["env"]["cpu_model"] = rec["hardware"].removeprefix("CPU: ")  # the same machine as the loader record
        results.save(r, raw)
    out = tmp_path / "report"
    assert report.cmd_report(argparse.Namespace(results=str(raw), out=str(out))) == 0
    md = (out / "REPORT.md").read_text()
    section = md[md.index("## Input bound"):]
    assert "| ddp | 2 | resnet50 32px b4 | torchvision / decode cpu | 60.0 % | 50.0 img/s | 400.0 img/s | " in section
    best = max(ok, key=lambda k: ok[k]["node_img_s"])
    assert f"the faster loader here is **{best[0]}** (decode cpu, {ok[best]['node_img_s']:,.1f} img/s" in section
    assert "Files not read" not in md  # the loader record lives in RESULTS/loader/: no reader trips over it


@pytest.mark.mutation
@pytest.mark.parametrize("args,message", [
    (["--data", "imagenet", "--decode", "gpu"], ("--decode gpu decodes on a CUDA device (nvJPEG); this run is on "
                                                 "cpu: use --decode cpu")),
    (["--data", "imagenet", "--loader", "ffcv"], "--loader 'ffcv': unknown loader; choose from torchvision, dali"),
    (["--data", "imagenet", "--decode", "npu"], "--decode 'npu': unknown decode; choose from cpu, gpu"),
    (["--loader", "dali"], "--loader and --decode are for --data imagenet; synthetic data is a fixed batch on the device"),
])
def test_bad_loader_flags(tree, tmp_path, capsys, args, message):
    extra = ["--data-dir", str(tree)] if "imagenet" in args else []
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *SMALL, *args, *extra,
                          "--results", tmp_path / "raw")
    assert code == 2 and err.strip().splitlines() == [f"bench: error: {message}"], err


@pytest.mark.mutation
def test_bench_loader_bad_choice(tree, capsys):
    code, err = cli_error(capsys, "loader", "--data-dir", tree, "--loaders", "ffcv")
    assert code == 2 and err == "bench: error: --loaders 'ffcv': unknown loader ffcv; choose from torchvision, dali or all\n"


@pytest.mark.mutation
def test_missing_dali_skips_the_run_with_the_fix(monkeypatch, tmp_path):
    import importlib.util

    import backends
    from bench import launch
    from bench.plan.sweep import loader_unavailable
    from bench.core.config import RunConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n.startswith("nvidia") else real(n, *a))
    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=4, warmup=2, steps=2, windows=2, data="imagenet", data_dir="x",
                    loader="dali").validate()
    why = "NVIDIA DALI is not installed (pip install nvidia-dali-cuda130 (make install does, on Linux x86_64 and aarch64))"
    assert loader_unavailable(cfg) == why  # the planner asks the loader registry, before the backend
    rec = launch.run_one(cfg, tmp_path, {}, backends.create("ddp"), unavailable=loader_unavailable(cfg))
    assert (rec["status"], rec["reason"]) == ("skipped", why) and not (tmp_path / "logs").exists()  # nothing launched
    assert loaders.unavailable("torchvision") is None


# ---------------------------------------------------------------------------------------------------
# The torchvision loader's sampler and its replacement of unreadable images, in process

@pytest.mark.mutation
def test_the_torchvision_loader_shards_shuffles_by_seed_and_keeps_batches_full():
    from torch.utils.data import DistributedSampler, RandomSampler, TensorDataset

    ds = TensorDataset(torch.arange(11))
    loader = tv.data_loader(ds, 3, 0, rank=1, world_size=2, distributed=True, pin_memory=False, seed=4)
    s = loader.sampler
    assert type(s) is DistributedSampler and (s.num_replicas, s.rank, s.shuffle, s.seed) == (2, 1, True, 4)
    assert loader.batch_size == 3 and loader.drop_last is True and loader.num_workers == 0
    assert loader.persistent_workers is False and loader.pin_memory is False
    assert [len(b[0]) for b in loader] == [3, 3]  # 6 of the padded 12 go to rank 1: two full batches, none short
    whole = tv.data_loader(ds, 4, 0, rank=0, world_size=1, distributed=False, pin_memory=False, seed=4,
                           collate_fn=lambda items: [int(i[0]) for i in items])
    assert type(whole.sampler) is RandomSampler
    first = [x for batch in whole for x in batch]
    assert len(first) == 8 and len(set(first)) == 8  # 11 // 4 full batches
    again = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=4, collate_fn=lambda items: [int(i[0]) for i in items])
    other = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=5, collate_fn=lambda items: [int(i[0]) for i in items])
    assert [x for b in again for x in b] == first != [x for b in other for x in b]  # the seed decides the order
    assert [x for b in whole for x in b] != first  # the next epoch draws another order
    default = tv.data_loader(ds, 4, 0, 0, 1, False, False, collate_fn=lambda items: [int(i[0]) for i in items])
    seeded = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=0, collate_fn=lambda items: [int(i[0]) for i in items])
    assert [x for b in default for x in b] == [x for b in seeded for x in b]  # the default seed is 0
    workers = tv.data_loader(ds, 4, 1, 0, 2, True, True)  # built, never iterated: no process starts
    assert (workers.num_workers, workers.persistent_workers, workers.pin_memory) == (1, True, True)
    assert workers.sampler.seed == 0


@pytest.mark.mutation
def test_skipping_image_folder_replaces_unreadable_images_and_counts_them(tmp_path):
    from bench.core.errors import UsageError

    (tmp_path / "n0").mkdir()
    for i in range(4):
        (tmp_path / "n0" / f"{i}.JPEG").write_bytes(b"")
    tried = []

    def load(path):
        tried.append(path)
        assert len(tried) <= 8, "kept trying past every sample"
        if path.endswith(("0.JPEG", "1.JPEG")) or bad_everywhere:
            raise OSError("unreadable")
        return path

    bad_everywhere = False
    ds = tv.SkippingImageFolder(tmp_path, load=load)
    assert ds[0] == (str(tmp_path / "n0" / "2.JPEG"), 0, 2)  # two unreadable ones skipped, counted
    assert ds[3] == (str(tmp_path / "n0" / "3.JPEG"), 0, 0)
    bad_everywhere, tried[:] = True, []
    with pytest.raises(UsageError) as e:
        ds[1]
    assert str(e.value) == f"no readable image in {tmp_path}" and len(tried) == 4


# ---------------------------------------------------------------------------------------------------
# GPU decode: nvJPEG through torchvision, DALI's mixed decoder

@pytest.mark.parametrize("name", loaders.LOADERS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_decode_batches_are_on_the_gpu_and_full(tree, name):
    if name == "dali":
        skip_without("dali")
    source = loaders.build(name, "gpu", str(tree), 32, 4, 1, 0, 1, distributed=False, device=torch.device("cuda:0"))
    timed = data.TimedBatches(source, torch.device("cuda:0"))
    while timed.epoch == 0:
        images, _ = next(timed)
        assert images.shape == (4, 3, 32, 32) and images.device.type == "cuda" and torch.isfinite(images).all()
    assert timed.skipped == 1 and timed.empty_classes == 1


@pytest.mark.gpu
@pytest.mark.parametrize("loader", loaders.LOADERS)
def test_gpu_decode_run(gpu_plan, loader):
    """A run decoding on the GPU (the GPU check's decode-<loader> launch, on a folder of JPEGs the plan made)."""
    if loader == "dali":
        skip_without("dali")
    rec = gpu_plan.record(f"decode-{loader}", "single")
    assert (rec["loader"], rec["decode"], rec["device_type"]) == (loader, "gpu", "cuda")


# ---------------------------------------------------------------------------------------------------
# DALI's shuffle and copy, DALI's build, bench loader's device, the GPU decoder, real-data memory

@pytest.mark.mutation
def test_dali_reader_is_shuffled_from_the_first_batch_and_every_rank_sees_every_class(tree):
    skip_without("dali")
    from bench.rank.loaders import dali

    files = [f"f{i}" for i in range(10)]
    kw = [dali.reader_kwargs(files, r, 2, seed=0) for r in (0, 1)]
    assert kw[0]["random_shuffle"] is True and kw[0]["initial_fill"] == 1024 and "shuffle_after_epoch" not in kw[0]
    # one shuffled list, the same on every rank (so the shards stay disjoint); labels are the files' own indices
    assert kw[0]["files"] == kw[1]["files"] != files and sorted(kw[0]["files"]) == files
    assert [files[i] for i in kw[0]["labels"]] == kw[0]["files"]
    assert (kw[0]["shard_id"], kw[1]["shard_id"], kw[0]["num_shards"]) == (0, 1, 2)
    # the real pipeline: rank 0 of 2 reads half the set in epoch 0; in file order that half held 2 of the 4 classes
    ranks = sources(tree, "dali", world=2)
    got, _ = read_epoch(ranks[0], 0)
    classes = {int(ranks[0].targets[i]) for i in got}
    assert len(classes) == 4, classes
    assert ranks[0].info == {"shuffle": "file list shuffled once (seeded), then random_shuffle",
                             "initial_fill": 1024, "decoder": "cpu", "copy_to_gpu": None}


@pytest.mark.mutation
def test_dali_decode_cpu_on_a_gpu_copies_to_the_rank_gpu_in_the_pipeline():
    from bench.rank.loaders import dali

    assert dali.pipeline_devices("cpu", "cuda:3") == {"device_id": 3, "decoder": "cpu", "to_gpu": True}
    assert dali.pipeline_devices("gpu", "cuda:1") == {"device_id": 1, "decoder": "mixed", "to_gpu": False}
    assert dali.pipeline_devices("cpu", "cpu") == {"device_id": None, "decoder": "cpu", "to_gpu": False}


class FakeDist:
    def __init__(self, name):
        self.metadata = {"Name": name}


@pytest.mark.mutation
@pytest.mark.parametrize("torch_cuda,installed,reason", [
    ("13.0", ["nvidia-dali-cuda130"], None),
    ("12.8", ["nvidia_dali_cuda120"], None),
    (None, ["nvidia-dali-cuda130"], None),  # CPU-only torch: DALI's CPU pipeline runs with any build
    ("12.8", ["nvidia-dali-cuda130"], "the installed NVIDIA DALI (nvidia-dali-cuda130) is not built for torch's CUDA "
                                      "12.8: pip uninstall -y nvidia-dali-cuda130 && pip install nvidia-dali-cuda120"),
    ("13.0", ["nvidia-dali-cuda120", "nvidia-dali-cuda130"],
     "several NVIDIA DALI builds are installed (nvidia-dali-cuda120, nvidia-dali-cuda130) over one nvidia/dali "
     "folder; torch is built for CUDA 13.0: pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130 && "
     "pip install nvidia-dali-cuda130"),
])
def test_dali_build_must_match_torch_cuda(monkeypatch, torch_cuda, installed, reason):
    import importlib.metadata

    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda: [FakeDist("torch"), FakeDist("nvidia-dali-tf-plugin-cuda120")] + list(map(FakeDist, installed)))
    assert loaders.unavailable("dali") == reason


@pytest.mark.mutation
def test_missing_dali_names_the_build_for_torch_cuda(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n.startswith("nvidia") else real(n, *a))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert loaders.unavailable("dali") == "NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)"


@pytest.mark.mutation
def test_bench_loader_rank_sets_its_gpu_before_building_the_loader(monkeypatch):
    from bench.rank import loader as ceiling

    calls = []

    class Queue:
        def put(self, item):
            calls.append(("put", item))

    class Barrier:
        def wait(self, timeout):
            pass

    class Timed:
        skipped, empty_classes = 0, 0

        def __init__(self, source, device):
            calls.append(("timed", str(device)))

        def __next__(self):
            return None

    from bench.core import cuda

    FakeGpuMachine().install(monkeypatch)
    monkeypatch.setattr(cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(loaders, "build", lambda *a, **kw: calls.append(("build", str(kw["device"]))))
    monkeypatch.setattr(data, "TimedBatches", Timed)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    ceiling.measure_rank(Queue(), Barrier(), "torchvision", "cpu", "x", 32, 4, 1, 1, 2, "cuda", 1, 1)
    assert calls[:3] == [("set_device", "cuda:1"), ("build", "cuda:1"), ("timed", "cuda:1")]
    assert calls[3][0] == "put" and calls[3][1][0] == 1 and isinstance(calls[3][1][1], dict)


@pytest.mark.mutation
def test_gpu_decode_path_raises_no_deprecation_warning(tree):
    import inspect
    import warnings

    import torchvision.io

    # decode_image, torchvision's other decoder, has no device: it cannot replace nvJPEG's decode_jpeg
    assert "device" not in inspect.signature(torchvision.io.decode_image).parameters
    ds = data.SkippingImageFolder(tree / "train", load=loaders.tv.ReadForGpu())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        images, refused = loaders.tv.decode_and_augment([ds[i][0] for i in range(3)], 32, torch.device("cpu"))
    assert images.shape == (3, 3, 32, 32) and refused == 0


def test_real_data_memory_comes_from_nvml_in_the_report(tmp_path):
    from tests.test_report import GiB, make, run_report

    real = make("ddp", 2, 500.0, data="imagenet", loader="dali", decode="gpu", reserved=[10 * GiB, 12 * GiB])
    real["memory"][1]["nvml_used_bytes"] = 15 * GiB
    synthetic = make("ddp", 2, 900.0)
    raw = tmp_path / "raw"
    for r in (real, synthetic):
        results.save(r, raw)
    assert run_report(raw, tmp_path / "out")[0] == 0
    md = (tmp_path / "out" / "REPORT.md").read_text()
    section = md[md.index("## Real-data memory"):]
    assert "DALI and nvJPEG allocate GPU memory outside torch's caching allocator" in section
    assert "compare real-data runs by *NVML used*" in section
    rows = [ln for ln in section.splitlines() if ln.startswith("| ddp")]
    assert rows == ["| ddp (dali loader, decode gpu) | 2 | dali / decode gpu | 12.00 GiB | 15.00 GiB | +3.00 GiB |"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dali_decode_cpu_batches_leave_the_pipeline_on_the_gpu(tree):
    """The pipeline itself copies (pinned staging, async): the source's own output is already on the GPU."""
    skip_without("dali")
    (source,) = [loaders.build("dali", "cpu", str(tree), 32, 4, 1, 0, 1, distributed=False,
                               device=torch.device("cuda:0"))]
    images, targets, _ = next(iter(source.epoch(0)))
    assert images.device == torch.device("cuda:0") and images.shape == (4, 3, 32, 32)
    assert source.info["copy_to_gpu"] == "dali" and targets.dtype == torch.int64


def test_loader_settings_are_recorded_and_shown_in_the_report(tmp_path):
    """Loaders ship different defaults (shuffling, pinned memory, who copies to the GPU): the record says what each
    ran with (loader_info) and the report shows it beside the input-bound verdict."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from bench.rank.data import TimedBatches
    from tests.test_report import make, run_report

    dataset = TensorDataset(torch.zeros(8, 3, 4, 4), torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64))
    loader = DataLoader(dataset, batch_size=2, sampler=DistributedSampler(dataset, num_replicas=2, rank=0, seed=1))
    assert TimedBatches(loader, torch.device("cpu")).info == {
        "shuffle": "DistributedSampler, reshuffled every epoch (set_epoch)", "pin_memory": False, "workers": 0}
    dali = {"shuffle": "file list shuffled once (seeded), then random_shuffle", "initial_fill": 1024,
            "decoder": "cpu", "copy_to_gpu": "dali"}
    raw = tmp_path / "raw"
    results.save(make("ddp", 2, 500.0, data="imagenet", loader="dali", decode="cpu", loader_info=dali), raw)
    assert run_report(raw, tmp_path / "out")[0] == 0
    md = (tmp_path / "out" / "REPORT.md").read_text()
    section = md[md.index("## Input pipeline settings"):]
    assert ("| ddp (dali loader, decode cpu) | 2 | dali / decode cpu | copy_to_gpu: dali; decoder: cpu; "
            "initial_fill: 1024; shuffle: file list shuffled once (seeded), then random_shuffle |") in section
