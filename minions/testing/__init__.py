"""The harness that tests and benchmarks share (as Procrastinate ships procrastinate/testing.py):
the services and agents as real processes (`processes`, `agents`), a whole cluster for drills
(`cluster`), HTTP test executors (`sleep_executor`, `drill_executors`), rows made through the
schema's own functions (`factories`), the drills' audit (`audit`), polling waits (`waiting`) and a
tiny random-weight causal LM built with no download (`tiny_lm`).

Not imported by the services or the agent; pytest fixtures stay in tests/."""
