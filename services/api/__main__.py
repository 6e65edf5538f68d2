import sys

from services.api.main import main

sys.exit(main())
