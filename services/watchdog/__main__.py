import sys

from services.watchdog.main import main

sys.exit(main())
