from bosen.jobs.cli import main

raise SystemExit(main())
