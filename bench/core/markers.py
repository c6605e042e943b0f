"""What rank processes and launchers say to each other besides the spec file: the entry point a launcher starts,
the lines a rank prints when it stops on purpose, their exit codes, and the tag every process of a run carries."""

RANK_ENTRY = "bench.rank"  # python -m bench.rank --spec SPEC.json [--spawn N]: what every launcher starts

OOM_MARKER = "BENCH-OOM:"  # the harness looks for this line in a failed run's output
OOM_EXIT = 3
REFUSED_MARKER = "BENCH-REFUSED:"  # ranks that do not all run the same thing: one line saying where they differ
REFUSED_EXIT = 4

RUN_TAG = "BENCH_RUN_ID"  # in the environment of every process of a run: how the harness finds them all
