"""reusebench asv suite: run with asv.conf.json (embedded default) or asv.llama.conf.json (nightly); see README.md."""
