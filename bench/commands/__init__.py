"""One module per subcommand: it registers its parser and calls the rooms below it: the planning room (bench/plan:
what runs, in which order, at what cost; it launches through bench/launch) and the reporting room (bench/report:
records in, figures out). Commands never import each other; what several share lives in those rooms or in
bench/core."""

# The subcommands, in the order ``python -m bench --help`` lists them.
COMMANDS = ("run", "list", "report", "compare", "baseline", "verify", "collectives", "predict", "nodelist", "loader",
            "doctor", "trace", "overhead", "peak", "tune")
