"""The planning room: what runs, in which order, beside which twins, and at what estimated cost. ``sweep`` turns
``bench run``'s flags into its configurations (and ``doctor``, ``verify``, ``tune``, ``list`` plan with it); ``nodes``
the nodes of a run over several; ``verify`` what ``bench verify`` plans; ``gpu_check`` the GPU check's launches;
``reference`` the plain twins beside the runs; ``measure`` one configuration run and watched; ``maxbatch``,
``maxmodel`` and ``probe`` the memory searches; ``accuracy`` the to-accuracy runs; ``progress`` the sweep's progress
line. A command calls these; they launch through bench/launch, and never import a command or the report."""
