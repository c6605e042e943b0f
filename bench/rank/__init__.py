"""What runs inside one rank process: the entry point that dispatches by task (entry.py), the timed loop (train.py),
rank 0's record (record.py), memory, energy and FLOPs, data and loaders, evaluation, faults for tests, and the rank
halves of bench verify and bench collectives. Never imports bench.commands or bench.launch."""
