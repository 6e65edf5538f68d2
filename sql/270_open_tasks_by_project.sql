-- A claim by preference for a project reads the project's open tasks, not its history (issue 11).
--
-- A claim that prefers a project first lists the project's open tasks in claim order
-- (minion_claim_some_in, sql/250; minion_claim_in, sql/030). The only index on a project's tasks
-- was the unique (team, project, name), which holds every task the project ever had until retention
-- removes it (30 days by default): each such claim read them all and dropped the finished ones
-- (130 pages for 5,000 finished tasks and one open one, a dozen with this index; the new test in
-- tests/test_sql_batched_steps.py). A task's row is written a few times in its life; a claim runs at
-- every subtask.
--
-- The predicate is written as the claims write it, so that a generic plan proves it as well.
CREATE INDEX tasks_open_by_project ON tasks (team, project, priority DESC, id)
    WHERE NOT (status IN ('completed', 'failed', 'cancelled'));
