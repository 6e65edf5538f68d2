-- Statements of the object-store garbage collector (`minions gc`, the watchdog's sweep).

-- name: store_signing_key
SELECT value FROM minion_settings WHERE key = 'store_signing_key';

-- name: stale_input_records
-- $1 grace (s), $2 dry run, $3 batch size
SELECT uri, bytes FROM minion_gc_input_records($1, $2, $3);

-- name: unowned_inputs
SELECT minion_gc_unowned_inputs AS uri FROM minion_gc_unowned_inputs($1);

-- name: garbage_outputs
SELECT minion_gc_outputs AS key FROM minion_gc_outputs($1)
UNION SELECT minion_gc_compacted FROM minion_gc_compacted($1);

-- name: garbage_results
SELECT minion_gc_results AS key FROM minion_gc_results($1)
UNION SELECT minion_gc_compacted FROM minion_gc_compacted($1);

-- name: garbage_parts
SELECT minion_gc_parts AS key FROM minion_gc_parts($1);
