"""``python -m swarmjax.cli`` == the ``swarmjax`` console script."""

import sys

from swarmjax.cli import main

sys.exit(main())
