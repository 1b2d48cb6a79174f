"""llama-server itself: building it, its binaries and --help, the process, its HTTP API, its log and the
facts about it the rest of the library relies on. Imports only ``records``, ``tiny`` and ``machine``."""
