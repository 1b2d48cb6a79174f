"""Reports over records: scenario runs, service workloads, and the asv site's assets."""
