-- A lease's input URL reads only its range, and only while its lease is live.
--
-- The local store's input URL is signed for one lease token and one byte range of the input object
-- (minions/store/signing.py, Scope); the API serves a GET of it only while this says the lease is
-- current and still covers that range: once the lease is completed, failed, released, lost or
-- cancelled (or reclaimed by another executor) its URL answers 403 lease_ended, whatever its expiry.
-- A backup's lease is live as long as its own token is (minion_lease_info covers both).
CREATE FUNCTION minion_input_readable(p_token uuid, p_start bigint, p_end bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM minion_lease_info(p_token) i
                    WHERE i.input_uri IS NOT NULL AND i.byte_start = p_start AND i.byte_end = p_end);
$$;
