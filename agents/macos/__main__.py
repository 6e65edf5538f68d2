"""`python -m minions.agents.macos`: run the agent (what the launchd and systemd units start)."""

from minions.agents.macos.cli import main

raise SystemExit(main())
