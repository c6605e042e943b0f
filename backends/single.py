"""single: one device, one process, no wrapper. The world-size-1 baseline for scaling efficiency."""
from backends.base import Backend


class Single(Backend):
    max_world_size = 1
    max_world_size_why = "the scaling baseline runs on 1 device only"
    twin_loop = "plain"  # bench/twins/vision.py, gpt.py: the plain loop every backend's gap is measured from

    def grad_reduce_dtype(self) -> None:
        return None  # one process on one device: no gradient is reduced
