import gc

from bosen.jobs.cli import main

code = main()
gc.freeze()  # exit without the collector rescanning what the command imported (torch for declared tables)
raise SystemExit(code)
