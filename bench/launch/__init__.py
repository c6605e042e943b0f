"""Starting and watching process trees: one run at a time, each its own fresh tree, under the launcher its backend
names (in process, torchrun, torch.multiprocessing.spawn, horovodrun; several nodes through torchrun's rendezvous),
with a timeout, a kill that leaves nothing behind, and a one-line reason when a run leaves no record. It knows the
spec file and the markers (bench/core), never the rank code: the ranks run ``python -m bench.rank``."""
from bench.launch.run import default_timeout, run_one, threads_per_rank  # noqa: F401 (the launcher's API)
from bench.launch.twin import run_twin  # noqa: F401
