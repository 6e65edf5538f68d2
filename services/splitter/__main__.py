"""`python -m minions.services.splitter`."""

import sys

from minions.services.splitter.main import main

sys.exit(main())
