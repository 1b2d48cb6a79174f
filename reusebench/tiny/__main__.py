"""``python -m reusebench.tiny NAME...``: generate tiny models and print their paths."""

from reusebench.tiny import main

raise SystemExit(main())
