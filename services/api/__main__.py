import sys

from minions.services.api.main import main

sys.exit(main())
