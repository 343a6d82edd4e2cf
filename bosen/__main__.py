from bosen.cli import main

raise SystemExit(main())
