from reusebench.cli import main

raise SystemExit(main())
