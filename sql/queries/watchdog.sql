-- Every statement the watchdog runs, by name.

-- name: lease_holders
-- Executors holding a lease, with the seconds left before their silence counts as lost (at the
-- cluster's lease timeout, as every query here).
SELECT h.executor_id, extract(epoch FROM h.alive_at + make_interval(secs => minion_lease_timeout_s()) - now())::float8
       AS remaining_s
FROM heartbeats h JOIN minion_lease_holders() l ON l.executor_id = h.executor_id;

-- name: holder_remaining
SELECT minion_lease_count(executor_id) AS leases,
       extract(epoch FROM alive_at + make_interval(secs => minion_lease_timeout_s()) - now())::float8 AS remaining_s
FROM heartbeats WHERE executor_id = $1;

-- name: reclaim_executor
SELECT minion_reclaim_executor($1);

-- name: reclaim_expired
SELECT minion_reclaim_expired();

-- name: unpin_idle_tasks
-- Model pins that hold nothing any more (sql/schema/06_leases.sql): a vanished machine's pin strands no task.
SELECT minion_unpin_idle_tasks();

-- name: settle_stale_checks
-- Spot checks that could not finish within $1 seconds (sql/schema/11_checks.sql): a volunteer's lone result stays held,
-- marked overdue; a dispute runs again.
SELECT minion_settle_stale_checks($1);

-- name: settle_quarantines
-- The rest of each quarantine a vote flagged (sql/schema/11_checks.sql), should the API not have done it.
SELECT minion_settle_quarantines();

-- name: fair_share_cycle
-- One negotiation between teams (sql/schema/15_fair_share.sql): $1 usage half-life (s), $2 turns in
-- a round, $3 seconds before a waiting task is starving. NULL when another watchdog holds it.
SELECT minion_fair_share_cycle($1, $2, $3);

-- name: fair_share_off
-- Fair share turned off: no turns, so claims take priority, then FIFO.
DELETE FROM fair_share_turns;

-- name: end_overage_leases
-- Leases and replicas held past their age cap, heartbeats or not (sql/schema/06_leases.sql): $1 factor, $2 floor,
-- $3 the kinds' ceilings, $4 quarantine after.
SELECT minion_end_overage_leases($1, $2, $3, $4);

-- name: release_orphan_pins
-- Model pins no online executor has reported for $1 seconds while work waits (sql/schema/06_leases.sql).
SELECT minion_release_orphan_pins($1);
