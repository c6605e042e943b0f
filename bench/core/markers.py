"""What rank processes and launchers say to each other besides the spec file: the entry point a launcher starts,
the lines a rank prints when it stops on purpose, their exit codes, and the tag every process of a run carries."""

RANK_ENTRY = "bench.rank"  # python -m bench.rank --spec SPEC.json [--spawn N]: what every launcher starts

OOM_MARKER = "BENCH-OOM:"  # the harness looks for this line in a failed run's output
OOM_EXIT = 3
REFUSED_MARKER = "BENCH-REFUSED:"  # ranks that do not all run the same thing: one line saying where they differ
REFUSED_EXIT = 4

RUN_TAG = "BENCH_RUN_ID"  # in the environment of every process of a run: how the harness finds them all

PEER_LOST_MARKER = "BENCH-PEER-LOST:"  # several nodes: a node stopped answering; JSON naming it follows the marker
PEER_LOST_EXIT = 5

# "PID:START" of the harness process that started this run (START: its creation time, as psutil reports it, so a
# reused pid is never mistaken for it). Every rank watches that process and exits when it is gone, so a harness
# killed with SIGKILL (an OOM killer, a CI runner's hard cancel) leaves no rank holding a GPU.
HARNESS_ENV = "BENCH_HARNESS"
