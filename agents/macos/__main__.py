"""`python -m agents.macos`: run the agent (what the launchd and systemd units start)."""

from agents.macos.cli import main

raise SystemExit(main())
