"""Running: one scenario session or one service workload against a server, through one recording core."""
