"""Real ImageNet-layout data: a tiny tree of real JPEG files built on the fly."""
import random

import pytest
from PIL import Image

from bench.rank import data
from tests.conftest import bench, bench_inproc, cli_error, records

CLASSES = ("n01440764", "n01443537", "n01484850")
SMALL = ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--workers", "0",
         "--warmup", "2", "--steps", "3", "--windows", "3"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """3 classes x 8 RGB JPEGs, plus grayscale and CMYK JPEGs, one PNG and one corrupt file: 28 files."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = random.Random(0)
    for c in CLASSES:
        folder = root / "train" / c
        folder.mkdir(parents=True)
        for i in range(8):
            Image.frombytes("RGB", (48, 40), rng.randbytes(48 * 40 * 3)).save(folder / f"{c}_{i}.JPEG")
    Image.frombytes("L", (40, 40), rng.randbytes(1600)).save(root / "train" / CLASSES[0] / "gray.JPEG")
    Image.frombytes("CMYK", (40, 40), rng.randbytes(6400)).save(root / "train" / CLASSES[1] / "cmyk.JPEG")
    Image.frombytes("RGB", (40, 40), rng.randbytes(4800)).save(root / "train" / CLASSES[2] / "img.png")
    (root / "train" / CLASSES[2] / "corrupt.JPEG").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (root / "val").mkdir()
    return root


@pytest.mark.slow
def test_single_and_ddp_train_on_the_folder(tree, results_dir):
    # --max-gpus 2 on CPU: single at 1, ddp at 2 (the multi-process backends run at the largest size only)
    proc = bench_inproc("run", "--backends", "single,ddp", "--max-gpus", 2, *SMALL, "--data", "imagenet",
                        "--data-dir", tree, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {(r["backend"], r["world_size"]): r for r in records(results_dir)}
    assert set(recs) == {("single", 1), ("ddp", 2)}
    for r in recs.values():
        assert r["status"] == "ok", r["reason"]
        assert (r["data"], r["data_dir"], r["workers"]) == ("imagenet", str(tree), 0)
        assert len(r["data_wait_seconds"]) == 3
        assert all(0 < w <= t for w, t in zip(r["data_wait_seconds"], r["window_seconds"]))
    assert recs[("ddp", 2)]["replicas_consistent"] is True
    # 12 steps of 4 from 28 files cover the corrupt one; which steps see it is fixed by the seed
    assert recs[("single", 1)]["corrupt_images_skipped"] >= 1
    assert "warning: skipping unreadable image" in (results_dir / "logs" / f"{recs[('single', 1)]['run_id']}.log").read_text()


def test_distributed_sampler_gives_disjoint_padded_shards_reshuffled_per_epoch(tree):
    loaders = [data.imagenet_loader(str(tree), 32, 4, 0, rank, 2, distributed=True, pin_memory=False) for rank in (0, 1)]
    n = len(loaders[0].dataset)
    assert n == 28
    epoch0 = [list(ld.sampler) for ld in loaders]
    assert len(epoch0[0]) == len(epoch0[1]) == 14  # padded to equal length (28 / 2, no padding needed here)
    assert set(epoch0[0]).isdisjoint(epoch0[1]) and set(epoch0[0]) | set(epoch0[1]) == set(range(n))
    for ld in loaders:
        ld.sampler.set_epoch(1)
    epoch1 = [list(ld.sampler) for ld in loaders]
    assert epoch1[0] != epoch0[0]
    assert set(epoch1[0]).isdisjoint(epoch1[1])
    # an odd-sized epoch is padded, so every rank still gets as many samples
    from torch.utils.data import DistributedSampler

    shards = [list(DistributedSampler(range(27), num_replicas=2, rank=r, shuffle=True)) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 14 and len(set(shards[0]) | set(shards[1])) == 27


def test_corrupt_image_is_replaced_and_counted(tree):
    from torchvision import transforms

    ds = data.SkippingImageFolder(str(tree / "train"), transforms.ToTensor())
    bad = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("corrupt.JPEG"))
    image, target, skipped = ds[bad]
    assert skipped == 1 and image.shape[0] == 3
    gray = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("gray.JPEG"))
    cmyk = next(i for i, (p, _) in enumerate(ds.samples) if p.endswith("cmyk.JPEG"))
    assert ds[gray][0].shape[0] == 3 and ds[cmyk][0].shape[0] == 3  # converted to RGB


@pytest.mark.slow
def test_loader_command_measures_the_pipeline_alone(tree):
    proc = bench("loader", "--data-dir", tree, "--loaders", "torchvision", "--workers", 0, "--batch-size", 4,
                 "--image-size", 32, "--batches", 3)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("loader: ") and " img/s with 0 workers" in proc.stdout


@pytest.mark.parametrize("layout,message", [
    ("missing", "bench: error: --data-dir {root}: no such directory"),
    ("no_train", "bench: error: --data-dir {root}: no train/ folder (expected {root}/train/<class>/*.JPEG)"),
    ("no_classes", "bench: error: {root}/train has no class folders (expected {root}/train/<class>/*.JPEG)"),
    ("no_images", "bench: error: {root}/train has 1 class folders but no images"),
    ("too_few", "bench: error: {root}/train has 3 images, fewer than one global batch of 4; lower --batch-size"),
])
def test_bad_data_directories(tmp_path, results_dir, layout, message, capsys):
    root = tmp_path / "data"
    if layout != "missing":
        root.mkdir()
    if layout in ("no_classes", "no_images", "too_few"):
        (root / "train").mkdir()
    if layout in ("no_images", "too_few"):
        (root / "train" / "n0").mkdir()
        (root / "train" / "n0" / "notes.txt").write_text("no images here")
    if layout == "too_few":
        for i in range(3):
            Image.new("RGB", (8, 8)).save(root / "train" / "n0" / f"{i}.JPEG")
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *SMALL, "--data", "imagenet",
                          "--data-dir", root, "--results", results_dir)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(root=root)), err
    assert not results_dir.exists() or records(results_dir) == []
