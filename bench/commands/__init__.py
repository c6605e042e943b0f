"""One module per subcommand: it registers its parser, plans the work, launches it (bench/launch) or reads records.
Commands never import each other; what several share lives in the helper modules here (``_plan``, ``_nodes``,
``_comm``, ``_maxbatch``, ``_progress``, ``_summary``) or in bench/core."""

# The subcommands, in the order ``python -m bench --help`` lists them.
COMMANDS = ("run", "list", "report", "compare", "baseline", "verify", "collectives", "predict", "nodelist", "loader",
            "doctor", "trace", "overhead", "peak", "tune")
