from a3c_core.cli import main

raise SystemExit(main())
