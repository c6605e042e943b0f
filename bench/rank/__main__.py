from bench.rank import startup

startup.begin()  # before the imports: bench/rank/startup.py

from bench.rank.entry import main  # noqa: E402

main()
