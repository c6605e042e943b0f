"""ImageNet folders as users have them: class folders (some empty, some symlinked), and ``val/`` either as class
folders or flat with a labels file.

- Class folders are found with ``os.walk(followlinks=True)``, so symlinked files and folders count.
- An empty class folder keeps its class index (labels stay those of the full set) and is skipped with one warning
  line naming it; records count them in ``empty_classes``. A run never fails for one.
- ``val/`` flat: ``val/*.JPEG`` with ``LOC_val_solution.csv`` (ILSVRC2012 on Kaggle: ``ImageId,PredictionString``,
  the first word of the prediction string the wnid), or ``val.txt`` / ``val_labels.txt`` with one
  ``filename label`` per line (label: a wnid, or a class index in the sorted order of train/'s folders), in
  ``val/`` or next to it. ``ILSVRC2012_validation_ground_truth.txt`` alone is not enough: its IDs follow the
  devkit's meta.mat order, not the folders' order; convert it to ``val.txt`` with wnids.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LABEL_FILES = ("LOC_val_solution.csv", "val.txt", "val_labels.txt")


def is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def class_dirs(root: Path) -> list[str]:
    """Class folder names under ``root``, sorted (a symlink to a folder is a folder)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


def images_under(folder: Path) -> list[str]:
    """Every image file under ``folder``, following symlinked folders, sorted."""
    out = []
    for dirpath, _, files in os.walk(folder, followlinks=True):
        out += [os.path.join(dirpath, f) for f in files if is_image(f)]
    return sorted(out)


def scan(root: str | Path) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """(classes, samples as (path, class index), empty class names) of a class-folder tree."""
    root = Path(root)
    classes = class_dirs(root)
    samples, empty = [], []
    for index, name in enumerate(classes):
        found = images_under(root / name)
        if not found:
            empty.append(name)
        samples += [(p, index) for p in found]
    return classes, samples, empty


def empty_warning(root: str | Path, empty: list[str]) -> str:
    shown = ", ".join(empty[:10]) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
    return f"warning: {len(empty)} empty class folder(s) in {root} skipped (labels unchanged): {shown}"


# ---------------------------------------------------------------------------------------------------
# val/

def has_class_folders(val: Path) -> bool:
    return val.is_dir() and any(images_under(val / c) for c in class_dirs(val))


def labels_file(val: Path) -> Path | None:
    for name in LABEL_FILES:
        for where in (val, val.parent):
            if (where / name).is_file():
                return where / name
    return None


def flat_val(val: Path, classes: list[str]) -> tuple[list[tuple[str, int]], int]:
    """(samples, images without a usable label) of a flat val/ with a labels file; ``classes`` are train/'s."""
    found = labels_file(val)
    if found is None:
        raise FileNotFoundError(f"{val} has no class folders and no labels file ({', '.join(LABEL_FILES)})")
    index = {c: i for i, c in enumerate(classes)}
    labels: dict[str, int | None] = {}
    if found.suffix == ".csv":
        with open(found, newline="") as f:
            for row in csv.DictReader(f):
                wnid = (row.get("PredictionString") or "").split()[:1]
                labels[row["ImageId"]] = index.get(wnid[0]) if wnid else None
    else:
        for line in found.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                label = parts[1]
                labels[Path(parts[0]).stem] = int(label) if label.isdigit() and int(label) < len(classes) \
                    else index.get(label)
    samples, unlabelled = [], 0
    for path in images_under(val):
        label = labels.get(Path(path).stem)
        if label is None:
            unlabelled += 1
        else:
            samples.append((path, label))
    return samples, unlabelled


def val_samples(data_dir: str | Path) -> tuple[list[tuple[str, int]], str]:
    """The evaluation samples of ``DIR/val`` with train/'s class indices, and how val/ was laid out."""
    root = Path(data_dir)
    classes = class_dirs(root / "train")
    val = root / "val"
    if has_class_folders(val):
        index = {c: i for i, c in enumerate(classes)}
        return [(p, index[c]) for c in class_dirs(val) if c in index for p in images_under(val / c)], "class folders"
    samples, unlabelled = flat_val(val, classes)
    return samples, f"flat with {labels_file(val).name}" + (f" ({unlabelled} images without a label left out)"
                                                            if unlabelled else "")
