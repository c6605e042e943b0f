from bench.rank.entry import main

main()
