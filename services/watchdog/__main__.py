import sys

from minions.services.watchdog.main import main

sys.exit(main())
