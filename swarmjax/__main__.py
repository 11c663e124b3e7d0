"""``python -m swarmjax``: the command line (same as the ``swarmjax`` script)."""

from swarmjax.cli import main

raise SystemExit(main())
