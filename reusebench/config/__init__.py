"""What a run is told: server profiles, workloads, scenarios, users, corpora and sizes, read by one strict reader."""
