-- Every statement the watchdog runs, by name.

-- name: lease_holders
-- Executors holding a lease, with the seconds left before their silence counts as lost.
SELECT executor_id, extract(epoch FROM beat_at + make_interval(secs => $1) - now())::float8 AS remaining_s
FROM heartbeats WHERE leases > 0;

-- name: holder_remaining
SELECT leases, extract(epoch FROM beat_at + make_interval(secs => $2) - now())::float8 AS remaining_s
FROM heartbeats WHERE executor_id = $1;

-- name: reclaim_executor
SELECT minion_reclaim_executor($1, $2);

-- name: reclaim_expired
SELECT minion_reclaim_expired($1);
