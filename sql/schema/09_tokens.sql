-- API tokens: an optional expiry, a prefix to recognise a token by in a list (the secret itself is
-- never stored), creation and revocation as functions, and a NOTIFY on `tokens` whenever a token
-- changes, so every API process drops its cached entry at once instead of serving a revoked token
-- from its cache.

-- A token as it may be shown: everything but its hash. status: active, expired or revoked; owner:
-- whom it was issued to (its own `token:<id>` when none was named); trusted: vouched for by an admin.
CREATE VIEW minion_tokens AS
SELECT id, prefix, role, team::text AS team, label, created_at, expires_at, revoked_at,
       CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
            WHEN expires_at IS NOT NULL AND expires_at <= now() THEN 'expired'
            ELSE 'active' END AS status,
       coalesce(owner, 'token:' || id) AS owner, trusted
  FROM api_tokens;

-- The owner a token counts as in spot checks: the one it was issued to, else itself.
CREATE FUNCTION minion_token_owner(p_token_id bigint) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(t.owner, 'token:' || t.id) FROM api_tokens t WHERE t.id = p_token_id
$$;

-- A new token (its hash; the secret never reaches the database). The same hash again (`minions up`
-- re-installing its admin token at every start) changes nothing, not even a revocation, and
-- returns NULL. p_owner: whom it is issued to (NULL: itself); p_trusted: an executor token an admin
-- vouches for (check_violation for another role: only machines are vouched for).
CREATE FUNCTION minion_create_token(p_hash bytea, p_prefix text, p_role text, p_team text, p_label text,
                                    p_expires_in_s double precision, p_owner text, p_trusted boolean)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    made bigint;
BEGIN
    IF coalesce(p_trusted, false) AND p_role <> 'executor' THEN
        RAISE EXCEPTION 'only an executor token is trusted' USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO api_tokens (token_hash, prefix, role, team, label, expires_at, owner, trusted)
    VALUES (p_hash, p_prefix, p_role, p_team, coalesce(p_label, ''),
            now() + make_interval(secs => p_expires_in_s),   -- NULL seconds: NULL, never expires
            p_owner, coalesce(p_trusted, false))
    ON CONFLICT (token_hash) DO NOTHING
    RETURNING id INTO made;
    RETURN made;
END $$;

-- Revoke a token: its revocation time (the first one, for a token already revoked), or NULL when
-- there is no such token. The trigger below tells every API process.
CREATE FUNCTION minion_revoke_token(p_id bigint) RETURNS timestamptz LANGUAGE sql AS $$
    UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = p_id RETURNING revoked_at
$$;

-- tokens: payload the token's id. Fires on any change that can end or narrow what a token may do,
-- however it was made (minion_revoke_token, or an operator's UPDATE/DELETE in psql). Delivered at
-- commit, so an API process never drops its entry before the change is visible to its next lookup.
CREATE FUNCTION minion_notify_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tokens', OLD.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER api_tokens_notify_update AFTER UPDATE ON api_tokens
    FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at
                       OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
                       OR OLD.role IS DISTINCT FROM NEW.role
                       OR OLD.team IS DISTINCT FROM NEW.team
                       OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
    EXECUTE FUNCTION minion_notify_token_changed();

CREATE TRIGGER api_tokens_notify_delete AFTER DELETE ON api_tokens
    FOR EACH ROW EXECUTE FUNCTION minion_notify_token_changed();
