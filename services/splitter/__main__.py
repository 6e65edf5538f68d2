"""`python -m services.splitter`."""

import sys

from services.splitter.main import main

sys.exit(main())
