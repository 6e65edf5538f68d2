-- The baseline: the schema as it stood when migrations began (sql/schema/ at that commit, its
-- files in order). Frozen: never edited. Deltas follow as 0001_*.sql, ... (minions/db/migrate.py).

-- ---- 01_tables.sql ----

-- The tables. Every invariant the database can hold is a constraint here; state changes live in
-- functions (the other files of this folder), so psql can do exactly what the services do.
--
-- Column order is the order the columns were added in: functions take whole rows (`s subtasks`) and
-- `SELECT *`, and a database migrated column by column must match one built from this file.

CREATE DOMAIN minion_name AS text
    CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$');

-- Settings shared by every replica: the local store's URL-signing key and the cluster-wide values
-- (lease timeout, max attempts: settings.sql).
CREATE TABLE minion_settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE api_tokens (
    id          bigserial PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE,            -- sha256 of the secret; the secret is never stored
    role        text NOT NULL CHECK (role IN ('admin', 'user', 'executor')),
    team        minion_name,                      -- NULL: every team
    label       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    expires_at  timestamptz,                      -- NULL: never expires
    -- The first characters of the secret ('mn_' and 5 more: 30 of its 256 random bits), shown by
    -- `minions token list`.
    prefix      text CHECK (length(prefix) <= 16)
);

-- ---------------------------------------------------------------------------------------------
-- Tasks
-- ---------------------------------------------------------------------------------------------

CREATE TABLE tasks (
    id              bigserial PRIMARY KEY,        -- also the FIFO order of submission
    team            minion_name NOT NULL,
    project         minion_name NOT NULL,
    name            minion_name NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('embedding', 'completion', 'sleep')),
    model           text NOT NULL CHECK (length(model) BETWEEN 1 AND 256),
    params          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(params) = 'object'),
    priority        integer NOT NULL DEFAULT 0,
    subtask_size    integer NOT NULL CHECK (subtask_size >= 1),
    max_attempts    integer NOT NULL CHECK (max_attempts >= 1),
    -- The input object; NULL when the input is kept in task_inputs (one place, never both nor
    -- neither: the constraint trigger tasks_input_placed, inputs.sql).
    input_uri       text,
    request_hash    text NOT NULL,                -- identical re-submission returns the same task
    status          text NOT NULL DEFAULT 'submitted' CHECK (status IN
                        ('submitted', 'splitting', 'queued', 'running', 'completed', 'failed', 'cancelled')),
    error           text,
    -- Bookkeeping the splitter and the lease functions keep, so finishing a task is O(1):
    split_done      boolean NOT NULL DEFAULT false,
    split_offset    bigint NOT NULL DEFAULT 0,    -- bytes of input already turned into subtasks
    split_records   bigint NOT NULL DEFAULT 0,    -- records already turned into subtasks
    -- Progress counters, kept by the functions that change a subtask's state (never by a claim,
    -- whose hot path must not touch the task row), so reading a task's progress is O(1). A close
    -- adds to a progress slot of its own (task_progress_slots); these hold what was folded in.
    subtasks_total  integer NOT NULL DEFAULT 0 CHECK (subtasks_total >= 0),
    open_subtasks   integer NOT NULL DEFAULT 0 CHECK (open_subtasks >= 0),   -- pending + leased
    failed_subtasks integer NOT NULL DEFAULT 0 CHECK (failed_subtasks >= 0),
    cancelled_subtasks integer NOT NULL DEFAULT 0 CHECK (cancelled_subtasks >= 0),
    records_done    bigint NOT NULL DEFAULT 0 CHECK (records_done >= 0),
    created_by      bigint REFERENCES api_tokens (id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    -- The length of an embedding task's vectors, fixed by the first result committed in the task
    -- (a held result fixes nothing: minion_dimension_fits, results.sql).
    embedding_dimension integer CHECK (embedding_dimension > 0),
    -- The model fingerprint every result of the task comes from (a pin: leases.sql), and whether
    -- the submission asked for it (`model@revision`: kept) or its first lease set it (given back
    -- while the task has nothing from it: minion_unpin_idle_tasks).
    fingerprint     text CHECK (length(fingerprint) BETWEEN 1 AND 160),
    fingerprint_from_revision boolean NOT NULL DEFAULT false,
    UNIQUE (team, project, name),
    CHECK ((status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);
-- Splittable: the split is not done and the task has not ended. Not a status: the first claim makes a
-- task 'running' while it is still splitting.
CREATE INDEX tasks_unsplit ON tasks (id) WHERE NOT split_done AND status NOT IN ('completed', 'failed', 'cancelled');
CREATE INDEX tasks_team_created ON tasks (team, id DESC);
-- "Does any task still read this object?" for the garbage collector.
CREATE INDEX tasks_input_uri ON tasks (input_uri);
-- Tasks whose split is done and that have not ended: what the splitter's settle sweep looks at.
CREATE INDEX tasks_settling ON tasks (id) WHERE split_done AND status IN ('splitting', 'queued', 'running');
-- The oldest finished tasks first, without reading the running ones (retention).
CREATE INDEX tasks_finished_at ON tasks (finished_at, id) WHERE finished_at IS NOT NULL;
-- A claim by preference for a project finds its open tasks in claim order.
CREATE INDEX tasks_open_by_project ON tasks (team, project, priority DESC, id)
    WHERE NOT (status IN ('completed', 'failed', 'cancelled'));

-- Progress without a hot task row: every close adds to a slot of its own, one row per (task,
-- backend pid), so two transactions never write the same slot (a live pid names one backend) and
-- completes of one task run side by side. Slots are folded into the task row when it ends.
CREATE TABLE task_progress_slots (
    task_id      bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    slot         integer NOT NULL,            -- pg_backend_pid() of the writer
    closed       integer NOT NULL DEFAULT 0,  -- subtasks that left the open states (done or failed)
    failed       integer NOT NULL DEFAULT 0,
    records_done bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, slot)
);

-- ---------------------------------------------------------------------------------------------
-- Executors
-- ---------------------------------------------------------------------------------------------

CREATE TABLE executors (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    token_id          bigint NOT NULL REFERENCES api_tokens (id),
    team              minion_name,                -- the token's scope: claims only this team's work
    name              text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    hardware          jsonb NOT NULL DEFAULT '{}',
    kinds             text[] NOT NULL DEFAULT '{}',
    models            text[] NOT NULL DEFAULT '{}',
    capabilities      text[] NOT NULL DEFAULT '{}', -- 'kind:model' pairs it serves ('sleep:*' for sleep)
    status            text NOT NULL DEFAULT 'online' CHECK (status IN ('online', 'offline', 'lost')),
    registered_at     timestamptz NOT NULL DEFAULT now(),   -- moves with every registration
    created_at        timestamptz NOT NULL DEFAULT now(),   -- when the name was first registered
    -- Trust, reset when its model fingerprints change (checks.sql). quarantine_settled: its leases,
    -- held and committed results were dealt with (minion_settle_quarantines).
    agreements        integer NOT NULL DEFAULT 0 CHECK (agreements >= 0),
    disagreements     integer NOT NULL DEFAULT 0 CHECK (disagreements >= 0),
    trusted           boolean NOT NULL DEFAULT false,
    quarantined_at    timestamptz,
    quarantine_reason text,
    quarantine_settled boolean NOT NULL DEFAULT true,
    UNIQUE (token_id, name),                      -- one machine, one executor row
    CONSTRAINT executors_quarantine_reason CHECK ((quarantined_at IS NULL) = (quarantine_reason IS NULL)),
    CONSTRAINT executors_quarantined_untrusted CHECK (quarantined_at IS NULL OR NOT trusted)
);
CREATE INDEX executors_quarantine_unsettled ON executors (id) WHERE NOT quarantine_settled;

-- Dynamic task binding: an owner prefers a team, a team/project or a team/project/task.
CREATE TABLE executor_preferences (
    executor_id uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    position    integer NOT NULL,
    team        minion_name NOT NULL,
    project     minion_name,
    task_name   minion_name,
    PRIMARY KEY (executor_id, position),
    CHECK (task_name IS NULL OR project IS NOT NULL)
);

-- Liveness, one row per executor. beat_at moves with heartbeats (and NOTIFYs the watchdog);
-- seen_at with claims, which prove life too but are the hot path and must not notify.
CREATE TABLE heartbeats (
    executor_id uuid PRIMARY KEY REFERENCES executors (id) ON DELETE CASCADE,
    beat_at     timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    alive_at    timestamptz GENERATED ALWAYS AS (greatest(beat_at, seen_at)) STORED
);

-- The model each executor serves each capability with, as it registered: a fingerprint of the
-- weights and config, the precision and backend it runs them in, and the version of the proofs of
-- generation its results carry (NULL: none, so its sampled completions are not checked).
CREATE TABLE executor_fingerprints (
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    capability   text NOT NULL,   -- 'kind:model', as in executors.capabilities
    model        text NOT NULL,
    fingerprint  text NOT NULL CHECK (length(fingerprint) BETWEEN 1 AND 160),
    precision    text,
    backend      text,
    proofs       smallint CHECK (proofs > 0),
    PRIMARY KEY (executor_id, capability)
);

-- Every registration's, from valid_from until the next registration (valid_to; NULL: in force).
CREATE TABLE executor_fingerprint_history (
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    capability   text NOT NULL,
    model        text NOT NULL,
    fingerprint  text NOT NULL,
    precision    text,
    backend      text,
    valid_from   timestamptz NOT NULL,
    valid_to     timestamptz,
    PRIMARY KEY (executor_id, capability, valid_from)
);
CREATE INDEX executor_fingerprint_history_open ON executor_fingerprint_history (executor_id) WHERE valid_to IS NULL;

-- ---------------------------------------------------------------------------------------------
-- Subtasks, leases and attempts
-- ---------------------------------------------------------------------------------------------

CREATE TABLE subtasks (
    task_id          bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    subtask_id       integer NOT NULL CHECK (subtask_id >= 0),
    -- Denormalised from the task so the claim reads one index and nothing else.
    team             minion_name NOT NULL,
    project          minion_name NOT NULL,
    task_name        minion_name NOT NULL,
    capability       text NOT NULL,
    priority         integer NOT NULL,
    byte_start       bigint NOT NULL CHECK (byte_start >= 0),
    byte_end         bigint NOT NULL,
    first_record     bigint NOT NULL,             -- ordinal of its first record in the input
    records          integer NOT NULL CHECK (records >= 1),
    -- 'checking': completed once, its result held (subtask_checks) until a replica agrees.
    state            text NOT NULL DEFAULT 'pending'
                         CHECK (state IN ('pending', 'leased', 'checking', 'done', 'failed', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,  -- attempts started (claims that were not released)
    lease_token      uuid,
    lease_executor   uuid REFERENCES executors (id),
    leased_at        timestamptz,
    output_key       text,                        -- the committed attempt's object
    last_error       text,
    done_at          timestamptz,
    -- The verified result: a copy no URL names (result_key), or the bytes themselves when small
    -- (result_data), with the SHA-256 and size of what was verified. One place, never both; kept
    -- bytes match their hash and size (checked by PostgreSQL at every write).
    result_key       text,
    result_sha256    bytea CHECK (result_sha256 IS NULL OR length(result_sha256) = 32),
    result_bytes     bigint CHECK (result_bytes IS NULL OR result_bytes >= 0),
    result_data      bytea,
    -- The lease chosen for a spot check, checked while it is the subtask's lease (a requeue gives
    -- the subtask a new token, so a stale choice never holds another lease's result).
    check_token      uuid,
    PRIMARY KEY (task_id, subtask_id),
    CHECK (byte_end > byte_start),
    CHECK ((state = 'leased') = (lease_executor IS NOT NULL)),
    CHECK (state <> 'leased' OR lease_token IS NOT NULL),
    CHECK (state <> 'done' OR output_key IS NOT NULL),
    CONSTRAINT subtasks_result_complete CHECK (
        (result_sha256 IS NULL) = (result_bytes IS NULL)
        AND (result_key IS NULL OR result_sha256 IS NOT NULL)
        AND (result_data IS NULL OR (result_key IS NULL AND result_sha256 IS NOT NULL
                                     AND length(result_data) = result_bytes
                                     AND sha256(result_data) = result_sha256))),
    CONSTRAINT subtasks_checking_token CHECK (state <> 'checking' OR lease_token IS NOT NULL)
);
-- The claim path: O(log n) in pending subtasks, per capability, in claim order.
CREATE INDEX subtasks_pending_queue ON subtasks (capability, priority DESC, task_id, subtask_id)
    WHERE state = 'pending';
CREATE INDEX subtasks_pending_team ON subtasks (team, capability, priority DESC, task_id, subtask_id)
    WHERE state = 'pending';
CREATE UNIQUE INDEX subtasks_lease_token ON subtasks (lease_token) WHERE lease_token IS NOT NULL;
CREATE INDEX subtasks_lease_executor ON subtasks (lease_executor) WHERE state = 'leased';
CREATE INDEX subtasks_leased_at ON subtasks (leased_at) WHERE state = 'leased';
-- The replica claim's queue: checking subtasks in claim order (empty while nothing is checked).
CREATE INDEX subtasks_checking ON subtasks (capability, priority DESC, task_id, subtask_id) WHERE state = 'checking';
-- A task's subtasks in flight: its running count and the settle probe.
CREATE INDEX subtasks_in_flight_task ON subtasks (task_id) WHERE state IN ('leased', 'checking');

-- The claim referee from the paper: a live lease is a row here, and the UNIQUE constraint lets
-- exactly one contender's INSERT ... ON CONFLICT DO NOTHING win a subtask.
CREATE TABLE minion_subtask_acquirement (
    team         minion_name NOT NULL,
    project      minion_name NOT NULL,
    task_name    minion_name NOT NULL,
    subtask_id   integer NOT NULL,
    task_id      bigint NOT NULL,
    executor_id  uuid NOT NULL,
    lease_token  uuid NOT NULL UNIQUE,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team, project, task_name, subtask_id),
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE
);

-- A second run of a leased or checking subtask: a straggler backup (near the end of a task an idle
-- executor runs a copy of a lease that has run far longer than its peers; the first of the two to
-- complete wins and the other's token goes stale: invariant 2) or a spot check's replica. At most
-- one per subtask: the primary key is the referee.
CREATE TABLE subtask_backups (
    task_id      bigint NOT NULL,
    subtask_id   integer NOT NULL,
    lease_token  uuid NOT NULL UNIQUE,
    executor_id  uuid NOT NULL REFERENCES executors (id),
    leased_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, subtask_id),
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE
);
CREATE INDEX subtask_backups_executor ON subtask_backups (executor_id);

-- Attempt history: why every retry happened.
CREATE TABLE subtask_attempts (
    task_id      bigint NOT NULL,
    subtask_id   integer NOT NULL,
    attempt      integer NOT NULL,
    executor_id  uuid REFERENCES executors (id),
    lease_token  uuid NOT NULL,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz NOT NULL DEFAULT now(),
    -- superseded: a straggler and its backup both ran; the other one committed first.
    -- candidate: a result held for a check; agreed: a replica that matched the committed one;
    -- outvoted: a result on the losing side of a quorum (or of no quorum); revoked: a committed result
    -- of an executor later quarantined, run again; unchecked: a held result committed because no check
    -- could finish in time. The list is minions.kinds.ATTEMPT_OUTCOMES (a test compares them).
    outcome      text NOT NULL CHECK (outcome IN ('done', 'failed', 'lost', 'released', 'cancelled', 'superseded',
                                                 'candidate', 'agreed', 'outvoted', 'revoked', 'unchecked')),
    error        text,
    records      integer,
    seconds      double precision,
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE
);
CREATE INDEX subtask_attempts_subtask ON subtask_attempts (task_id, subtask_id);
CREATE INDEX subtask_attempts_ended ON subtask_attempts (ended_at);
-- A task's latest finished attempts (the straggler threshold).
CREATE INDEX subtask_attempts_task_done ON subtask_attempts (task_id, ended_at DESC) WHERE outcome = 'done';
-- A quarantine revokes an executor's committed results: found by executor, not by a scan of history.
CREATE INDEX subtask_attempts_executor_done ON subtask_attempts (executor_id) WHERE outcome IN ('done', 'unchecked');
-- The spot-check panels read checked attempts by time without the rest of history.
CREATE INDEX subtask_attempts_spot_checked ON subtask_attempts (ended_at)
 WHERE outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked');

-- ---------------------------------------------------------------------------------------------
-- Spot checks
-- ---------------------------------------------------------------------------------------------

-- The results held for a check: round 1 the first, round 2 a replica that disagreed. At most two,
-- only while the subtask is 'checking' (its functions delete them when it leaves that state).
CREATE TABLE subtask_checks (
    task_id        bigint NOT NULL,
    subtask_id     integer NOT NULL,
    round          smallint NOT NULL CHECK (round IN (1, 2)),
    lease_token    uuid NOT NULL UNIQUE,
    executor_id    uuid NOT NULL REFERENCES executors (id),
    attempt        integer NOT NULL,
    output_key     text NOT NULL,
    result_key     text,
    result_sha256  bytea,
    result_bytes   bigint,
    result_data    bytea,
    dimension      integer CHECK (dimension > 0),  -- its vectors' length (embeddings), pinned if it commits
    records        integer NOT NULL,
    seconds        double precision,
    started_at     timestamptz NOT NULL,
    held_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, subtask_id, round),
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE,
    CHECK ((result_key IS NULL) = (result_sha256 IS NULL) OR result_data IS NOT NULL)
);
CREATE INDEX subtask_checks_executor ON subtask_checks (executor_id);
CREATE INDEX subtask_checks_held_at ON subtask_checks (held_at);

-- Ended tasks that hold results of an executor quarantined after they ended (written by the
-- quarantine: tasks still open have those results run again instead). Shown as the task's warnings.
CREATE TABLE task_quarantine_warnings (
    task_id      bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    executor_id  uuid NOT NULL REFERENCES executors (id) ON DELETE CASCADE,
    subtasks     integer NOT NULL CHECK (subtasks > 0),
    reason       text NOT NULL,
    noted_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, executor_id)
);

-- ---------------------------------------------------------------------------------------------
-- Results
-- ---------------------------------------------------------------------------------------------

-- A completed task's results compacted into a few large parts (results.sql).
CREATE TABLE result_parts (
    task_id       bigint  NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    part          integer NOT NULL CHECK (part >= 0),
    first_subtask integer NOT NULL,
    last_subtask  integer NOT NULL CHECK (last_subtask >= first_subtask),
    key           text    NOT NULL UNIQUE,
    sha256        bytea   NOT NULL CHECK (length(sha256) = 32),
    bytes         bigint  NOT NULL CHECK (bytes >= 0),
    records       bigint  NOT NULL CHECK (records >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, part)
);

-- A task whose parts cover all its subtasks: from then on results are served from its parts. The
-- bytes kept in its rows are dropped once it has been compacted for the grace period, as its
-- per-subtask objects are; their SHA-256 and size stay, the record of what was committed.
-- kept_results_from: the next subtask id to look at (batches walk the task once, by subtask id, and
-- a task with nothing kept takes one call, however many subtasks it has).
CREATE TABLE compacted_tasks (
    task_id      bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    parts        integer NOT NULL,
    bytes        bigint  NOT NULL,
    compacted_at timestamptz NOT NULL DEFAULT now(),
    kept_results_dropped boolean NOT NULL DEFAULT false,
    kept_results_from integer NOT NULL DEFAULT 0
);

-- ---------------------------------------------------------------------------------------------
-- Inputs
-- ---------------------------------------------------------------------------------------------

-- Ownership of every input object the API wrote (uploads and inline records): a task may name an
-- object as its input only if its team owns it (minion_input_use). team NULL: uploaded by an
-- unscoped token without ?team=, usable only by unscoped submitters. One object may have several
-- owners (a content-addressed upload of the same bytes by two teams), one row each.
CREATE TABLE input_objects (
    uri         text NOT NULL CHECK (length(uri) BETWEEN 1 AND 2048),
    team        minion_name,
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    created_by  bigint REFERENCES api_tokens (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Last time a submission named it: the garbage collector's grace runs from here, so an upload
    -- being submitted right now is never judged unreferenced.
    used_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX input_objects_owner ON input_objects (uri, coalesce(team::text, ''));
CREATE INDEX input_objects_team ON input_objects (team);
CREATE INDEX input_objects_used ON input_objects (used_at);

-- S3 prefixes an operator allowed a team to read (`minions team allow-input TEAM s3://bucket/p`).
-- Stored with a trailing '/', so allowing s3://b/data never allows s3://b/data-other/x.
CREATE TABLE team_input_prefixes (
    team        minion_name NOT NULL,
    prefix      text NOT NULL CHECK (prefix ~ '^s3://[a-z0-9][a-z0-9.-]{1,62}/([^/]+/)*$'
                                     AND length(prefix) <= 1024),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team, prefix)
);

-- The inline records of a small task split at submission, kept with the task instead of in an
-- object: committed in the submission's own transaction, and each claim takes its range from here.
CREATE TABLE task_inputs (
    task_id  bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    team     minion_name NOT NULL,  -- the task's, for the team's quota when the task goes
    -- At most 1 MiB: the setting's bound (minions/config.py), so no claim answer carries more.
    data     bytea NOT NULL CHECK (length(data) BETWEEN 1 AND 1048576),
    bytes    bigint GENERATED ALWAYS AS (length(data)) STORED  -- as input_objects.bytes
);

-- Input bytes each team stores, what its quota is measured against: its input objects, the inputs
-- kept with its tasks and its OpenAI batch files, kept up to date by triggers (inputs.sql,
-- openai.sql), so a recording reads one row however many tasks the team ever kept. team '':
-- unscoped uploads (input_objects.team NULL).
CREATE TABLE team_input_usage (
    team   text PRIMARY KEY,
    bytes  bigint NOT NULL CHECK (bytes >= 0)
);

-- ---------------------------------------------------------------------------------------------
-- OpenAI's Files and Batches: what their objects carry that a task does not
-- ---------------------------------------------------------------------------------------------

CREATE TABLE openai_files (
    id          text PRIMARY KEY,                 -- 'file-<hex>'
    seq         bigserial UNIQUE,                 -- listing order
    team        minion_name,                      -- the uploading token's team; NULL: an unscoped token
    purpose     text NOT NULL,
    filename    text NOT NULL,
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    uri         text NOT NULL,                    -- where the store holds it
    created_by  bigint REFERENCES api_tokens (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);
CREATE INDEX openai_files_live ON openai_files (seq) WHERE deleted_at IS NULL;

CREATE TABLE openai_batches (
    id                 text PRIMARY KEY,          -- 'batch_<hex>'
    seq                bigserial UNIQUE,          -- listing order
    team               minion_name,
    task_id            bigint UNIQUE REFERENCES tasks (id),  -- NULL for a batch that failed validation
    endpoint           text NOT NULL,
    input_file_id      text NOT NULL REFERENCES openai_files (id),
    completion_window  text NOT NULL,
    metadata           jsonb,
    errors             jsonb,                     -- validation errors: [{"code","message","param","line"}]
    request_total      integer NOT NULL DEFAULT 0,
    record_total       integer NOT NULL DEFAULT 0,  -- task records (a list input is several)
    request_completed  integer,                   -- known once finalized
    request_failed     integer,
    output_file_id     text REFERENCES openai_files (id),
    error_file_id      text REFERENCES openai_files (id),
    ending             text CHECK (ending IN ('cancel', 'expire')),
    created_by         bigint REFERENCES api_tokens (id),
    created_at         timestamptz NOT NULL DEFAULT now(),
    in_progress_at     timestamptz,
    expires_at         timestamptz NOT NULL,
    finalizing_at      timestamptz,
    completed_at       timestamptz,
    failed_at          timestamptz,
    expired_at         timestamptz,
    cancelling_at      timestamptz,
    cancelled_at       timestamptz
);
-- The finalizer's work list: batches not yet ended.
CREATE INDEX openai_batches_open ON openai_batches (seq)
    WHERE completed_at IS NULL AND failed_at IS NULL AND expired_at IS NULL AND cancelled_at IS NULL;

-- ---- 02_settings.sql ----

-- Cluster-wide values, one home: the minion_settings table. SQL functions read them through these
-- accessors (never a parameter each caller passes in, so every process agrees by construction);
-- services read the same rows. The defaults here are the only defaults. Values are set through one
-- validating function, and every change is announced (NOTIFY minion_settings) so running services
-- re-read it without a restart.

INSERT INTO minion_settings (key, value)
VALUES ('store_signing_key', md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text)),
       ('lease_timeout_s', '120'),
       ('max_attempts', '3');

-- Any change to a cluster-wide value wakes the services that keep a copy (payload: the key).
CREATE FUNCTION minion_settings_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text := CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END;
BEGIN
    IF changed IN ('lease_timeout_s', 'max_attempts') THEN
        PERFORM pg_notify('minion_settings', changed);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER minion_settings_changed AFTER INSERT OR UPDATE OR DELETE ON minion_settings
    FOR EACH ROW EXECUTE FUNCTION minion_settings_notify();

-- Seconds without a heartbeat after which an executor's leases are lost.
CREATE FUNCTION minion_lease_timeout_s() RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::double precision FROM minion_settings WHERE key = 'lease_timeout_s'), 120)
$$;

-- Attempts a subtask gets before it fails its task, for tasks submitted without their own.
CREATE FUNCTION minion_max_attempts() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value::integer FROM minion_settings WHERE key = 'max_attempts'), 3)
$$;

-- Set one cluster-wide value, checked: an unknown key or a value that cannot work is refused
-- (check_violation, with a message naming the key). Returns the value stored.
CREATE FUNCTION minion_set_cluster_setting(p_key text, p_value text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    stored text;
BEGIN
    IF p_key = 'lease_timeout_s' THEN
        IF p_value !~ '^\s*[0-9]+(\.[0-9]+)?\s*$' OR p_value::double precision <= 0 THEN
            RAISE EXCEPTION 'lease_timeout_s must be a number of seconds > 0, not %', p_value
                USING ERRCODE = 'check_violation';
        END IF;
        stored := (p_value::double precision)::text;
    ELSIF p_key = 'max_attempts' THEN
        IF p_value !~ '^\s*[0-9]+\s*$' OR p_value::integer < 1 THEN
            RAISE EXCEPTION 'max_attempts must be an integer >= 1, not %', p_value
                USING ERRCODE = 'check_violation';
        END IF;
        stored := (p_value::integer)::text;
    ELSE
        RAISE EXCEPTION 'unknown cluster setting %: lease_timeout_s or max_attempts', p_key
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO minion_settings (key, value) VALUES (p_key, stored)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    RETURN stored;
END $$;

-- The cluster-wide values as one row, for services and `minions settings show`.
CREATE FUNCTION minion_cluster_settings(OUT lease_timeout_s double precision, OUT max_attempts integer)
LANGUAGE sql STABLE AS $$
    SELECT minion_lease_timeout_s(), minion_max_attempts()
$$;

-- ---- 03_notify.sql ----

-- NOTIFY channels. A notification is a wake-up, never the only record of work: every listener
-- also sweeps on start and after a reconnect.

-- tasks: one notification per new task (payload: task id); the splitter listens.
CREATE FUNCTION minion_notify_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tasks', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NOT NEW.split_done) EXECUTE FUNCTION minion_notify_task();

-- subtasks: the API wakes long-polling claims. Statement-level for inserts, so a split batch of
-- thousands of rows is one notification per capability, not one per row.
CREATE FUNCTION minion_notify_subtasks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cap text;
BEGIN
    FOR cap IN SELECT DISTINCT capability FROM new_subtasks WHERE state = 'pending' LOOP
        PERFORM pg_notify('subtasks', cap);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER subtasks_notify_insert AFTER INSERT ON subtasks
    REFERENCING NEW TABLE AS new_subtasks
    FOR EACH STATEMENT EXECUTE FUNCTION minion_notify_subtasks_inserted();

-- A subtask that returns to the queue (released, failed for a retry, reclaimed). Row-level with a
-- WHEN clause, so claims and completions (the hot path) never run it; PostgreSQL folds identical
-- notifications of one transaction into one, so a mass requeue is one per capability.
CREATE FUNCTION minion_notify_subtask_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('subtasks', NEW.capability);
    RETURN NULL;
END $$;

CREATE TRIGGER subtasks_notify_requeue AFTER UPDATE OF state ON subtasks
    FOR EACH ROW WHEN (NEW.state = 'pending' AND OLD.state IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION minion_notify_subtask_requeued();

-- heartbeats: the watchdog keeps deadlines only for executors that hold a lease.
-- Payload: '<executor_id> <live leases>'. Only heartbeats notify (UPDATE OF beat_at), never claims:
-- a NOTIFY serialises commits cluster-wide, which the claim path cannot afford.
CREATE FUNCTION minion_notify_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('heartbeats', NEW.executor_id::text || ' ' || minion_lease_count(NEW.executor_id)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER heartbeats_notify AFTER INSERT OR UPDATE OF beat_at ON heartbeats
    FOR EACH ROW EXECUTE FUNCTION minion_notify_heartbeat();

-- ---- 04_tasks.sql ----

-- Task lifecycle: submission, splitting, settling, cancelling. Each function is one atomic step.
--
-- Progress without a hot task row: a close adds to a progress slot of its own (task_progress_slots),
-- so completes of one task run side by side. A task's progress = its row + the sum of its slots (a
-- few rows: one per connection that closed some of its subtasks).
--
-- Ending the task exactly once, without that row: a close that sees (in its snapshot) no subtask
-- left open settles the task itself, under the task row's lock. A close that still sees open ones
-- returns at once when one of them is pending, or in flight and not being changed right now (not
-- row-locked): that subtask's closer decides later, with a later snapshot. The closer with the
-- latest decision therefore never takes that exit: it sees every other subtask closed (settles) or
-- sees only subtasks whose closers are in flight, which it cannot wait for (they may be waiting for
-- it); it then NOTIFYs 'tasks', and the splitter, holding no subtask lock, waits for them in
-- minion_settle_waiting and settles. Only the tail of a task (its last in-flight completes) takes
-- that path; the splitter's sweep runs it too, so a lost NOTIFY only delays.

-- What an executor must advertise to be handed a subtask: 'kind:model', or 'sleep:*' (the synthetic
-- workload needs no model). A model named with a revision is claimed as the model itself:
-- 'kind:name@revision' is 'kind:name' (the revision pins the task's fingerprint instead).
CREATE FUNCTION minion_capability(p_kind text, p_model text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_kind = 'sleep' THEN 'sleep:*'
                WHEN strpos(p_model, '@') = 0 THEN p_kind || ':' || p_model
                ELSE p_kind || ':' || regexp_replace(p_model, '@[^@]*$', '') END
$$;

CREATE FUNCTION minion_output_key(p_task_id bigint, p_subtask_id integer, p_attempt integer, p_token uuid)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'outputs/' || p_task_id::text || '/' || p_subtask_id::text || '/' || p_attempt::text || '-'
           || p_token::text || '.jsonl'
$$;

-- The splitter takes a task: returns where to resume (a crashed split resumes, never restarts,
-- because its first subtasks may already be leased). NULL when the task is no longer splittable.
CREATE FUNCTION minion_begin_split(p_task_id bigint,
    OUT split_offset bigint, OUT split_records bigint, OUT next_subtask_id integer)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks t SET status = CASE WHEN t.status = 'submitted' THEN 'splitting' ELSE t.status END
     WHERE t.id = p_task_id AND NOT t.split_done AND t.status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING t.split_offset, t.split_records INTO split_offset, split_records;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT coalesce(max(s.subtask_id) + 1, 0) INTO next_subtask_id FROM subtasks s WHERE s.task_id = p_task_id;
END $$;

-- One batch of subtasks, and the split's progress, in one statement's worth of work.
-- Returns false (and inserts nothing) when the task was cancelled or failed meanwhile.
CREATE FUNCTION minion_add_subtasks(p_task_id bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_first_subtask_id integer,
    p_split_offset bigint, p_split_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    n integer := cardinality(p_byte_starts);
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND OR t.status NOT IN ('submitted', 'splitting', 'queued', 'running') OR t.split_done THEN
        RETURN false;
    END IF;
    INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                          byte_start, byte_end, first_record, records)
    SELECT p_task_id, p_first_subtask_id + i - 1, t.team, t.project, t.name,
           minion_capability(t.kind, t.model), t.priority,
           p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
      FROM generate_subscripts(p_byte_starts, 1) AS i;
    UPDATE tasks SET open_subtasks = open_subtasks + n,
                     subtasks_total = subtasks_total + n,
                     split_offset = p_split_offset,
                     split_records = p_split_records
     WHERE id = p_task_id;
    RETURN true;
END $$;

CREATE FUNCTION minion_task_servable(p_team text, p_kind text, p_model text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM executors e
         WHERE e.status = 'online'
           AND minion_capability(p_kind, p_model) = ANY (e.capabilities)
           AND (e.team IS NULL OR e.team = p_team)
    )
$$;

-- A task's unfolded progress: its slots summed (zeros when it has none).
CREATE FUNCTION minion_task_slot_sums(p_task_id bigint,
    OUT closed bigint, OUT failed bigint, OUT records_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(p.closed), 0), coalesce(sum(p.failed), 0), coalesce(sum(p.records_done), 0)
      FROM task_progress_slots p WHERE p.task_id = p_task_id
$$;

-- Folds a task's slots into its row (the caller holds, or is about to take, the task row's lock).
CREATE FUNCTION minion_task_fold_slots(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (DELETE FROM task_progress_slots WHERE task_id = p_task_id RETURNING closed, failed, records_done)
    UPDATE tasks t
       SET open_subtasks = t.open_subtasks - g.closed,
           failed_subtasks = t.failed_subtasks + g.failed,
           records_done = t.records_done + g.records_done
      FROM (SELECT coalesce(sum(closed), 0) AS closed, coalesce(sum(failed), 0) AS failed,
                   coalesce(sum(records_done), 0) AS records_done FROM gone) g
     WHERE t.id = p_task_id AND g.closed + g.failed + g.records_done > 0;
END $$;

-- A task whose last open subtask closed, and whose split is finished, ends here, its progress slots
-- folded into its row.
CREATE FUNCTION minion_task_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sums record;
BEGIN
    -- The row lock first: a second settler waits here, then finds the task ended.
    PERFORM 1 FROM tasks WHERE id = p_task_id AND split_done AND status IN ('splitting', 'queued', 'running')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    sums := minion_task_slot_sums(p_task_id);
    IF (SELECT open_subtasks FROM tasks WHERE id = p_task_id) - sums.closed > 0 THEN
        RETURN;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks
       SET status = CASE WHEN failed_subtasks > 0 THEN 'failed' ELSE 'completed' END,
           finished_at = now()
     WHERE id = p_task_id;
END $$;

-- A subtask left the open states (done, or failed for good): counted in this backend's progress slot
-- (never the task row, which every close would otherwise queue on), then the task may settle.
CREATE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, p_error text DEFAULT NULL,
                                                 p_records integer DEFAULT 0)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
    VALUES (p_task_id, pg_backend_pid(), 1, p_failed::int, CASE WHEN p_failed THEN 0 ELSE p_records END)
    ON CONFLICT (task_id, slot) DO UPDATE
       SET closed = p.closed + 1, failed = p.failed + EXCLUDED.failed,
           records_done = p.records_done + EXCLUDED.records_done;
    IF p_failed THEN
        -- Rare: the task keeps its first failure's reason.
        UPDATE tasks SET error = p_error WHERE id = p_task_id AND error IS NULL;
    END IF;
    PERFORM minion_task_try_settle(p_task_id);
END $$;

-- The split's end: the task's subtask total is final. It settles through minion_task_try_settle, and
-- when that cannot decide, wakes the splitter, whose sweep settles it.
CREATE FUNCTION minion_finish_split(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks
       SET split_done = true,
           status = CASE WHEN status = 'splitting' THEN 'queued' ELSE status END
     WHERE id = p_task_id AND NOT split_done AND status IN ('splitting', 'queued', 'running');
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    -- Closes that ran before split_done committed could not decide: the sweep after this commit does.
    IF (SELECT finished_at IS NULL FROM tasks WHERE id = p_task_id) THEN
        PERFORM pg_notify('tasks', p_task_id::text);
    END IF;
END $$;

-- A malformed input fails the task and leaves no subtasks (nor progress slots) behind: any already
-- leased become stale, their tokens vanish with them, so a late complete gets 409.
CREATE FUNCTION minion_fail_split(p_task_id bigint, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled')
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- ended meanwhile (a cancel): its committed results stay
    END IF;
    DELETE FROM subtasks WHERE task_id = p_task_id;
    DELETE FROM task_progress_slots WHERE task_id = p_task_id;
    UPDATE tasks
       SET status = 'failed', error = p_error, finished_at = now(), split_done = true, open_subtasks = 0,
           subtasks_total = 0, failed_subtasks = 0, records_done = 0
     WHERE id = p_task_id;
END $$;

CREATE VIEW minion_tasks_to_settle AS
    SELECT t.id FROM tasks t
     WHERE t.split_done AND t.status IN ('splitting', 'queued', 'running')
       AND NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
                          AND s.priority = t.priority AND s.task_id = t.id);

-- The splitter's sweep: tasks whose split is done, that have not ended and have nothing pending
-- (the view minion_tasks_to_settle).
CREATE FUNCTION minion_settle_candidates(p_limit integer) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle ORDER BY id LIMIT p_limit
$$;

-- Those of the named tasks that may have ended: a primary-key probe each.
CREATE FUNCTION minion_settle_candidates_among(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM minion_tasks_to_settle WHERE id = ANY (p_ids) ORDER BY id
$$;

-- Submission is one SQL function, like every other state change. A task submitted without its own
-- max_attempts gets the cluster's (minion_max_attempts()). A small task can be split in the same
-- transaction: the API cuts its inline records and passes the subtasks' byte ranges, so they are
-- claimable the moment this commits, with no splitter hop. NULL ranges: the splitter splits it (big
-- inputs, inputs by URI). Returns the new task's row, already split when ranges were given; no row
-- when the name is taken (the caller answers like a re-submission).
CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text,
    p_model text, p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer,
    p_input_uri text, p_request_hash text, p_created_by bigint,
    p_byte_starts bigint[] DEFAULT NULL, p_byte_ends bigint[] DEFAULT NULL,
    p_first_records bigint[] DEFAULT NULL, p_records integer[] DEFAULT NULL)
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(p_byte_starts), 0);
    tid bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by,
                       status, split_done, open_subtasks, subtasks_total, split_offset, split_records)
    VALUES (p_team, p_project, p_name, p_kind, p_model, p_params, p_priority, p_subtask_size,
            coalesce(p_max_attempts, minion_max_attempts()), p_input_uri, p_request_hash, p_created_by,
            CASE WHEN n > 0 THEN 'queued' ELSE 'submitted' END, n > 0, n, n,
            CASE WHEN n > 0 THEN p_byte_ends[n] ELSE 0 END,
            CASE WHEN n > 0 THEN (SELECT sum(r) FROM unnest(p_records) AS r) ELSE 0 END)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO tid;
    IF tid IS NULL THEN
        RETURN;
    END IF;
    IF n > 0 THEN
        INSERT INTO subtasks (task_id, subtask_id, team, project, task_name, capability, priority,
                              byte_start, byte_end, first_record, records)
        SELECT tid, i - 1, p_team, p_project, p_name, minion_capability(p_kind, p_model), p_priority,
               p_byte_starts[i], p_byte_ends[i], p_first_records[i], p_records[i]
          FROM generate_subscripts(p_byte_starts, 1) AS i;
    END IF;
    RETURN QUERY SELECT * FROM tasks WHERE id = tid;
END $$;

-- The API's submission: minion_submit_task above, and the inline records themselves when they are
-- kept in the database (p_input_data; p_input_uri is then NULL, and the task must be split now:
-- p_input_data's ranges are given, and they end where its bytes do; the splitter never reads a kept
-- input). p_input_quota: the team's quota of stored input bytes (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0:
-- none), which kept inputs count against like objects: a kept input past it raises 'quota_exceeded'
-- (SQLSTATE 53400), and nothing is committed.
CREATE FUNCTION minion_submit_task(p_team text, p_project text, p_name text, p_kind text, p_model text,
    p_params jsonb, p_priority integer, p_subtask_size integer, p_max_attempts integer, p_input_uri text,
    p_request_hash text, p_created_by bigint, p_byte_starts bigint[], p_byte_ends bigint[],
    p_first_records bigint[], p_records integer[], p_input_data bytea, p_input_quota bigint DEFAULT 0)
RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
BEGIN
    IF p_input_data IS NOT NULL AND NOT coalesce(p_input_uri IS NULL AND cardinality(p_byte_ends) > 0
                                                 AND p_byte_ends[cardinality(p_byte_ends)] = length(p_input_data),
                                                 false) THEN
        RAISE EXCEPTION 'a kept input needs no input_uri and the subtasks of all its bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO t FROM minion_submit_task(p_team, p_project, p_name, p_kind, p_model, p_params, p_priority,
                                            p_subtask_size, p_max_attempts, p_input_uri, p_request_hash,
                                            p_created_by, p_byte_starts, p_byte_ends, p_first_records, p_records);
    IF NOT FOUND THEN
        RETURN;  -- the name is taken: answered as a re-submission, quota or not
    END IF;
    IF p_input_data IS NOT NULL THEN
        -- Last, so the team's count is held locked for as little as can be.
        IF p_input_quota > 0 THEN
            PERFORM minion_lock_team_inputs(p_team);
            IF minion_team_input_bytes(p_team) + length(p_input_data) > p_input_quota THEN
                RAISE EXCEPTION 'quota_exceeded' USING ERRCODE = 'configuration_limit_exceeded';
            END IF;
        END IF;
        INSERT INTO task_inputs (task_id, team, data) VALUES (t.id, p_team, p_input_data);
    END IF;
    RETURN NEXT t;
END $$;

-- Cancel: pending, leased and checking subtasks become cancelled at once (a checking one's held
-- results are dropped); a leased one's executor learns it at its next heartbeat (the token is kept so
-- the answer is 'cancelled', not 'lost'). The slots are folded before the cancelled are counted.
CREATE FUNCTION minion_cancel_task(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task. Completing, failing and reclaiming
    -- lock a subtask, then its task; taking the task first here would deadlock with them.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking')
      ORDER BY subtask_id FOR UPDATE;
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status NOT IN ('completed', 'failed', 'cancelled') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_fold_slots(p_task_id);
    UPDATE tasks SET status = 'cancelled', finished_at = now(), split_done = true,
                     cancelled_subtasks = open_subtasks, open_subtasks = 0
     WHERE id = p_task_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT task_id, subtask_id, attempts, lease_executor, lease_token, leased_at, 'cancelled', 'task cancelled'
      FROM subtasks WHERE task_id = p_task_id AND state = 'leased';
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    SELECT b.task_id, b.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at, 'cancelled',
           'task cancelled'
      FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
     WHERE b.task_id = p_task_id;
    UPDATE subtask_attempts a SET outcome = 'cancelled', error = 'task cancelled'
      FROM subtask_checks c
     WHERE c.task_id = p_task_id AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id
       AND a.lease_token = c.lease_token AND a.outcome = 'candidate';
    DELETE FROM subtask_checks WHERE task_id = p_task_id;
    DELETE FROM subtask_backups WHERE task_id = p_task_id;
    DELETE FROM minion_subtask_acquirement WHERE task_id = p_task_id;
    UPDATE subtasks SET state = 'cancelled', lease_executor = NULL
     WHERE task_id = p_task_id AND state IN ('pending', 'leased', 'checking');
    RETURN true;
END $$;

-- Settles one of them once the closes in flight (of leased and checking subtasks) have committed:
-- this session holds no subtask lock (one task per statement), so it may wait for them. Returns
-- whether the task ended.
CREATE FUNCTION minion_settle_waiting(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- Waits for each in-flight close, then sees the row as it committed.
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('pending', 'leased', 'checking') FOR KEY SHARE;
    IF FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_task_settle(p_task_id);
    RETURN (SELECT finished_at IS NOT NULL FROM tasks WHERE id = p_task_id);
END $$;

-- After a close (or the end of a split): settle now if nothing else is open, return when a later
-- closer will decide, else hand the decision to the splitter. Inside a batch the batch decides, once
-- per task after its last close (minion_defer_settle). The pending probe comes first, reading the
-- queue backwards from the task's tail; a leased or checking subtask is in flight; the slots' sum is
-- read only when nothing is pending or in flight.
CREATE FUNCTION minion_task_try_settle(p_task_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    IF minion_settle_deferred() THEN
        RETURN;  -- minion_settle_after_batch decides
    END IF;
    SELECT split_done, status, kind, model, priority, open_subtasks INTO t FROM tasks WHERE id = p_task_id;
    IF NOT FOUND OR NOT t.split_done OR t.status NOT IN ('splitting', 'queued', 'running') THEN
        RETURN;  -- not split yet: minion_finish_split decides
    END IF;
    -- One probe of the queue index (capability, priority and task known), from the tail.
    PERFORM 1 FROM subtasks s
      WHERE s.state = 'pending' AND s.capability = minion_capability(t.kind, t.model)
        AND s.priority = t.priority AND s.task_id = p_task_id
      ORDER BY s.subtask_id DESC LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF t.open_subtasks - (minion_task_slot_sums(p_task_id)).closed <= 0 THEN
        PERFORM minion_task_settle(p_task_id);
        RETURN;
    END IF;
    PERFORM 1 FROM subtasks s WHERE s.task_id = p_task_id AND s.state IN ('leased', 'checking')
      LIMIT 1 FOR KEY SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('tasks', p_task_id::text);
END $$;

CREATE FUNCTION minion_task_counts(p_task_id bigint,
    OUT subtasks_total bigint, OUT subtasks_pending bigint, OUT subtasks_leased bigint,
    OUT subtasks_done bigint, OUT subtasks_failed bigint, OUT subtasks_cancelled bigint,
    OUT records_done bigint, OUT subtasks_checking bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.subtasks_total, t.open_subtasks - p.closed - l.leased - l.checking, l.leased,
           t.subtasks_total - (t.open_subtasks - p.closed) - (t.failed_subtasks + p.failed) - t.cancelled_subtasks,
           t.failed_subtasks + p.failed, t.cancelled_subtasks, t.records_done + p.records_done, l.checking
      FROM tasks t
     CROSS JOIN LATERAL minion_task_slot_sums(t.id) p
     CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE s.state = 'leased') AS leased,
                                count(*) FILTER (WHERE s.state = 'checking') AS checking
                           FROM subtasks s
                          WHERE s.task_id = t.id AND s.state IN ('leased', 'checking')) l
     WHERE t.id = p_task_id
$$;

-- ---- 05_executors.sql ----

-- Executors: registration (one machine, one row, bounded per token), the model fingerprints they
-- serve with (and their history, so every attempt says which model it ran on), and their status.

-- What an executor is handed: 'kind:model' for each advertised kind and model, 'sleep:*' for sleep.
CREATE FUNCTION minion_capabilities(p_kinds text[], p_models text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(DISTINCT c ORDER BY c), '{}') FROM (
        SELECT minion_capability(k, m) AS c
          FROM unnest(p_kinds) AS k
         CROSS JOIN unnest(CASE WHEN cardinality(p_models) = 0 THEN ARRAY['*'] ELSE p_models END) AS m
         WHERE k = 'sleep' OR m <> '*'
    ) caps
$$;

-- Register, or register again (same token and name: the same row, updated, back online).
-- p_preferences: [{"team", "project", "task_name"}, ...] in order of preference.
CREATE FUNCTION minion_register_executor(p_token_id bigint, p_team text, p_name text, p_hardware jsonb,
                                         p_kinds text[], p_models text[], p_preferences jsonb)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    ex_id uuid;
BEGIN
    INSERT INTO executors AS e (token_id, team, name, hardware, kinds, models, capabilities, status)
    VALUES (p_token_id, p_team, p_name, p_hardware, p_kinds, p_models,
            minion_capabilities(p_kinds, p_models), 'online')
    ON CONFLICT (token_id, name) DO UPDATE
        SET team = excluded.team, hardware = excluded.hardware, kinds = excluded.kinds,
            models = excluded.models, capabilities = excluded.capabilities, status = 'online',
            registered_at = now()
    RETURNING e.id INTO ex_id;

    -- A process that registers holds no lease: any the row still holds belonged to a predecessor
    -- under the same name (a restarted agent), whose work is gone. Without this they would stay
    -- leased for good: the new process keeps the row's heartbeat fresh.
    PERFORM minion_end_executor_leases(ex_id, 'lost',
        'executor restarted (registered again) while holding this lease', true);

    DELETE FROM executor_preferences WHERE executor_id = ex_id;
    INSERT INTO executor_preferences (executor_id, position, team, project, task_name)
    SELECT ex_id, (p.ord - 1)::integer, p.value ->> 'team', p.value ->> 'project', p.value ->> 'task_name'
      FROM jsonb_array_elements(p_preferences) WITH ORDINALITY AS p(value, ord);

    PERFORM minion_beat(ex_id);
    RETURN ex_id;
END $$;

-- An executor as users see it. status: busy (holds a lease), idle (heartbeating, no lease),
-- offline (deregistered, or silent without a lease), lost (the watchdog took its work back).
CREATE FUNCTION minion_executor_status(p_status text, p_leases integer, p_beat_at timestamptz,
                                       p_lease_timeout_s double precision)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_status IN ('offline', 'lost') THEN p_status
                WHEN p_leases > 0 THEN 'busy'
                WHEN p_beat_at > now() - make_interval(secs => p_lease_timeout_s) THEN 'idle'
                ELSE 'offline' END
$$;

-- Once fixed, a task's fingerprint stays: its only writer is the claim's pin (minion_claim_pin_tasks), an UPDATE
-- conditional on the task having none. (Not a BEFORE UPDATE trigger: that would fetch the task row
-- once more in every update of a task, the claim's and the complete's included.)

-- The fingerprint an executor claims a capability with: what it reported, else its own
-- 'unknown:<id>'; NULL for sleep (nothing to pin).
CREATE FUNCTION minion_executor_fingerprint(p_executor uuid, p_cap text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_cap = 'sleep:*' THEN NULL
                ELSE coalesce((SELECT f.fingerprint FROM executor_fingerprints f
                                WHERE f.executor_id = p_executor AND f.capability = p_cap),
                              'unknown:' || p_executor::text) END
$$;

-- The fingerprint and precision of the model an attempt of capability p_cap, started at p_at on
-- p_executor, ran on: what the executor had registered then; 'unknown:<executor id>' (precision
-- NULL) where it had reported none; NULL for sleep.
CREATE FUNCTION minion_attempt_model(p_executor uuid, p_cap text, p_at timestamptz,
                                     OUT fingerprint text, OUT "precision" text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_cap = 'sleep:*' OR p_executor IS NULL THEN NULL
                ELSE coalesce(h.fingerprint, 'unknown:' || p_executor::text) END,
           h.precision
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (
            SELECT x.fingerprint, x.precision FROM executor_fingerprint_history x
             WHERE x.executor_id = p_executor AND x.capability = p_cap AND x.valid_from <= p_at
               AND (x.valid_to IS NULL OR x.valid_to > p_at) AND p_cap <> 'sleep:*'
             ORDER BY x.valid_from DESC LIMIT 1) h ON true
$$;

-- `model` submitted as 'name@revision': the task's model is the name, its fingerprint the revision
-- (lower case, as agents report hashes), recorded as the submission's pin so it is never given back.
-- The API has checked the revision's form.
CREATE FUNCTION minion_task_model_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind <> 'sleep' AND strpos(NEW.model, '@') > 0 THEN
        NEW.fingerprint := lower(substring(NEW.model FROM '@([^@]*)$'));
        NEW.model := regexp_replace(NEW.model, '@[^@]*$', '');
        NEW.fingerprint_from_revision := true;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tasks_model_revision BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION minion_task_model_revision();

-- Registration bounded per executor token. verdict: 'ok' (executor_id set), 'too_many_executors'
-- (the token holds p_max_executors names in use already: registered in the last 7 days or heard from
-- in the last day), 'too_many_registrations' (it added p_per_minute names in the last minute;
-- retry_after_s: when the oldest of them leaves the window). Checked under a lock per token, because
-- several API processes register against one database. Registering a name the token already holds
-- (an agent restarting) is neither counted nor locked: it is the same row, updated.
CREATE FUNCTION minion_register_executor_bounded(p_token_id bigint, p_team text, p_name text,
                                                            p_hardware jsonb, p_kinds text[], p_models text[],
                                                            p_preferences jsonb, p_max_executors integer,
                                                            p_per_minute integer, OUT verdict text,
                                                            OUT executor_id uuid, OUT retry_after_s integer)
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    recent integer;
    oldest timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
        -- One new name of a token at a time, so two API processes cannot both squeeze under a bound.
        PERFORM pg_advisory_xact_lock(hashtextextended('minion_register:' || p_token_id::text, 0));
        -- Read again under the lock: a registration of this very name may have committed meanwhile.
        IF NOT EXISTS (SELECT 1 FROM executors e WHERE e.token_id = p_token_id AND e.name = p_name) THEN
            SELECT count(*) FILTER (WHERE e.registered_at > now() - interval '7 days'
                                       OR h.alive_at > now() - interval '1 day'),
                   count(*) FILTER (WHERE e.created_at > now() - interval '1 minute'),
                   min(e.created_at) FILTER (WHERE e.created_at > now() - interval '1 minute')
              INTO held, recent, oldest
              FROM executors e LEFT JOIN heartbeats h ON h.executor_id = e.id
             WHERE e.token_id = p_token_id;
            IF held >= p_max_executors THEN
                verdict := 'too_many_executors';
                RETURN;
            END IF;
            IF recent >= p_per_minute THEN
                verdict := 'too_many_registrations';
                retry_after_s := greatest(1, ceil(extract(epoch FROM oldest + interval '1 minute' - now())))::integer;
                RETURN;
            END IF;
        END IF;
    END IF;
    verdict := 'ok';
    executor_id := minion_register_executor(p_token_id, p_team, p_name, p_hardware, p_kinds, p_models,
                                            p_preferences);
END $$;

-- Registration: the executor's fingerprints replaced by those it reports now (the old ones closed in
-- the history), p_fingerprints = [{"model", "fingerprint", "precision", "backend", "proofs"}, ...]
-- (checked by the API), one row per non-sleep kind it serves. Run in the registration's transaction
-- after minion_register_executor_bounded, so leases that registration ended are recorded with the
-- fingerprints they ran with. A registration that reports what the executor already has changes
-- nothing; one that changes its fingerprints, or the proofs it makes, resets its trust. An executor
-- keeps its latest 64 history periods (registrations of a held name are not rate-limited): an
-- attempt older than all of them reads as `unknown:<executor id>`.
CREATE FUNCTION minion_set_executor_fingerprints(p_executor uuid, p_fingerprints jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();  -- after this registration ended the executor's leases
    fresh jsonb;
    held jsonb;
    oldest_kept timestamptz;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.capability, x.model, x.fingerprint, x.precision, x.backend,
                                                x.proofs)
                              ORDER BY x.capability), '[]')
      INTO fresh
      FROM (SELECT DISTINCT ON (minion_capability(k, f.value ->> 'model'))
                   minion_capability(k, f.value ->> 'model') AS capability, f.value ->> 'model' AS model,
                   lower(f.value ->> 'fingerprint') AS fingerprint, f.value ->> 'precision' AS precision,
                   f.value ->> 'backend' AS backend, (f.value ->> 'proofs')::smallint AS proofs
              FROM jsonb_array_elements(p_fingerprints) AS f(value)
              JOIN executors e ON e.id = p_executor
             CROSS JOIN unnest(e.kinds) AS k
             WHERE k <> 'sleep'
             ORDER BY minion_capability(k, f.value ->> 'model')) x;
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.capability, f.model, f.fingerprint, f.precision, f.backend,
                                                f.proofs)
                              ORDER BY f.capability), '[]')
      INTO held
      FROM executor_fingerprints f WHERE f.executor_id = p_executor;
    IF fresh = held THEN
        RETURN jsonb_array_length(fresh);
    END IF;

    -- New fingerprints: trust starts again (its next results are checked until it agrees again).
    UPDATE executors SET agreements = 0, trusted = false WHERE id = p_executor;
    UPDATE executor_fingerprint_history SET valid_to = at WHERE executor_id = p_executor AND valid_to IS NULL;
    DELETE FROM executor_fingerprints WHERE executor_id = p_executor;
    INSERT INTO executor_fingerprints (executor_id, capability, model, fingerprint, precision, backend, proofs)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, (r ->> 5)::smallint
      FROM jsonb_array_elements(fresh) AS r;
    INSERT INTO executor_fingerprint_history (executor_id, capability, model, fingerprint, precision, backend,
                                              valid_from)
    SELECT p_executor, r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, at FROM jsonb_array_elements(fresh) AS r;

    SELECT p.valid_from INTO oldest_kept
      FROM (SELECT DISTINCT h.valid_from FROM executor_fingerprint_history h
             WHERE h.executor_id = p_executor ORDER BY h.valid_from DESC OFFSET 63 LIMIT 1) p;
    IF oldest_kept IS NOT NULL THEN
        DELETE FROM executor_fingerprint_history h WHERE h.executor_id = p_executor AND h.valid_from < oldest_kept;
    END IF;
    RETURN jsonb_array_length(fresh);
END $$;

-- ---- 06_leases.sql ----

-- Leases: claim, heartbeat, complete, fail, release, reclaim. Each is one function, so an operator
-- can do from psql exactly what the services do. Tokens fence every step after the claim: a token
-- that is no longer current changes nothing (invariant 2). The batched steps (minion_claim_batch,
-- minion_complete_batch, minion_fail_batch, minion_release_batch, minion_heartbeat_as) are what the
-- API runs: one statement per step, the caller's API token checked in the same call.

-- Live leases of an executor: its leased subtasks and its straggler backups.
CREATE FUNCTION minion_lease_count(p_executor uuid) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT ((SELECT count(*) FROM subtasks WHERE lease_executor = p_executor AND state = 'leased')
          + (SELECT count(*) FROM subtask_backups WHERE executor_id = p_executor))::integer
$$;

-- A heartbeat (or a registration): the executor is alive. NOTIFYs 'heartbeats' via the trigger.
CREATE FUNCTION minion_beat(p_executor uuid) RETURNS void LANGUAGE sql AS $$
    INSERT INTO heartbeats AS h (executor_id, beat_at, seen_at) VALUES (p_executor, now(), now())
    ON CONFLICT (executor_id) DO UPDATE SET beat_at = now()
$$;

-- A claim: the executor is alive too, but this must not notify (see notify.sql).
CREATE FUNCTION minion_seen(p_executor uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE heartbeats SET seen_at = now() WHERE executor_id = p_executor
$$;

-- The claim: the executor's preferences first, in order, then its whole queue (its token's team,
-- or every team), and only the kind:model pairs it advertised; with nothing pending and
-- p_backup_factor > 0, a backup of a straggler. Returns no row when nothing fits.
CREATE FUNCTION minion_claim(p_executor uuid, p_lease_timeout_s double precision,
                             p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (lease_token uuid, expires_at timestamptz, task_id bigint, subtask_id integer,
               attempt integer, team text, project text, task_name text, kind text, model text,
               params jsonb, input_uri text, byte_start bigint, byte_end bigint, records integer,
               output_key text, backup boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ex executors%ROWTYPE;
    pref record;
    tok uuid;
    is_backup boolean := false;
    won subtasks%ROWTYPE;
BEGIN
    SELECT * INTO ex FROM executors WHERE id = p_executor;
    IF NOT FOUND OR ex.status = 'offline' THEN
        RETURN;
    END IF;
    FOR pref IN SELECT p.team, p.project, p.task_name FROM executor_preferences p
                 WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 ORDER BY p.position LOOP
        tok := minion_claim_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name);
        EXIT WHEN tok IS NOT NULL;
    END LOOP;
    IF tok IS NULL THEN
        tok := minion_claim_in(p_executor, ex.capabilities, ex.team, NULL, NULL);
    END IF;
    IF tok IS NULL AND p_backup_factor > 0 THEN
        tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
        is_backup := tok IS NOT NULL;
    END IF;
    IF tok IS NULL THEN
        RETURN;
    END IF;

    IF is_backup THEN
        SELECT s.* INTO won FROM subtasks s JOIN subtask_backups b USING (task_id, subtask_id)
         WHERE b.lease_token = tok;
    ELSE
        SELECT * INTO won FROM subtasks s WHERE s.lease_token = tok;
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = won.task_id AND status IN ('splitting', 'queued');
    END IF;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    RETURN QUERY
    SELECT tok, now() + make_interval(secs => p_lease_timeout_s), won.task_id, won.subtask_id,
           won.attempts, won.team::text, won.project::text, won.task_name::text, t.kind, t.model,
           t.params, t.input_uri, won.byte_start, won.byte_end, won.records,
           minion_output_key(won.task_id, won.subtask_id, won.attempts, tok), is_backup
      FROM tasks t WHERE t.id = won.task_id;
END $$;

-- Ends the current attempt of a leased subtask (locked by the caller): history, referee row,
-- then back to pending or failed for good. p_counts: whether the attempt counts towards
-- max_attempts (a release does not).
CREATE FUNCTION minion_end_attempt(s subtasks, p_outcome text, p_error text, p_counts boolean,
                                   p_retry boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_att integer;
    backup subtask_backups%ROWTYPE;
BEGIN
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
            p_outcome, p_error);

    -- A running backup takes over the lease: its work goes on, nothing is requeued.
    SELECT * INTO backup FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF FOUND THEN
        DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE subtasks
           SET lease_token = backup.lease_token, lease_executor = backup.executor_id,
               leased_at = backup.leased_at, last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        UPDATE minion_subtask_acquirement SET executor_id = backup.executor_id, lease_token = backup.lease_token
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        RETURN;
    END IF;

    DELETE FROM minion_subtask_acquirement WHERE lease_token = s.lease_token;
    SELECT max_attempts INTO max_att FROM tasks WHERE id = s.task_id;

    IF p_retry AND (NOT p_counts OR s.attempts < max_att) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL,
               attempts = attempts - (NOT p_counts)::int,
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', lease_executor = NULL, done_at = now(),
               last_error = coalesce(p_error, last_error)
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed after %s attempt(s): %s', s.subtask_id, s.attempts,
                   coalesce(p_error, s.last_error)));
    END IF;
END $$;

-- Locks the subtask a token names, as its lease or as its backup (a NULL row when neither).
CREATE FUNCTION minion_lock_subtask_of(p_token uuid) RETURNS subtasks LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
BEGIN
    SELECT * INTO s FROM subtasks WHERE lease_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        SELECT sub.* INTO s FROM subtasks sub
          JOIN subtask_backups b ON b.task_id = sub.task_id AND b.subtask_id = sub.subtask_id
         WHERE b.lease_token = p_token
           FOR UPDATE OF sub;
    END IF;
    RETURN s;
END $$;

-- Ends the lease a token names, as primary or backup: 'ok', or 'lost' / 'cancelled' when the
-- token is no longer current. p_counts, p_retry: see minion_end_attempt (a backup just ends). A held
-- candidate's token ends nothing; a replica ends as a backup, which re-offers its subtask.
CREATE FUNCTION minion_end_lease(p_token uuid, p_outcome text, p_error text, p_counts boolean,
                                            p_retry boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'primary' THEN
        PERFORM minion_end_attempt(s, p_outcome, p_error, p_counts, p_retry);
    ELSIF role IN ('backup', 'replica') THEN
        PERFORM minion_end_backup(p_token, p_outcome, p_error);
    ELSIF role = 'held' THEN
        RETURN 'lost';
    ELSE
        RETURN role;
    END IF;
    RETURN 'ok';
END $$;

-- A failed attempt: requeued while attempts remain and the error is retryable, else failed for
-- good with this error. Returns 'ok', 'lost' or 'cancelled'.
CREATE FUNCTION minion_fail(p_token uuid, p_error text, p_retryable boolean)
RETURNS text LANGUAGE sql AS $$
    SELECT minion_end_lease(p_token, 'failed', p_error, true, p_retryable)
$$;

-- The executor hands the subtask back (owner came back, shutdown): requeued at once, the attempt
-- does not count.
CREATE FUNCTION minion_release(p_token uuid) RETURNS text LANGUAGE sql AS $$
    SELECT minion_end_lease(p_token, 'released', NULL, false, true)
$$;

-- Ends every lease and backup an executor holds, in a fixed order (no deadlocks between two
-- callers). Returns how many.
CREATE FUNCTION minion_end_executor_leases(p_executor uuid, p_outcome text, p_error text, p_counts boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    tok uuid;
    n integer := 0;
BEGIN
    FOR s IN SELECT * FROM subtasks
              WHERE lease_executor = p_executor AND state = 'leased'
              ORDER BY task_id, subtask_id FOR UPDATE LOOP
        PERFORM minion_end_attempt(s, p_outcome, p_error, p_counts, true);
        n := n + 1;
    END LOOP;
    FOR tok IN SELECT b.lease_token FROM subtask_backups b WHERE b.executor_id = p_executor LOOP
        PERFORM minion_end_backup(tok, p_outcome, p_error);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- The watchdog's step: if the executor has really been silent for the lease timeout (checked here,
-- under a row lock, so a heartbeat racing with us wins or loses cleanly), mark it lost and return
-- its subtasks to the queue, or fail those out of attempts. Returns how many subtasks it took back.
CREATE FUNCTION minion_reclaim_executor(p_executor uuid, p_lease_timeout_s double precision)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    silent_s double precision;
BEGIN
    SELECT extract(epoch FROM now() - alive_at) INTO silent_s FROM heartbeats
     WHERE executor_id = p_executor AND alive_at < now() - make_interval(secs => p_lease_timeout_s)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    n := minion_end_executor_leases(p_executor, 'lost',
        format('executor %s lost: no heartbeat for %s s', p_executor, round(silent_s::numeric, 1)), true);
    IF n > 0 THEN
        UPDATE executors SET status = 'lost' WHERE id = p_executor;
    END IF;
    RETURN n;
END $$;

-- The watchdog's reclaims at the cluster's lease timeout. The two-argument versions take an explicit
-- timeout (tests, an operator's manual reclaim); these delegate to them.
CREATE FUNCTION minion_reclaim_executor(p_executor uuid) RETURNS integer LANGUAGE sql AS $$
    SELECT minion_reclaim_executor(p_executor, minion_lease_timeout_s())
$$;

-- Executors that hold a lease or a backup (the only ones the watchdog watches).
CREATE FUNCTION minion_lease_holders() RETURNS TABLE (executor_id uuid) LANGUAGE sql STABLE AS $$
    SELECT lease_executor FROM subtasks WHERE state = 'leased'
    UNION
    SELECT executor_id FROM subtask_backups
$$;

-- The sweep: every silent lease holder, in one call. Returns the subtasks taken back.
CREATE FUNCTION minion_reclaim_expired(p_lease_timeout_s double precision)
RETURNS integer LANGUAGE sql AS $$
    SELECT coalesce(sum(minion_reclaim_executor(h.executor_id, p_lease_timeout_s)), 0)::integer
      FROM heartbeats h
     WHERE h.alive_at < now() - make_interval(secs => p_lease_timeout_s)
       AND h.executor_id IN (SELECT executor_id FROM minion_lease_holders())
$$;

CREATE FUNCTION minion_reclaim_expired() RETURNS integer LANGUAGE sql AS $$
    SELECT minion_reclaim_expired(minion_lease_timeout_s())
$$;

-- Deregister: hand back every lease, then go offline.
CREATE FUNCTION minion_deregister(p_executor uuid) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    n := minion_end_executor_leases(p_executor, 'released', NULL, false);
    UPDATE executors SET status = 'offline' WHERE id = p_executor;
    RETURN n;
END $$;

-- Why an executor may not act, or NULL when it may: p_token_id is the caller's API token (NULL: an
-- admin, who may act for any executor).
CREATE FUNCTION minion_executor_refusal(ex executors, p_token_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ex.id IS NULL THEN 'not_found'
                WHEN p_token_id IS NOT NULL AND ex.token_id IS DISTINCT FROM p_token_id THEN 'not_your_executor'
                END
$$;

-- The heartbeat with its ownership check in the same call: one row (lease_token NULL) whose
-- verdict is 'ok' or why not ('not_found', 'not_your_executor'), then, when 'ok', minion_heartbeat's
-- rows with the cluster's lease timeout as the grace for leases it does not name.
CREATE FUNCTION minion_heartbeat_as(p_executor uuid, p_token_id bigint, p_tokens uuid[])
RETURNS TABLE (verdict text, lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ex executors%ROWTYPE;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := coalesce(minion_executor_refusal(ex, p_token_id), 'ok');
    RETURN NEXT;
    IF verdict <> 'ok' THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ok', h.lease_token, h.state
                   FROM minion_heartbeat(p_executor, p_tokens, minion_lease_timeout_s()) h;
END $$;

CREATE FUNCTION minion_release_batch(p_tokens uuid[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_release(p_tokens[i]);
        RETURN NEXT;
    END LOOP;
END $$;

-- Whether this transaction is inside a batch that decides its tasks' ends itself, at its end
-- (minion_settle_after_batch): a transaction-local setting, so an error, a rollback or the
-- transaction's end clears it.
CREATE FUNCTION minion_settle_deferred() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('minions.settle_deferred', true), '') = 'on'
$$;

-- The tasks of a batch's tokens (leases and backups), in task order: read before the batch ends them
-- (a subtask's task never changes).
CREATE FUNCTION minion_tasks_of_tokens(p_tokens uuid[]) RETURNS bigint[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT x.task_id ORDER BY x.task_id), '{}')
      FROM (SELECT s.task_id FROM subtasks s WHERE s.lease_token = ANY (p_tokens)
            UNION ALL
            SELECT b.task_id FROM subtask_backups b WHERE b.lease_token = ANY (p_tokens)) x
$$;

-- Starts a batch whose closes defer their task's end (see minion_task_try_settle).
CREATE FUNCTION minion_defer_settle() RETURNS void LANGUAGE sql AS $$
    SELECT set_config('minions.settle_deferred', 'on', true)
$$;

-- Ends it: each task of the batch decided once, in task order (as a close would, after its last one).
CREATE FUNCTION minion_settle_after_batch(p_task_ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    tid bigint;
BEGIN
    PERFORM set_config('minions.settle_deferred', '', true);
    FOREACH tid IN ARRAY p_task_ids LOOP
        PERFORM minion_task_try_settle(tid);
    END LOOP;
END $$;

CREATE FUNCTION minion_fail_batch(p_tokens uuid[], p_errors text[], p_retryable boolean[])
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_fail(p_tokens[i], p_errors[i], p_retryable[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

CREATE FUNCTION minion_drop_referee_row(p_token uuid) RETURNS void
LANGUAGE sql SET enable_seqscan = off AS $$
    DELETE FROM minion_subtask_acquirement WHERE lease_token = p_token
$$;

-- One claim within one filter (a preference tier, or the executor's whole queue): the first
-- pending subtask in claim order (priority, then FIFO) among the capabilities the executor serves.
-- Contenders take row locks with SKIP LOCKED, so they pass over each other's rows instead of
-- queueing behind them (bench/claim.py measures the paper's blocking INSERT race against this).
-- The paper's referee stays: the lease is a row of minion_subtask_acquirement, whose UNIQUE key
-- admits one live lease per subtask whatever path tries to make a second. Each capability's probe
-- passes over tasks pinned to another fingerprint, and the subtask found is taken only once its
-- task is pinned to this executor's (minion_claim_pin_tasks).
-- Returns the won lease token, or NULL when nothing in this filter is pending.
CREATE FUNCTION minion_claim_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                           p_task_name text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    t record;
    found_one boolean := false;
    tok uuid := gen_random_uuid();
    fps text[] := ARRAY(SELECT minion_executor_fingerprint(p_executor, c) FROM unnest(p_caps) AS c);
BEGIN
    -- A second probe only after a lost pin race (the task is pinned to another fingerprint now).
    FOR pass IN 1 .. 2 LOOP
        found_one := false;
        IF p_team IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSIF p_project IS NULL THEN
            SELECT q.task_id, q.subtask_id, q.team, q.project, q.task_name INTO cand
              FROM unnest(p_caps, fps) AS c(cap, fp)
             CROSS JOIN LATERAL (
                   SELECT s.priority, s.task_id, s.subtask_id, s.team, s.project, s.task_name FROM subtasks s
                    WHERE s.state = 'pending' AND s.team = p_team AND s.capability = c.cap
                      AND (c.fp IS NULL
                           OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), c.fp) = c.fp)
                    ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1
                      FOR UPDATE SKIP LOCKED) q
             ORDER BY q.priority DESC, q.task_id, q.subtask_id LIMIT 1;
            found_one := FOUND;
        ELSE
            -- A project or a task: through its few open task rows, each an O(log n) probe of the
            -- queue index (capability, priority and task are all known).
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint FROM tasks
                      WHERE team = p_team AND project = p_project
                        AND (p_task_name IS NULL OR name = p_task_name)
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY priority DESC, id LOOP
                CONTINUE WHEN NOT (t.cap = ANY (p_caps));
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT s.task_id, s.subtask_id, s.team, s.project, s.task_name INTO cand FROM subtasks s
                 WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority AND s.task_id = t.id
                 ORDER BY s.subtask_id LIMIT 1
                   FOR UPDATE SKIP LOCKED;
                found_one := FOUND;
                EXIT WHEN found_one;
            END LOOP;
        END IF;
        IF NOT found_one THEN
            RETURN NULL;
        END IF;
        EXIT WHEN cardinality(minion_claim_pin_tasks(p_executor, ARRAY[cand.task_id])) = 0;
        found_one := false;
    END LOOP;
    IF NOT found_one THEN
        RETURN NULL;
    END IF;

    INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
    VALUES (cand.team, cand.project, cand.task_name, cand.subtask_id, cand.task_id, p_executor, tok);
    UPDATE subtasks
       SET state = 'leased', lease_token = tok, lease_executor = p_executor, leased_at = now(),
           attempts = attempts + 1
     WHERE task_id = cand.task_id AND subtask_id = cand.subtask_id;
    RETURN tok;
END $$;

-- A second run of a subtask in state p_state (a straggler's backup, a checking subtask's replica)
-- for p_executor: its backup row, taken under the subtask's lock, so a completion racing with it
-- either finishes first (skipped) or sees the row. Its token, or NULL when the subtask moved on or
-- another executor took its second run first.
CREATE FUNCTION minion_take_second_run(p_task_id bigint, p_subtask_id integer, p_state text, p_executor uuid)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    tok uuid := gen_random_uuid();
BEGIN
    PERFORM 1 FROM subtasks
      WHERE task_id = p_task_id AND subtask_id = p_subtask_id AND state = p_state
      FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO subtask_backups (task_id, subtask_id, lease_token, executor_id)
    VALUES (p_task_id, p_subtask_id, tok, p_executor)
    ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN tok END;
END $$;

-- A backup of a straggler: a lease of a task with nothing left pending that has run longer than
-- p_factor times the median of the task's finished attempts (at least three of them), taken only by
-- an executor of the task's fingerprint (a backed-up task has leases, so it is pinned). The oldest
-- such lease first. Returns the backup's token, or NULL.
CREATE FUNCTION minion_claim_backup(p_executor uuid, p_caps text[], p_team text, p_factor double precision)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    FOR cand IN
        WITH leased AS (
            -- Few rows: one per busy executor (partial index subtasks_leased_at).
            SELECT s.task_id, s.subtask_id, s.leased_at, s.capability, s.priority FROM subtasks s
             WHERE s.state = 'leased' AND s.capability = ANY (p_caps)
               AND (p_team IS NULL OR s.team = p_team) AND s.lease_executor <> p_executor
               AND (s.capability = 'sleep:*'
                    OR (SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id)
                       = minion_executor_fingerprint(p_executor, s.capability))
        ), tails AS (
            -- Tasks with nothing left pending: the only ones whose stragglers hold up the end.
            SELECT DISTINCT l.task_id FROM leased l
             WHERE NOT EXISTS (SELECT 1 FROM subtasks p
                                WHERE p.state = 'pending' AND p.capability = l.capability
                                  AND p.priority = l.priority AND p.task_id = l.task_id)
        ), thresholds AS (
            -- Once per task, over its latest 1,000 finished attempts: bounded, whatever its size.
            SELECT t.task_id, p_factor * make_interval(secs => m.median_s) AS too_long
              FROM tails t
             CROSS JOIN LATERAL (
                   SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.secs) AS median_s, count(*) AS n
                     FROM (SELECT extract(epoch FROM a.ended_at - a.started_at) AS secs
                             FROM subtask_attempts a
                            WHERE a.task_id = t.task_id AND a.outcome = 'done'
                            ORDER BY a.ended_at DESC LIMIT 1000) x) m
             WHERE m.n >= 3
        )
        SELECT l.task_id, l.subtask_id FROM leased l JOIN thresholds th ON th.task_id = l.task_id
         WHERE now() - l.leased_at > th.too_long
           AND NOT EXISTS (SELECT 1 FROM subtask_backups b
                            WHERE b.task_id = l.task_id AND b.subtask_id = l.subtask_id)
         ORDER BY l.leased_at
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'leased', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- Up to p_n pending subtasks in one filter (minion_claim_in's filters: the whole queue, a team, a
-- project or a task), in claim order, leased to p_executor. p_first: how many the batch holds already
-- (their leased_at come first, a microsecond apart, so the attempts' history shows the claim order).
-- An executor of one capability (the common case: one kind and model) gets its p_n in one probe of
-- the queue index. With several, it takes one subtask at a time, the best head among them, as
-- minion_claim_in does: probing each capability for p_n at once would keep up to p_n rows of every
-- capability locked, untaken, until the claim commits, hidden from the claimers that serve only that
-- capability (who would wait out their long poll with work pending). The project-or-task lookup is two
-- gated branches, which a generic plan can resolve. The probes pass over tasks pinned to another
-- fingerprint, and the rows found are taken only once their tasks are pinned to this executor's, with
-- a second probe after a lost pin race.
-- Returns the new lease tokens, in claim order ('{}' when nothing in the filter is pending).
CREATE FUNCTION minion_claim_some_in(p_executor uuid, p_caps text[], p_team text, p_project text,
                                                p_task_name text, p_n integer, p_first integer)
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    caps text[] := ARRAY(SELECT DISTINCT c FROM unnest(p_caps) AS c);
    fp text;  -- the executor's fingerprint for caps[1] (the queue's and a team's probe)
    task_ids bigint[];
    subtask_ids integer[];
    more_tasks bigint[];
    more_subtasks integer[];
    refused bigint[];
    to_pin bigint[];  -- the tasks of the rows found that have a model (sleep is never pinned)
    t record;
    tok uuid;
    toks uuid[] := '{}';
    taken uuid[];
BEGIN
    IF p_n < 1 THEN
        RETURN '{}';
    END IF;
    IF p_project IS NULL AND cardinality(caps) <> 1 THEN
        FOR k IN 1 .. p_n LOOP
            tok := minion_claim_in(p_executor, caps, p_team, NULL, NULL);
            EXIT WHEN tok IS NULL;
            toks := toks || tok;
        END LOOP;
        IF p_first > 0 OR cardinality(toks) > 1 THEN  -- minion_claim_in stamps now(): shifted here
            UPDATE subtasks s
               SET leased_at = s.leased_at + (p_first + array_position(toks, s.lease_token) - 1) * interval '1 microsecond'
             WHERE s.lease_token = ANY (toks);
        END IF;
        RETURN toks;
    END IF;
    IF p_project IS NULL THEN
        fp := minion_executor_fingerprint(p_executor, caps[1]);
    END IF;
    -- A second probe only after a lost pin race.
    FOR pass IN 1 .. 2 LOOP
        task_ids := '{}';
        subtask_ids := '{}';
        refused := '{}';
        to_pin := '{}';
        -- The whole queue and a team's queue are two statements, not one with `p_team IS NULL OR`: each
        -- keeps its own partial index (subtasks_pending_queue, subtasks_pending_team) in a cached plan.
        IF p_project IS NULL AND p_team IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSIF p_project IS NULL THEN
            SELECT coalesce(array_agg(q.task_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}'),
                   coalesce(array_agg(q.subtask_id ORDER BY q.priority DESC, q.task_id, q.subtask_id), '{}')
              INTO task_ids, subtask_ids
              FROM (SELECT s.priority, s.task_id, s.subtask_id FROM subtasks s
                     WHERE s.state = 'pending' AND s.team = p_team AND s.capability = caps[1]
                       AND (fp IS NULL OR coalesce((SELECT k.fingerprint FROM tasks k WHERE k.id = s.task_id), fp) = fp)
                     ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT p_n - cardinality(toks)
                       FOR UPDATE SKIP LOCKED) q;
        ELSE
            -- A project or a task: its few open task rows in claim order, each an O(log n) probe of the
            -- queue index for what is still wanted (as minion_claim_in). One capability per task, so
            -- nothing is locked that is not taken.
            -- A whole project and a task by name are two branches, not one `p_task_name IS NULL OR`
            -- condition: in one generic plan (above) that condition could not use the task's name, and
            -- every claim would read all of the project's tasks. Only one branch runs: the first is gated
            -- on the name being NULL, the second finds nothing when it is.
            FOR t IN SELECT id, priority, minion_capability(kind, model) AS cap, fingerprint FROM tasks
                      WHERE p_task_name IS NULL AND team = p_team AND project = p_project
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                     UNION ALL
                     SELECT id, priority, minion_capability(kind, model), fingerprint FROM tasks
                      WHERE team = p_team AND project = p_project AND name = p_task_name
                        AND NOT (status IN ('completed', 'failed', 'cancelled'))
                      ORDER BY 2 DESC, 1 LOOP
                EXIT WHEN cardinality(task_ids) + cardinality(toks) >= p_n;
                CONTINUE WHEN NOT (t.cap = ANY (caps));
                CONTINUE WHEN t.fingerprint IS NOT NULL
                          AND t.fingerprint IS DISTINCT FROM minion_executor_fingerprint(p_executor, t.cap);
                SELECT coalesce(array_agg(q.task_id ORDER BY q.subtask_id), '{}'),
                       coalesce(array_agg(q.subtask_id ORDER BY q.subtask_id), '{}')
                  INTO more_tasks, more_subtasks
                  FROM (SELECT s.task_id, s.subtask_id FROM subtasks s
                         WHERE s.state = 'pending' AND s.capability = t.cap AND s.priority = t.priority
                           AND s.task_id = t.id
                         ORDER BY s.subtask_id LIMIT p_n - cardinality(task_ids) - cardinality(toks)
                           FOR UPDATE SKIP LOCKED) q;
                task_ids := task_ids || more_tasks;
                subtask_ids := subtask_ids || more_subtasks;
                IF t.cap <> 'sleep:*' AND cardinality(more_tasks) > 0 THEN
                    to_pin := to_pin || t.id;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(task_ids) = 0;

        IF fp IS NOT NULL THEN
            to_pin := ARRAY(SELECT DISTINCT x FROM unnest(task_ids) AS x);
        END IF;
        IF cardinality(to_pin) > 0 THEN
            refused := minion_claim_pin_tasks(p_executor, to_pin);
            IF cardinality(refused) > 0 THEN  -- its rows stay locked until the claim commits, untaken
                SELECT coalesce(array_agg(w.task_id ORDER BY w.n), '{}'),
                       coalesce(array_agg(w.subtask_id ORDER BY w.n), '{}')
                  INTO task_ids, subtask_ids
                  FROM unnest(task_ids, subtask_ids) WITH ORDINALITY AS w(task_id, subtask_id, n)
                 WHERE NOT (w.task_id = ANY (refused));
            END IF;
        END IF;

        IF cardinality(task_ids) > 0 THEN
            taken := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(task_ids)));
            INSERT INTO minion_subtask_acquirement (team, project, task_name, subtask_id, task_id, executor_id, lease_token)
            SELECT s.team, s.project, s.task_name, s.subtask_id, s.task_id, p_executor, w.tok
              FROM unnest(task_ids, subtask_ids, taken) AS w(task_id, subtask_id, tok)
              JOIN subtasks s ON s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            UPDATE subtasks s
               SET state = 'leased', lease_token = w.tok, lease_executor = p_executor,
                   leased_at = now() + (p_first + cardinality(toks) + w.n - 1) * interval '1 microsecond',
                   attempts = s.attempts + 1
              FROM unnest(task_ids, subtask_ids, taken) WITH ORDINALITY AS w(task_id, subtask_id, tok, n)
             WHERE s.task_id = w.task_id AND s.subtask_id = w.subtask_id;
            toks := toks || taken;
        END IF;
        EXIT WHEN cardinality(refused) = 0 OR cardinality(toks) >= p_n;
    END LOOP;
    RETURN toks;
END $$;

-- The tasks among p_task_ids that p_executor may not serve: pinned to another fingerprint, or pinned
-- by a concurrent claim before this one could. The others not pinned yet are pinned to its
-- fingerprint for their capability. An executor with no reported fingerprint for the task's model
-- ('unknown:<id>') pins nothing and may take a task no one pinned. Sleep tasks are never pinned.
CREATE FUNCTION minion_claim_pin_tasks(p_executor uuid, p_task_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    now_pinned text;
    refused bigint[] := '{}';
BEGIN
    FOR t IN SELECT k.id, k.fingerprint AS pinned,
                    minion_executor_fingerprint(p_executor, minion_capability(k.kind, k.model)) AS mine
               FROM tasks k WHERE k.id = ANY (p_task_ids) AND k.kind <> 'sleep'
              ORDER BY k.id LOOP
        IF t.pinned IS NULL THEN
            CONTINUE WHEN t.mine LIKE 'unknown:%';
            UPDATE tasks SET fingerprint = t.mine WHERE id = t.id AND fingerprint IS NULL;
            IF NOT FOUND THEN
                SELECT k.fingerprint INTO now_pinned FROM tasks k WHERE k.id = t.id;
                IF now_pinned IS DISTINCT FROM t.mine THEN
                    refused := refused || t.id;
                END IF;
            END IF;
        ELSIF t.pinned <> t.mine THEN
            refused := refused || t.id;
        END IF;
    END LOOP;
    RETURN refused;
END $$;

-- Open tasks pinned by a lease (not by their submission) that hold nothing from it: no subtask in a
-- state other than pending, failed or cancelled. Their pin is cleared; the count is returned. The
-- pin is cleared under the task row's lock and only if still unused, so a claim pinning or leasing
-- meanwhile either commits first (then a subtask is leased: kept) or waits for this.
CREATE FUNCTION minion_unpin_idle_tasks() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    t record;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.id FROM tasks k
              WHERE k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
                AND k.status IN ('queued', 'running')
              ORDER BY k.id LOOP
        UPDATE tasks k SET fingerprint = NULL
         WHERE k.id = t.id AND k.fingerprint IS NOT NULL AND NOT k.fingerprint_from_revision
           AND NOT EXISTS (SELECT 1 FROM subtasks s
                            WHERE s.task_id = t.id AND s.state NOT IN ('pending', 'failed', 'cancelled'));
        IF FOUND THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- A token as the subtask it names sees it (locked by the caller): 'primary' or 'backup' while
-- current; 'replica' (a backup of a checking subtask); 'held' (a candidate awaiting its check);
-- else 'cancelled' or 'lost'.
CREATE FUNCTION minion_token_role(s subtasks, p_token uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.task_id IS NULL THEN 'lost'
                WHEN s.state = 'cancelled' AND s.lease_token = p_token THEN 'cancelled'
                WHEN s.state = 'checking' THEN
                    CASE WHEN EXISTS (SELECT 1 FROM subtask_backups b
                                       WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                         AND b.lease_token = p_token) THEN 'replica'
                         WHEN EXISTS (SELECT 1 FROM subtask_checks c WHERE c.lease_token = p_token) THEN 'held'
                         ELSE 'lost' END
                WHEN s.state <> 'leased' THEN 'lost'
                WHEN s.lease_token = p_token THEN 'primary'
                WHEN EXISTS (SELECT 1 FROM subtask_backups b
                              WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                AND b.lease_token = p_token) THEN 'backup'
                ELSE 'lost' END
$$;

-- A live lease (a backup, or a replica while its subtask is checking), for the API before it acts
-- on it: the API token of the executor holding it, the object it must have written before it may
-- complete, and the input range it reads. No row when the token is no longer current.
CREATE FUNCTION minion_lease_info(p_token uuid, OUT owner bigint, OUT output_key text, OUT task_id bigint,
                                             OUT subtask_id integer, OUT attempt integer, OUT kind text,
                                             OUT input_uri text, OUT byte_start bigint, OUT byte_end bigint,
                                             OUT records integer)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtasks s JOIN executors e ON e.id = s.lease_executor JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = p_token AND s.state = 'leased'
    UNION ALL
    SELECT e.token_id, minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token), s.task_id,
           s.subtask_id, s.attempts, t.kind, t.input_uri, s.byte_start, s.byte_end, s.records
      FROM subtask_backups b
      JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
      JOIN executors e ON e.id = b.executor_id
      JOIN tasks t ON t.id = s.task_id
     WHERE b.lease_token = p_token AND s.state IN ('leased', 'checking')
    LIMIT 1
$$;

-- Heartbeat: the executor is alive; each token it names (a lease, a backup or a spot check's
-- replica) is answered ok, lost or cancelled. A heartbeat names every lease its executor holds, so a
-- lease of this executor that it leaves out, and that is older than p_grace_s (a fresh lease may not
-- have reached it yet), is one it never received (the claim's answer was lost on the wire) or forgot:
-- ended as lost and requeued, as a silent executor's would be. NULL p_grace_s: no such check.
CREATE FUNCTION minion_heartbeat(p_executor uuid, p_tokens uuid[], p_grace_s double precision DEFAULT NULL)
RETURNS TABLE (lease_token uuid, state text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s subtasks;
    tok uuid;
    forgotten text := 'executor no longer names this lease in its heartbeats (it never received it, or lost it)';
BEGIN
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status = 'lost';
    PERFORM minion_beat(p_executor);
    IF p_grace_s IS NOT NULL THEN
        FOR s IN SELECT * FROM subtasks sub
                  WHERE sub.lease_executor = p_executor AND sub.state = 'leased'
                    AND sub.leased_at < now() - make_interval(secs => p_grace_s)
                    AND NOT (sub.lease_token = ANY (p_tokens))
                  ORDER BY sub.task_id, sub.subtask_id FOR UPDATE LOOP
            PERFORM minion_end_attempt(s, 'lost', forgotten, true, true);
        END LOOP;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.executor_id = p_executor
                      AND b.leased_at < now() - make_interval(secs => p_grace_s)
                      AND NOT (b.lease_token = ANY (p_tokens)) LOOP
            PERFORM minion_end_backup(tok, 'lost', forgotten);
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT t.tok,
           CASE WHEN s2.state = 'leased' AND s2.lease_executor = p_executor THEN 'ok'
                WHEN bs.state IN ('leased', 'checking') AND b.executor_id = p_executor THEN 'ok'
                WHEN s2.state = 'cancelled' THEN 'cancelled'
                ELSE 'lost' END
      FROM unnest(p_tokens) AS t(tok)
      LEFT JOIN subtasks s2 ON s2.lease_token = t.tok
      LEFT JOIN subtask_backups b ON b.lease_token = t.tok
      LEFT JOIN subtasks bs ON bs.task_id = b.task_id AND bs.subtask_id = b.subtask_id;
END $$;

-- Ends a backup or a replica (failed, released, lost): the primary lease goes on as if nothing
-- happened. The subtask is locked before its backup row is deleted, the order every function that
-- ends a lease or votes takes (subtask, then its rows): the other order deadlocks with a vote.
CREATE FUNCTION minion_end_backup(p_token uuid, p_outcome text, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    b subtask_backups%ROWTYPE;
    att integer;
BEGIN
    PERFORM 1 FROM subtasks s JOIN subtask_backups k ON k.task_id = s.task_id AND k.subtask_id = s.subtask_id
      WHERE k.lease_token = p_token FOR UPDATE OF s;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT attempts INTO att FROM subtasks WHERE task_id = b.task_id AND subtask_id = b.subtask_id;
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error)
    VALUES (b.task_id, b.subtask_id, att, b.executor_id, b.lease_token, b.leased_at, p_outcome, p_error);
END $$;

-- The claim of up to p_max subtasks. Rows: one per lease won (verdict 'leased'); else one row whose
-- verdict says why none: 'empty' (nothing fits now: `capabilities` says what to wait for),
-- 'not_found', 'not_your_executor', 'deregistered', 'quarantined'. `owner`: the API token of the
-- executor (for later fencing of who may complete). Never waits: what is pending now.
--
-- In order: a spot check's replica wanted of the executor's capabilities (one at most a claim,
-- answered as a lease like any: `backup` false); each preference tier, then the whole queue, asked
-- once for what is still wanted (minion_claim_some_in); with nothing pending and p_backup_factor > 0,
-- one backup of a straggler. The leases won that are chosen for a check are marked (check_token) in
-- one UPDATE, only when the share may choose any: all of an executor not trusted, else each with its
-- team's share (minions.spot_check_team_shares) or minions.spot_check_share; only checkable ones
-- (minion_checkable, or a sampled completion with proofs: minion_executor_proves) that another
-- executor could replicate now (minion_replica_executors).
--
-- Tasks of the leases won are read in the lookup that lists them, and only those still 'splitting' or
-- 'queued' are marked running (an UPDATE that changes nothing still opens the table's indexes and
-- triggers); the answer's rows are found by the lease-token index (every won token is a lease this
-- transaction holds locked).
--
-- Plans: PostgreSQL plans a PL/pgSQL statement with parameters at each of its first five runs, then
-- keeps a generic plan unless its estimate is worse than the custom plans' average. The claim's
-- statements over arrays and limits are estimated at 10 elements or a tenth of the queue without
-- their values, and at 1 with them, so the generic estimate always lost and five of them were planned
-- again at every claim (~0.9 ms a claim). force_generic_plan keeps one plan per statement and
-- connection, in the custom plans' shape. A plan made while subtasks is small (a fresh database)
-- would scan the table where an index finds the row, and keep that shape until the statistics change;
-- every statement here is a lookup by key or an ordered probe of the queue's indexes, so
-- enable_seqscan = off holds for the whole call (the functions it calls included).
CREATE FUNCTION minion_claim_batch(p_executor uuid, p_token_id bigint, p_max integer,
                                              p_backup_factor double precision DEFAULT 0)
RETURNS TABLE (verdict text, capabilities text[], owner bigint, lease_token uuid, expires_at timestamptz,
               task_id bigint, subtask_id integer, attempt integer, team text, project text,
               task_name text, kind text, model text, params jsonb, input_uri text, byte_start bigint,
               byte_end bigint, records integer, output_key text, backup boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    wanted integer := greatest(p_max, 1);
    won uuid[] := '{}';  -- the leases won, in claim order
    backup_tok uuid;
    replica_tok uuid;
    share double precision;
    team_shares text;
    starting bigint;
    ex executors%ROWTYPE;
    pref record;
BEGIN
    SELECT * INTO ex FROM executors e WHERE e.id = p_executor;
    verdict := minion_executor_refusal(ex, p_token_id);
    IF verdict IS NULL AND ex.status = 'offline' THEN
        verdict := 'deregistered';
    END IF;
    IF verdict IS NULL AND ex.quarantined_at IS NOT NULL THEN
        verdict := 'quarantined';
    END IF;
    IF verdict IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    replica_tok := minion_claim_replica(p_executor, ex.token_id, ex.capabilities, ex.team);
    IF replica_tok IS NOT NULL THEN
        wanted := wanted - 1;
    END IF;
    FOR pref IN (SELECT p.position, p.team, p.project, p.task_name FROM executor_preferences p
                  WHERE p.executor_id = p_executor AND (ex.team IS NULL OR p.team = ex.team)
                 UNION ALL SELECT 2147483647, ex.team, NULL, NULL)
                 ORDER BY 1 LOOP
        EXIT WHEN cardinality(won) >= wanted;
        won := won || minion_claim_some_in(p_executor, ex.capabilities, pref.team, pref.project, pref.task_name,
                                           wanted - cardinality(won), cardinality(won));
    END LOOP;
    IF cardinality(won) = 0 AND replica_tok IS NULL AND p_backup_factor > 0 THEN
        backup_tok := minion_claim_backup(p_executor, ex.capabilities, ex.team, p_backup_factor);
    END IF;
    IF cardinality(won) = 0 AND backup_tok IS NULL AND replica_tok IS NULL THEN
        verdict := 'empty';
        capabilities := ex.capabilities;
        RETURN NEXT;
        RETURN;
    END IF;

    IF cardinality(won) > 0 THEN
        share := CASE WHEN ex.trusted OR minion_trust_setting('trust_agreements', 0) <= 0
                      THEN minion_trust_setting('spot_check_share', 0) ELSE 1 END;
        team_shares := CASE WHEN share < 1 THEN nullif(current_setting('minions.spot_check_team_shares', true), '') END;
        IF share > 0 OR team_shares IS NOT NULL THEN
            UPDATE subtasks s SET check_token = s.lease_token
              FROM tasks t
             WHERE s.lease_token = ANY (won) AND t.id = s.task_id
               AND random() < CASE WHEN share >= 1 THEN 2
                                   ELSE coalesce(minion_team_spot_check_share(s.team::text, team_shares), share) END
               AND (minion_checkable(t.kind, t.params) OR minion_executor_proves(p_executor, s.capability))
               AND EXISTS (SELECT 1 FROM minion_replica_executors(s.capability, s.team::text, t.fingerprint,
                                                                  ARRAY[p_executor]));
        END IF;
    END IF;

    FOR starting IN SELECT DISTINCT t.id FROM subtasks s JOIN tasks t ON t.id = s.task_id
                     WHERE s.lease_token = ANY (won) AND t.status IN ('splitting', 'queued')
                     ORDER BY 1 LOOP
        UPDATE tasks SET status = 'running', started_at = coalesce(started_at, now())
         WHERE id = starting AND status IN ('splitting', 'queued');
    END LOOP;
    UPDATE executors SET status = 'online' WHERE id = p_executor AND status <> 'online';
    PERFORM minion_seen(p_executor);

    IF backup_tok IS NOT NULL OR replica_tok IS NOT NULL THEN
        RETURN QUERY
        SELECT 'leased', ex.capabilities, ex.token_id, b.lease_token,
               now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
               s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
               s.byte_start, s.byte_end, s.records,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, b.lease_token), replica_tok IS NULL
          FROM subtask_backups b JOIN subtasks s ON s.task_id = b.task_id AND s.subtask_id = b.subtask_id
          JOIN tasks t ON t.id = s.task_id
         WHERE b.lease_token = coalesce(replica_tok, backup_tok);
    END IF;
    RETURN QUERY
    SELECT 'leased', ex.capabilities, ex.token_id, s.lease_token,
           now() + make_interval(secs => minion_lease_timeout_s()), s.task_id, s.subtask_id, s.attempts,
           s.team::text, s.project::text, s.task_name::text, t.kind, t.model, t.params, t.input_uri,
           s.byte_start, s.byte_end, s.records,
           minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token), false
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.lease_token = ANY (won)
     ORDER BY array_position(won, s.lease_token);
END $$;

-- ---- 07_results.sql ----

-- Results: verified at complete, immutable once committed.
--
-- At complete the API reads the attempt's output once, checks it holds one line per input record
-- with the input's ids in order (and, for embeddings, one vector length), and keeps what it verified
-- where no URL names it: a copy under results/, or, for an output of at most
-- MINIONS_RESULT_IN_DATABASE_BYTES, the bytes in the subtask's row, in the complete's own
-- transaction. The subtask records its SHA-256 and size; results are served from it and checked
-- against them. The attempt's output key stays the record of which attempt committed; a writer still
-- holding that attempt's PUT URL can no longer change what users read.
--
-- Compaction: a completed task's results are copied in subtask order into a few large parts
-- (`parts/<task>/<part>-<nonce>.jsonl`) whose SHA-256 and size are recorded, so parts still serve
-- exactly the verified bytes and a client can fetch them by presigned GET straight from the store.
-- A part is written first and recorded after (minion_record_result_part); a part written but never
-- recorded is garbage (minion_gc_parts). A compaction resumes after the last recorded part. Only once
-- every subtask is covered (minion_finish_compaction) are the parts served and the per-subtask
-- objects (and kept bytes, after the grace period: minion_gc_kept_results) garbage.

-- Whether `p_key` is the output key of a live lease: the local store takes a PUT of an output key
-- only then, so an output URL stops working the moment its lease ends (complete, fail, release,
-- lost, cancel). The token is read from the key (minion_output_key's layout) and looked up.
CREATE FUNCTION minion_output_writable(p_key text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    tok text := substring(p_key FROM '^outputs/[0-9]+/[0-9]+/[0-9]+-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$');
BEGIN
    IF tok IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM minion_lease_info(tok::uuid) i WHERE i.output_key = p_key);
END $$;

CREATE FUNCTION minion_task_compacted(p_task_id bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM compacted_tasks WHERE task_id = p_task_id)
$$;

-- Completed tasks not yet compacted, oldest end first. Failed and cancelled tasks are not compacted:
-- their results (with an error line per lost record) keep being read per subtask.
CREATE FUNCTION minion_tasks_to_compact(p_limit integer) RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT t.id FROM tasks t
     WHERE t.status = 'completed'
       AND NOT EXISTS (SELECT 1 FROM compacted_tasks c WHERE c.task_id = t.id)
     ORDER BY t.finished_at, t.id
     LIMIT p_limit
$$;

-- Record one written part: true, or false when it is not the next part of a completed, uncompacted
-- task (another compactor recorded this part first, the task was deleted): the caller's object is
-- then garbage. Parts follow each other without gaps, in subtask order.
CREATE FUNCTION minion_record_result_part(p_task_id bigint, p_part integer, p_first integer, p_last integer,
                                          p_key text, p_sha256 bytea, p_bytes bigint, p_records bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    prev result_parts;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND OR minion_task_compacted(p_task_id) THEN
        RETURN false;
    END IF;
    SELECT * INTO prev FROM result_parts WHERE task_id = p_task_id ORDER BY part DESC LIMIT 1;
    IF p_part <> coalesce(prev.part + 1, 0) OR p_first <= coalesce(prev.last_subtask, -1) THEN
        RETURN false;
    END IF;
    INSERT INTO result_parts (task_id, part, first_subtask, last_subtask, key, sha256, bytes, records)
    VALUES (p_task_id, p_part, p_first, p_last, p_key, p_sha256, p_bytes, p_records)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

-- Mark a task compacted once its parts cover every subtask: true when it is (now or already).
CREATE FUNCTION minion_finish_compaction(p_task_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    covered integer;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task_id AND status = 'completed' FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF minion_task_compacted(p_task_id) THEN
        RETURN true;
    END IF;
    SELECT coalesce(max(last_subtask), -1) INTO covered FROM result_parts WHERE task_id = p_task_id;
    IF EXISTS (SELECT 1 FROM subtasks WHERE task_id = p_task_id AND (subtask_id > covered OR state <> 'done')) THEN
        RETURN false;
    END IF;
    INSERT INTO compacted_tasks (task_id, parts, bytes)
    SELECT p_task_id, count(*), coalesce(sum(bytes), 0) FROM result_parts WHERE task_id = p_task_id
    ON CONFLICT DO NOTHING;
    RETURN true;
END $$;

-- Garbage among part keys: a part no row records (written by a compaction that crashed or lost a
-- race before recording it, or of a deleted task). The collector's grace period covers the moment
-- between a part's write and its record.
CREATE FUNCTION minion_gc_parts(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k
     WHERE k ~ '^parts/[0-9]{1,18}/[0-9]{1,9}-[0-9a-f]{16}\.jsonl$'
       AND NOT EXISTS (SELECT 1 FROM result_parts p WHERE p.key = k)
$$;

-- Garbage among per-subtask keys (`outputs/<task>/…`, `results/<task>/…`) once their task is
-- compacted: a compacted task is completed (no live lease) and its committed bytes are in its recorded
-- parts, which is what results are read from. The collector asks this beside minion_gc_outputs
-- and minion_gc_results, which judge the keys of tasks not compacted.
CREATE FUNCTION minion_gc_compacted(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT k FROM unnest(p_keys) AS k,
                  regexp_match(k, '^(outputs|results)/([0-9]{1,18})/[0-9]{1,9}/[0-9A-Za-z._-]+\.jsonl$') AS m
     WHERE m IS NOT NULL AND minion_task_compacted(m[2]::bigint)
$$;

-- Drop the kept bytes of the next p_limit subtasks (by id) that have some, of one such task: (task,
-- rows, bytes), no row when no task is due. p_dry_run: what would be dropped, task by task, nothing changed.
CREATE FUNCTION minion_gc_kept_results(p_grace_s double precision, p_dry_run boolean, p_limit integer)
RETURNS TABLE (task_id bigint, subtasks bigint, bytes bigint) LANGUAGE plpgsql AS $$
DECLARE
    due bigint;
    from_id integer;
    last_id integer;
BEGIN
    IF p_dry_run THEN
        RETURN QUERY
            SELECT c.task_id, count(s.subtask_id), coalesce(sum(s.result_bytes), 0)::bigint
              FROM compacted_tasks c JOIN subtasks s ON s.task_id = c.task_id AND s.result_data IS NOT NULL
             WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
             GROUP BY c.task_id;
        RETURN;
    END IF;
    SELECT c.task_id, c.kept_results_from INTO due, from_id FROM compacted_tasks c
     WHERE NOT c.kept_results_dropped AND c.compacted_at < now() - make_interval(secs => p_grace_s)
     ORDER BY c.compacted_at LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    task_id := due;
    WITH pick AS (
        SELECT v.subtask_id FROM subtasks v
         WHERE v.task_id = due AND v.subtask_id >= from_id AND v.result_data IS NOT NULL
         ORDER BY v.subtask_id LIMIT p_limit),
    dropped AS (
        UPDATE subtasks s SET result_data = NULL FROM pick
         WHERE s.task_id = due AND s.subtask_id = pick.subtask_id
        RETURNING s.subtask_id, s.result_bytes)
    SELECT count(*), coalesce(sum(d.result_bytes), 0)::bigint, max(d.subtask_id)
      INTO subtasks, bytes, last_id FROM dropped d;
    -- Done when the walk found fewer than it could take, or nothing kept lies past its last row (the
    -- probe stops at the next kept row, where the next call starts: the task is still walked once).
    UPDATE compacted_tasks c
       SET kept_results_from = coalesce(last_id + 1, from_id),
           kept_results_dropped = subtasks < p_limit
                                  OR NOT EXISTS (SELECT 1 FROM subtasks v
                                                  WHERE v.task_id = due AND v.subtask_id > last_id
                                                    AND v.result_data IS NOT NULL)
     WHERE c.task_id = due;
    RETURN NEXT;
END $$;

-- Whether task p_task_id's vectors may have p_dimension elements: fixed by the first caller
-- (the caller has locked one of the task's subtasks, as every complete does: the lock order is
-- subtasks, then the task).
CREATE FUNCTION minion_pin_dimension(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    pinned integer;
BEGIN
    SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    IF pinned IS NULL THEN
        UPDATE tasks SET embedding_dimension = p_dimension WHERE id = p_task_id AND embedding_dimension IS NULL;
        IF FOUND THEN
            RETURN true;
        END IF;
        -- A concurrent first complete fixed it meanwhile (this statement waited for its commit).
        SELECT embedding_dimension INTO pinned FROM tasks WHERE id = p_task_id;
    END IF;
    RETURN pinned = p_dimension;
END $$;

-- minion_complete for each lease of a batch, in one statement; the tasks it touched settle once,
-- after the last close (minion_settle_after_batch).
CREATE FUNCTION minion_complete_batch(p_tokens uuid[], p_records integer[], p_seconds double precision[],
                                      p_result_keys text[], p_sha256s bytea[], p_bytes bigint[],
                                      p_result_data bytea[] DEFAULT NULL, p_dimensions integer[] DEFAULT NULL)
RETURNS TABLE (lease_token uuid, verdict text) LANGUAGE plpgsql AS $$
DECLARE
    task_ids bigint[] := minion_tasks_of_tokens(p_tokens);
BEGIN
    PERFORM minion_defer_settle();
    FOR i IN 1 .. coalesce(cardinality(p_tokens), 0) LOOP
        lease_token := p_tokens[i];
        verdict := minion_complete(p_tokens[i], p_records[i], p_seconds[i], p_result_keys[i], p_sha256s[i],
                                   p_bytes[i], p_result_data[i], p_dimensions[i]);
        RETURN NEXT;
    END LOOP;
    PERFORM minion_settle_after_batch(task_ids);
END $$;

-- Commits a lease's verified result: 'ok', 'repeat' (a retried complete of a result already
-- committed or held), 'lost' / 'cancelled' (the token is no longer current: nothing changes), or
-- 'records_mismatch' (not one result line per record), or 'dimension_mismatch' (its vectors' length is not the task's: refused, nothing changed, the lease
-- still live). The referee row is deleted by token.
-- A lease chosen for a check (s.check_token) holds its result as a candidate instead of committing it:
-- 'held'; its subtask stays open, 'checking', until a replica votes. A held result fixes no vector
-- length (only a committed one does), but must fit the length fixed. A replica's complete changes
-- nothing here: 'replica', the API then compares and calls minion_check_vote.
CREATE FUNCTION minion_complete(p_token uuid, p_records integer, p_seconds double precision,
                                           p_result_key text DEFAULT NULL, p_sha256 bytea DEFAULT NULL,
                                           p_bytes bigint DEFAULT NULL, p_result_data bytea DEFAULT NULL,
                                           p_dimension integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    held boolean;
    b subtask_backups%ROWTYPE;
    winner_executor uuid;
    winner_started timestamptz;
BEGIN
    IF p_sha256 IS NOT NULL AND p_result_key IS NULL AND p_result_data IS NULL THEN
        RAISE EXCEPTION 'a committed result needs its bytes: a result key or the bytes themselves'
            USING ERRCODE = 'check_violation';
    END IF;
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role = 'lost' AND s.state = 'done' AND s.lease_token = p_token THEN
        RETURN 'repeat';  -- this very lease committed already: a retried complete is answered the same
    END IF;
    IF role = 'held' THEN
        RETURN 'repeat';  -- this very lease's result is held for its check already
    END IF;
    IF role NOT IN ('primary', 'backup', 'replica') THEN
        RETURN role;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    IF role = 'replica' THEN
        -- Compared, then voted, whatever its vectors' length: a replica that disagrees with the length
        -- a liar's committed result fixed must count against it, not be refused.
        RETURN 'replica';
    END IF;
    -- Held: the lease chosen for a check, or a straggler backup of an executor not trusted yet
    -- (its first results are all checked, whichever way it got the lease).
    held := coalesce(s.check_token = s.lease_token, false)
            OR (role = 'backup' AND minion_untrusted_backup(s, p_token));
    IF p_dimension IS NOT NULL AND NOT (CASE WHEN held THEN minion_dimension_fits(s.task_id, p_dimension)
                                             ELSE minion_pin_dimension(s.task_id, p_dimension) END) THEN
        RETURN 'dimension_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id RETURNING * INTO b;
    IF role = 'primary' THEN
        winner_executor := s.lease_executor;
        winner_started := s.leased_at;
        IF b.lease_token IS NOT NULL THEN
            INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                          started_at, outcome)
            VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, b.lease_token, b.leased_at,
                    'superseded');
        END IF;
    ELSE
        winner_executor := b.executor_id;
        winner_started := b.leased_at;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token,
                                      started_at, outcome)
        VALUES (s.task_id, s.subtask_id, s.attempts, s.lease_executor, s.lease_token, s.leased_at,
                'superseded');
    END IF;
    IF held THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        VALUES (s.task_id, s.subtask_id, 1, p_token, winner_executor, s.attempts,
                minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
                p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, winner_started);
        UPDATE subtasks
           SET state = 'checking', lease_executor = NULL, lease_token = p_token, check_token = NULL
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_drop_referee_row(s.lease_token);
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'candidate',
                p_records, p_seconds);
        RETURN 'held';
    END IF;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = p_token,
           output_key = minion_output_key(task_id, subtask_id, attempts, p_token),
           result_key = p_result_key, result_sha256 = p_sha256, result_bytes = p_bytes,
           result_data = p_result_data
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    PERFORM minion_drop_referee_row(s.lease_token);
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, winner_executor, p_token, winner_started, 'done',
            p_records, p_seconds);
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN 'ok';
END $$;

-- Garbage collection of committed results (`results/<task>/<subtask>/<attempt>-<token>-<nonce>.jsonl`,
-- the verified copies made at complete): one is garbage when no subtask names it as its result and no
-- held candidate does (its task was deleted, or its complete lost a race or was refused after the
-- copy). A copy is written just before its complete records it: the collector's grace period
-- (MINIONS_GC_GRACE_S) covers that. Outputs under `outputs/` are judged by minion_gc_outputs.
CREATE FUNCTION minion_gc_results(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT r.k FROM (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^results/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-'
                                  '[0-9a-f]{16}\.jsonl$') AS m
         WHERE m IS NOT NULL) r
     WHERE NOT EXISTS (SELECT 1 FROM subtasks s
                        WHERE s.task_id = r.task_id AND s.subtask_id = r.subtask_id AND s.result_key = r.k)
       AND NOT EXISTS (SELECT 1 FROM subtask_checks c
                        WHERE c.task_id = r.task_id AND c.subtask_id = r.subtask_id AND c.result_key = r.k)
$$;

-- ---- 08_inputs.sql ----

-- Inputs: who may read which input object, how many input bytes a team may store, which stored
-- objects are garbage, and the small inputs kept in the database.
--
-- Inline records of at most MINIONS_INPUT_IN_DATABASE_BYTES that are split at submission are
-- committed with the task (task_inputs), in minion_submit_task's own transaction, and each claim
-- takes its range from there in the claim's own statement. Larger inputs, inputs given by URI, and
-- tasks the splitter splits keep their input objects. A task's input lives in one place: an object
-- (tasks.input_uri) or its task_inputs row, never both and never neither; kept bytes never change,
-- and go with their task.

CREATE FUNCTION minion_normalize_input_prefix(p_prefix text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN right(p_prefix, 1) = '/' THEN p_prefix ELSE p_prefix || '/' END
$$;

-- Allow a team to read an S3 prefix; true when it was not allowed before.
CREATE FUNCTION minion_allow_input(p_team text, p_prefix text) RETURNS boolean LANGUAGE sql AS $$
    WITH added AS (
        INSERT INTO team_input_prefixes (team, prefix)
        VALUES (p_team, minion_normalize_input_prefix(p_prefix))
        ON CONFLICT DO NOTHING RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM added)
$$;

-- Withdraw it; true when it was allowed. Tasks already submitted keep their input.
CREATE FUNCTION minion_disallow_input(p_team text, p_prefix text) RETURNS boolean LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM team_input_prefixes
         WHERE team = p_team AND prefix = minion_normalize_input_prefix(p_prefix) RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

-- A submission of team p_team names p_uri as its input: 'ok' (and the object's grace restarts), or
-- 'not_allowed'. Allowed: an object the team owns; an unscoped upload when the submitter's token is
-- unscoped; an s3:// URI under a prefix allowed for the team; anything for an admin token.
-- Task results are not inputs (no chaining): outputs/ objects are never recorded here.
CREATE FUNCTION minion_input_use(p_team text, p_uri text, p_unscoped boolean, p_admin boolean)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE input_objects SET used_at = now()
     WHERE uri = p_uri AND (team = p_team OR (team IS NULL AND (p_unscoped OR p_admin)));
    IF FOUND OR p_admin THEN
        RETURN 'ok';
    END IF;
    -- No '.' or '..' segments: an HTTP client may normalise them away, reading outside the prefix.
    IF p_uri LIKE 's3://%' AND p_uri !~ '/\.\.?(/|$)' AND EXISTS (
        SELECT 1 FROM team_input_prefixes p WHERE p.team = p_team AND starts_with(p_uri, p.prefix)) THEN
        RETURN 'ok';
    END IF;
    RETURN 'not_allowed';
END $$;

-- Garbage collection, step 1: records of inputs no task reads, untouched for p_grace_s. Returns
-- their URIs (the caller deletes the objects); p_dry_run: only says which. Deleting the record
-- first, under its row lock, is what makes a concurrent submission safe: minion_input_use either
-- touched the row before (so it is not stale any more) or finds it gone and refuses.
CREATE FUNCTION minion_gc_input_records(p_grace_s double precision, p_dry_run boolean, p_limit integer)
RETURNS TABLE (uri text, bytes bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_dry_run THEN
        RETURN QUERY
        SELECT o.uri, max(o.bytes) FROM input_objects o
         WHERE o.used_at < now() - make_interval(secs => p_grace_s)
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = o.uri)
         GROUP BY o.uri LIMIT p_limit;
        RETURN;
    END IF;
    RETURN QUERY
    WITH stale AS (
        SELECT o.ctid FROM input_objects o
         WHERE o.used_at < now() - make_interval(secs => p_grace_s)
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = o.uri)
         LIMIT p_limit FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM input_objects o USING stale WHERE o.ctid = stale.ctid RETURNING o.uri, o.bytes)
    -- An object still owned by another team (or touched since) stays: only URIs with no owner left.
    SELECT g.uri, max(g.bytes) FROM gone g
     WHERE NOT EXISTS (SELECT 1 FROM input_objects o WHERE o.uri = g.uri)
     GROUP BY g.uri;
END $$;

-- Step 2: of these input objects (listed from the store, already older than the grace period),
-- those nobody owns and no task reads: left by a crash between write and record, or written before
-- ownership was recorded.
CREATE FUNCTION minion_gc_unowned_inputs(p_uris text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT u FROM unnest(p_uris) AS u
     WHERE NOT EXISTS (SELECT 1 FROM input_objects o WHERE o.uri = u)
       AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.input_uri = u)
$$;

-- Delete a finished task (completed, failed or cancelled) and, by cascade, its subtasks and their
-- history: 'deleted', 'not_finished' (cancel it first), or 'missing'. Its input and result objects
-- become garbage, which the collector deletes after the grace period (and the team's quota gets the
-- input's bytes back).
CREATE FUNCTION minion_delete_task(p_task_id bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    finished timestamptz;
BEGIN
    -- Lock order everywhere: subtasks (by id), then the task.
    PERFORM 1 FROM subtasks WHERE task_id = p_task_id ORDER BY subtask_id FOR UPDATE;
    SELECT finished_at INTO finished FROM tasks WHERE id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF finished IS NULL THEN
        RETURN 'not_finished';
    END IF;
    DELETE FROM tasks WHERE id = p_task_id;
    RETURN 'deleted';
END $$;

-- A task has its input in exactly one place, checked at commit (the task's row is written before its
-- kept bytes, in one transaction).
CREATE FUNCTION minion_task_input_placed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = NEW.id) THEN
        RETURN NULL;  -- deleted again in the same transaction: its input went with it
    END IF;
    IF (NEW.input_uri IS NULL) = NOT EXISTS (SELECT 1 FROM task_inputs i WHERE i.task_id = NEW.id) THEN
        RAISE EXCEPTION 'task % must have its input either as an object (input_uri) or kept in task_inputs, '
                        'not both or neither', NEW.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER tasks_input_placed AFTER INSERT OR UPDATE OF input_uri ON tasks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION minion_task_input_placed();

-- Kept bytes are the task's input for its whole life: the subtasks' ranges, the complete's check and
-- the error lines of its results all read them. Only the task's own deletion removes them.
CREATE FUNCTION minion_task_input_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the kept input of task % cannot change', OLD.task_id USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER task_inputs_fixed BEFORE UPDATE ON task_inputs
    FOR EACH ROW EXECUTE FUNCTION minion_task_input_fixed();

-- Bytes [p_start, p_end) of a task's kept input; NULL when the task keeps none (its input is an
-- object). What a claim sends inline and a complete checks an output against. VOLATILE, so that it
-- reads with a snapshot of its own: the claim's statement began before minion_claim_batch (fresh
-- snapshots) may lease a subtask of a task committed meanwhile, whose kept input a STABLE function
-- would not see.
CREATE FUNCTION minion_kept_input(p_task_id bigint, p_start bigint, p_end bigint) RETURNS bytea
LANGUAGE sql VOLATILE AS $$
    SELECT substring(i.data FROM (p_start + 1)::integer FOR (p_end - p_start)::integer)
      FROM task_inputs i WHERE i.task_id = p_task_id
$$;

-- Both tables carry the team and the bytes it stores: one pair of statement triggers counts either,
-- one UPDATE per team a statement touches (not one per row: a garbage collector's sweep deletes
-- thousands), the teams taken in order. A statement deleting inputs of several teams (the sweep,
-- retention) locks their count rows in that one order, so two of them never wait on each other in
-- a cycle (row triggers would lock them in the order the rows came, and could deadlock).
-- (A decrease is an UPDATE: an upsert checks the row it would insert, a negative count, first. Never
-- below 0: a count that drifted low must not stop the garbage collector's or retention's deletes.)
CREATE FUNCTION minion_inputs_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO team_input_usage AS u (team, bytes)
    SELECT coalesce(a.team::text, ''), sum(a.bytes) FROM added a GROUP BY 1 ORDER BY 1
    ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $$;

CREATE TRIGGER input_objects_added AFTER INSERT ON input_objects REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();

CREATE TRIGGER task_inputs_added AFTER INSERT ON task_inputs REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_added();

CREATE FUNCTION minion_inputs_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(g.team::text, '') AS team, sum(g.bytes) AS bytes
               FROM removed g GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER input_objects_removed AFTER DELETE ON input_objects REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();

CREATE TRIGGER task_inputs_removed AFTER DELETE ON task_inputs REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_inputs_removed();

-- (input_objects.bytes never changes after its insert: only used_at does.)
CREATE FUNCTION minion_input_bytes_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the recorded size of input % cannot change', OLD.uri USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER input_objects_bytes_fixed BEFORE UPDATE OF bytes ON input_objects
    FOR EACH ROW WHEN (NEW.bytes IS DISTINCT FROM OLD.bytes) EXECUTE FUNCTION minion_input_bytes_fixed();

-- Input bytes a team stores (what its quota is measured against), read from the counts the
-- triggers keep.
CREATE FUNCTION minion_team_input_bytes(p_team text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT u.bytes FROM team_input_usage u WHERE u.team = coalesce(p_team, '')), 0)
$$;

-- Serializes one team's input recordings (objects and kept inputs), so that two concurrent ones
-- cannot both squeeze under the quota.
CREATE FUNCTION minion_lock_team_inputs(p_team text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('minion_input_quota:' || coalesce(p_team, ''), 0))
$$;

-- Record an input object the API wrote for a team, within the team's quota of stored input bytes
-- (p_quota 0: none; kept inputs and batch files count too, read from team_input_usage). 'ok', or
-- 'quota_exceeded' (nothing recorded). Recording an object the team already owns is 'ok' and changes
-- nothing. The advisory lock serializes one team's recordings, so two concurrent uploads cannot both
-- squeeze under the quota.
CREATE FUNCTION minion_record_input(p_uri text, p_team text, p_bytes bigint, p_token bigint,
                                               p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM minion_lock_team_inputs(p_team);
    PERFORM 1 FROM input_objects WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
    IF FOUND THEN
        UPDATE input_objects SET used_at = now() WHERE uri = p_uri AND team IS NOT DISTINCT FROM p_team;
        RETURN 'ok';
    END IF;
    IF p_quota > 0 AND minion_team_input_bytes(p_team) + p_bytes > p_quota THEN
        RETURN 'quota_exceeded';
    END IF;
    INSERT INTO input_objects (uri, team, bytes, created_by) VALUES (p_uri, p_team, p_bytes, p_token);
    RETURN 'ok';
END $$;

CREATE FUNCTION minion_input_readable(p_token uuid, p_start bigint, p_end bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM minion_lease_info(p_token) i
                    WHERE i.input_uri IS NOT NULL AND i.byte_start = p_start AND i.byte_end = p_end);
$$;

-- Garbage collection, step 3: of these output keys (listed from the store, older than the grace
-- period), the garbage: outputs of tasks that no longer exist, and attempts that are neither the
-- committed result, a live lease's nor a held candidate's (lost, failed, released, cancelled or
-- superseded attempts). Keys of any other shape are never garbage: what we do not recognise, we keep.
CREATE FUNCTION minion_gc_outputs(p_keys text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH parsed AS (
        SELECT k, m[1]::bigint AS task_id, m[2]::integer AS subtask_id, m[4]::uuid AS token
          FROM unnest(p_keys) AS k,
               regexp_match(k, '^outputs/([0-9]{1,18})/([0-9]{1,9})/([0-9]{1,9})-'
                                  '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$') AS m
         WHERE m IS NOT NULL)
    SELECT p.k FROM parsed p
     WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = p.task_id)
        OR NOT EXISTS (
            SELECT 1 FROM subtasks s
             WHERE s.task_id = p.task_id AND s.subtask_id = p.subtask_id
               AND (s.output_key = p.k
                    OR (s.state = 'leased' AND s.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_backups b
                                WHERE b.task_id = s.task_id AND b.subtask_id = s.subtask_id
                                  AND b.lease_token = p.token)
                    OR EXISTS (SELECT 1 FROM subtask_checks c
                                WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
                                  AND c.lease_token = p.token)))
$$;

-- ---- 09_tokens.sql ----

-- API tokens: an optional expiry, a prefix to recognise a token by in a list (the secret itself is
-- never stored), creation and revocation as functions, and a NOTIFY on `tokens` whenever a token
-- changes, so every API process drops its cached entry at once instead of serving a revoked token
-- from its cache.

-- A token as it may be shown: everything but its hash. status: active, expired or revoked.
CREATE VIEW minion_tokens AS
SELECT id, prefix, role, team::text AS team, label, created_at, expires_at, revoked_at,
       CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
            WHEN expires_at IS NOT NULL AND expires_at <= now() THEN 'expired'
            ELSE 'active' END AS status
  FROM api_tokens;

-- A new token (its hash; the secret never reaches the database). The same hash again (`minions up`
-- re-installing its admin token at every start) changes nothing, not even a revocation, and
-- returns NULL.
CREATE FUNCTION minion_create_token(p_hash bytea, p_prefix text, p_role text, p_team text, p_label text,
                                    p_expires_in_s double precision)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO api_tokens (token_hash, prefix, role, team, label, expires_at)
    VALUES (p_hash, p_prefix, p_role, p_team, coalesce(p_label, ''),
            now() + make_interval(secs => p_expires_in_s))   -- NULL seconds: NULL, never expires
    ON CONFLICT (token_hash) DO NOTHING
    RETURNING id
$$;

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

-- ---- 10_openai.sql ----

-- OpenAI's Files and Batches API (/v1): an adapter at the edge. A batch is a Minions task underneath
-- (the same splitter, claims, watchdog and views); the tables hold only what OpenAI's objects carry
-- that a task does not.
--
-- The interactive lane (POST /v1/embeddings, /v1/chat/completions): a request is a one-subtask task
-- above every native priority (native tasks take -1000..1000), split in the same transaction that
-- makes it, whose end is NOTIFYed to the API process that waits for it.

-- Returns the store URI to remove, or NULL when there is no such live file.
CREATE FUNCTION minion_openai_delete_file(p_id text) RETURNS text LANGUAGE sql AS $$
    UPDATE openai_files SET deleted_at = now() WHERE id = p_id AND deleted_at IS NULL RETURNING uri
$$;

-- A batch that passed validation: its task and the batch in one step (no task without its batch).
CREATE FUNCTION minion_openai_submit_batch(p_id text, p_team text, p_project text, p_kind text, p_model text,
    p_params jsonb, p_subtask_size integer, p_max_attempts integer, p_input_uri text, p_endpoint text,
    p_input_file_id text, p_window text, p_window_s double precision, p_metadata jsonb,
    p_request_total integer, p_record_total integer, p_created_by bigint, p_priority integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts,
                       input_uri, request_hash, created_by)
    VALUES (p_team, p_project, p_id, p_kind, p_model, p_params, p_priority, p_subtask_size, p_max_attempts,
            p_input_uri, p_id, p_created_by)
    RETURNING id INTO v_task;
    INSERT INTO openai_batches (id, team, task_id, endpoint, input_file_id, completion_window, metadata,
                                request_total, record_total, created_by, in_progress_at, expires_at)
    VALUES (p_id, p_team, v_task, p_endpoint, p_input_file_id, p_window, p_metadata, p_request_total,
            p_record_total, p_created_by, now(), now() + make_interval(secs => p_window_s));
    RETURN v_task;
END $$;

-- A batch whose input file failed validation: no task, the errors kept.
CREATE FUNCTION minion_openai_reject_batch(p_id text, p_team text, p_endpoint text, p_input_file_id text,
    p_window text, p_window_s double precision, p_metadata jsonb, p_errors jsonb, p_request_total integer,
    p_created_by bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO openai_batches (id, team, endpoint, input_file_id, completion_window, metadata, errors,
                                request_total, request_completed, request_failed, created_by, expires_at,
                                failed_at)
    VALUES (p_id, p_team, p_endpoint, p_input_file_id, p_window, p_metadata, p_errors, p_request_total, 0, 0,
            p_created_by, now() + make_interval(secs => p_window_s), now())
$$;

-- Cancel or expire (p_ending): the task is cancelled (its finished part stays committed) and the
-- batch waits for its files. False when the batch has already ended or is ending.
CREATE FUNCTION minion_openai_end_batch(p_id text, p_ending text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    UPDATE openai_batches
       SET ending = p_ending,
           cancelling_at = CASE WHEN p_ending = 'cancel' THEN now() ELSE cancelling_at END
     WHERE id = p_id AND ending IS NULL AND task_id IS NOT NULL AND finalizing_at IS NULL
       AND completed_at IS NULL AND failed_at IS NULL AND expired_at IS NULL AND cancelled_at IS NULL
    RETURNING task_id INTO v_task;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM minion_cancel_task(v_task);  -- false when the task had just ended: the batch ends as it did
    RETURN true;
END $$;

-- One finalizer at a time per batch: true for the caller that takes it (or retakes one left for
-- p_stale_s, its finalizer having died).
CREATE FUNCTION minion_openai_begin_finalize(p_id text, p_stale_s double precision) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE openai_batches b SET finalizing_at = now()
      FROM tasks t
     WHERE b.id = p_id AND t.id = b.task_id AND t.finished_at IS NOT NULL
       AND b.completed_at IS NULL AND b.failed_at IS NULL AND b.expired_at IS NULL AND b.cancelled_at IS NULL
       AND (b.finalizing_at IS NULL OR b.finalizing_at < now() - make_interval(secs => p_stale_s))
    RETURNING true
$$;

-- The output and error files are written: the batch ends completed, cancelled or expired.
CREATE FUNCTION minion_openai_finish_batch(p_id text, p_output_file_id text, p_error_file_id text,
                                           p_completed integer, p_failed integer)
RETURNS void LANGUAGE sql AS $$
    UPDATE openai_batches
       SET output_file_id = p_output_file_id, error_file_id = p_error_file_id,
           request_completed = p_completed, request_failed = p_failed,
           completed_at = CASE WHEN ending IS NULL THEN now() END,
           cancelled_at = CASE WHEN ending = 'cancel' THEN now() END,
           expired_at = CASE WHEN ending = 'expire' THEN now() END
     WHERE id = p_id AND completed_at IS NULL AND cancelled_at IS NULL AND expired_at IS NULL
$$;

-- Native tasks take priorities -1000..1000 (services/api/validation.py): the lane is above them all.
CREATE FUNCTION minion_openai_interactive_priority() RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT 10000
$$;

-- task_ended: the end of an interactive task (payload: its id), for the API process whose handler
-- waits on it. Only the lane's tasks notify: a NOTIFY serialises commits cluster-wide, and batch
-- work needs no such wake-up.
CREATE FUNCTION minion_notify_interactive_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('task_ended', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify_interactive_ended AFTER UPDATE OF finished_at ON tasks
    FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
                       AND NEW.priority = 10000)
    EXECUTE FUNCTION minion_notify_interactive_ended();

-- The interactive lane's task: a submission of one subtask (bytes [0, p_bytes) of its input,
-- p_records records), split at insert like any other, so the splitter, woken by the task's NOTIFY,
-- finds it already split and leaves it.
CREATE FUNCTION minion_openai_submit_interactive(p_team text, p_project text, p_name text,
    p_kind text, p_model text, p_params jsonb, p_max_attempts integer, p_input_uri text, p_bytes bigint,
    p_records integer, p_created_by bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_task bigint;
BEGIN
    SELECT id INTO v_task
      FROM minion_submit_task(p_team, p_project, p_name, p_kind, p_model, p_params,
                              minion_openai_interactive_priority(), greatest(p_records, 1), p_max_attempts,
                              p_input_uri, p_name, p_created_by,
                              ARRAY[0::bigint], ARRAY[p_bytes], ARRAY[0::bigint], ARRAY[p_records]);
    IF NOT FOUND THEN  -- as the plain insert it replaces did: the lane's names are fresh uuids
        RAISE EXCEPTION 'task % already exists', p_name USING ERRCODE = 'unique_violation';
    END IF;
    RETURN v_task;
END $$;

-- Counted by statement triggers, as input_objects and task_inputs are: one UPDATE per team a
-- statement touches, the teams in order. A file stops counting when it is deleted (deleted_at set)
-- or its row goes.
CREATE FUNCTION minion_openai_files_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO team_input_usage AS u (team, bytes)
    SELECT coalesce(a.team::text, ''), sum(a.bytes) FROM added a
     WHERE a.purpose = 'batch' AND a.deleted_at IS NULL
     GROUP BY 1 ORDER BY 1
    ON CONFLICT (team) DO UPDATE SET bytes = u.bytes + excluded.bytes;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_added AFTER INSERT ON openai_files REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_added();

CREATE FUNCTION minion_openai_files_removed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(g.team::text, '') AS team, sum(g.bytes) AS bytes
               FROM removed g WHERE g.purpose = 'batch' AND g.deleted_at IS NULL GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_removed AFTER DELETE ON openai_files REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_removed();

-- A live file marked deleted gives its bytes back (a deleted one never counts again).
CREATE FUNCTION minion_openai_files_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT coalesce(o.team::text, '') AS team, sum(o.bytes) AS bytes
               FROM before_rows o JOIN after_rows n ON n.id = o.id
              WHERE o.purpose = 'batch' AND o.deleted_at IS NULL AND n.deleted_at IS NOT NULL
              GROUP BY 1 ORDER BY 1 LOOP
        UPDATE team_input_usage SET bytes = greatest(bytes - r.bytes, 0) WHERE team = r.team;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER openai_files_deleted AFTER UPDATE ON openai_files
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION minion_openai_files_deleted();

-- What a file counts is fixed once it is stored: only deleted_at may change.
CREATE FUNCTION minion_openai_file_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the team, purpose and size of file % cannot change', OLD.id USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER openai_files_fixed BEFORE UPDATE ON openai_files
    FOR EACH ROW WHEN (NEW.team IS DISTINCT FROM OLD.team OR NEW.purpose IS DISTINCT FROM OLD.purpose
                       OR NEW.bytes IS DISTINCT FROM OLD.bytes OR (OLD.deleted_at IS NOT NULL
                                                                   AND NEW.deleted_at IS NULL))
    EXECUTE FUNCTION minion_openai_file_fixed();

CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by)
$$;

-- An upload, within the team's quota (MINIONS_TEAM_INPUT_QUOTA_BYTES, 0: none); the overload above
-- records a batch's output file, which no quota refuses. 'ok', or 'quota_exceeded' and nothing recorded. A
-- 'batch_output' file is never refused: it is a result. The lock is minion_record_input's, so an
-- upload here and one to POST /api/v1/inputs cannot both squeeze under the quota.
CREATE FUNCTION minion_openai_add_file(p_id text, p_team text, p_purpose text, p_filename text, p_bytes bigint,
                                       p_uri text, p_created_by bigint, p_quota bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF p_purpose = 'batch' AND p_quota > 0 THEN
        PERFORM minion_lock_team_inputs(p_team);
        IF minion_team_input_bytes(p_team) + p_bytes > p_quota THEN
            RETURN 'quota_exceeded';
        END IF;
    END IF;
    INSERT INTO openai_files (id, team, purpose, filename, bytes, uri, created_by)
    VALUES (p_id, p_team, p_purpose, p_filename, p_bytes, p_uri, p_created_by);
    RETURN 'ok';
END $$;

-- ---- 11_checks.sql ----

-- Replicated spot checks and earned trust.
--
-- One way to run a subtask twice is the straggler backup (leases.sql). A lease chosen for a check (at
-- claim: every lease of an executor not trusted yet, and a random share of the others) commits
-- nothing when it completes: its verified result is held as a candidate (subtask_checks) and the
-- subtask moves to 'checking' (open: its task cannot end). A replica of a checking subtask is a
-- backup row taken by another executor (one that produced none of its candidates; another API token
-- wherever one could run it) of the task's fingerprint; to the executor it is a lease like any
-- (`backup` false: nothing tells an embedding executor that it is checking another's work; a
-- completion replica is sent the held results, `check`, to verify their proofs of generation
-- with a prefill pass instead of generating, answering a result whose proof holds as it is, so
-- that the two agree). A lost or released replica deletes its row, which re-offers the subtask. The
-- API compares the replica's verified output with the candidates (services/api/spot_check.py:
-- embeddings by cosine per record, greedy completions by text similarity, sleep by ids) and hands
-- its verdict to minion_check_vote:
--   agrees with a candidate  -> that candidate commits (the subtask is done, as any complete);
--   disagrees with the one   -> it is held as a second candidate; a third executor runs it;
--   disagrees with both      -> no quorum: both dropped, the subtask runs again from the queue
--                               (failed for good once out of attempts), nobody blamed.
-- Trust: each executor counts agreements and disagreements; `trusted` once it has agreed
-- minions.trust_agreements times with model fingerprints reported (reset when they change). The
-- losing side of a 2-to-1 quorum gains a disagreement, and at minions.quarantine_after it is
-- quarantined: flagged in the vote's transaction (its claims are refused from then on), its leases,
-- candidates and results in open tasks dealt with by minion_settle_quarantines, in a transaction of
-- its own (the API calls it after each vote, the watchdog's sweep too), so a vote locks one subtask
-- and its voters' rows, in id order, and nothing else.
--
-- What is never checked: a lease no other executor could replicate now (online within the lease
-- timeout, not quarantined, serving its capability, of its task's fingerprint, of its team: the
-- executors a replica claim would serve), so a lone executor's results commit unchecked; and a
-- sampled completion (temperature not 0: two honest runs differ) without proofs of generation (an
-- Ollama backend's). A check that cannot finish (its replicas keep failing, or every executor that
-- could run one left) ends after minions.spot_check_wait_s (minion_settle_stale_checks, the
-- watchdog's sweep): a lone candidate commits unchecked (its attempt says so), a dispute runs again
-- from the queue.
--
-- The settings are session settings (custom GUCs) the API and the watchdog set on their connections
-- from MINIONS_SPOT_CHECK_SHARE, MINIONS_SPOT_CHECK_TEAM_SHARES, MINIONS_TRUST_AGREEMENTS and
-- MINIONS_QUARANTINE_AFTER (defaults 0.02, none, 5, 2): reading one costs no table access, so a claim
-- of a trusted executor pays nothing for them. A session that sets none (psql, a SQL test) checks
-- nothing: share 0, trust 0.
--
-- Cost on the hot path: a complete compares s.check_token with the token of the row it already
-- locks; a claim marks its chosen leases with one UPDATE only when the share chose some, and probes
-- the partial index of checking subtasks (empty while nothing is checked) once.

-- A trust setting: the session's minions.<name>, else the default.
CREATE FUNCTION minion_trust_setting(p_name text, p_default double precision) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('minions.' || p_name, true), '')::double precision, p_default)
$$;

-- The share p_shares ('team=share,team=share') gives team p_team, NULL when none.
CREATE FUNCTION minion_team_spot_check_share(p_team text, p_shares text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT split_part(kv, '=', 2)::double precision
      FROM unnest(string_to_array(p_shares, ',')) AS kv
     WHERE btrim(split_part(kv, '=', 1)) = p_team
     LIMIT 1
$$;

-- Whether two honest runs of a task's subtask give results a check can compare: not a sampled
-- completion (a temperature other than 0 given, or none: the agents' default samples).
CREATE FUNCTION minion_checkable(p_kind text, p_params jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_kind <> 'completion'
        OR CASE WHEN jsonb_typeof(p_params -> 'temperature') = 'number'
                THEN (p_params ->> 'temperature')::numeric = 0 ELSE false END
$$;

-- Whether p_executor's results of capability p_cap carry proofs of generation that another executor
-- of the same fingerprint verifies with a prefill pass (it registered `proofs`: the agent's
-- transformers completion backend, agents/macos/runners/completion_proof.py): then even a sampled
-- completion can be checked. Ollama exposes no hidden states: its sampled completions cannot be.
CREATE FUNCTION minion_executor_proves(p_executor uuid, p_cap text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT p_cap LIKE 'completion:%'
       AND EXISTS (SELECT 1 FROM executor_fingerprints f
                    WHERE f.executor_id = p_executor AND f.capability = p_cap AND f.proofs IS NOT NULL)
$$;

-- Whether an executor may be trusted: agreed often enough, and (serving a model) reported what it loaded.
CREATE FUNCTION minion_executor_earns_trust(p_executor uuid, p_agreements integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_agreements >= minion_trust_setting('trust_agreements', 0)
       AND (EXISTS (SELECT 1 FROM executor_fingerprints f WHERE f.executor_id = p_executor)
            OR NOT EXISTS (SELECT 1 FROM executors e, unnest(e.kinds) k WHERE e.id = p_executor AND k <> 'sleep'))
$$;

-- The executors a replica of a subtask (capability p_cap, team p_team, task fingerprint p_fp) could
-- go to, other than p_not: the executors whose claim minion_claim_replica would serve it. Online and
-- heard from within the lease timeout, not quarantined, serving p_cap, of p_team's scope, of the
-- task's fingerprint when it has one.
CREATE FUNCTION minion_replica_executors(p_cap text, p_team text, p_fp text, p_not uuid[])
RETURNS TABLE (id uuid, token_id bigint) LANGUAGE sql STABLE AS $$
    SELECT e.id, e.token_id FROM executors e JOIN heartbeats h ON h.executor_id = e.id
     WHERE e.status = 'online' AND e.quarantined_at IS NULL AND p_cap = ANY (e.capabilities)
       AND NOT (e.id = ANY (p_not))
       AND (e.team IS NULL OR e.team = p_team)
       AND h.alive_at > now() - make_interval(secs => minion_lease_timeout_s())
       AND (p_fp IS NULL OR p_cap = 'sleep:*' OR minion_executor_fingerprint(e.id, p_cap) = p_fp)
$$;

-- Whether executor p_executor (of API token p_token_id) may run the replica of checking subtask
-- (p_task_id, p_subtask_id): it produced none of its candidates, and it is of another token than
-- theirs unless no executor of another token could run it (one owner's machines do not form a
-- quorum while another owner's could).
CREATE FUNCTION minion_replica_allowed(p_executor uuid, p_token_id bigint, p_task_id bigint, p_subtask_id integer,
                                       p_cap text, p_team text, p_fp text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH held AS (SELECT c.executor_id, e.token_id FROM subtask_checks c JOIN executors e ON e.id = c.executor_id
                   WHERE c.task_id = p_task_id AND c.subtask_id = p_subtask_id)
    SELECT NOT EXISTS (SELECT 1 FROM held WHERE held.executor_id = p_executor)
       AND (NOT EXISTS (SELECT 1 FROM held WHERE held.token_id = p_token_id)
            OR NOT EXISTS (SELECT 1 FROM minion_replica_executors(p_cap, p_team, p_fp,
                                                                   ARRAY(SELECT executor_id FROM held)) o
                            WHERE o.token_id <> ALL (ARRAY(SELECT token_id FROM held))))
$$;

-- Whether the task's pinned vector length admits p_dimension, without fixing it (a held result
-- fixes nothing: only a committed one does).
CREATE FUNCTION minion_dimension_fits(p_task_id bigint, p_dimension integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_dimension IS NULL OR coalesce((SELECT t.embedding_dimension = p_dimension FROM tasks t
                                             WHERE t.id = p_task_id), true)
$$;

-- A replica for p_executor: a checking subtask of its capabilities (its team's, if it has one) with
-- no replica running, that it may replicate (minion_replica_allowed), of its fingerprint (or of a
-- task not pinned: one run so far by executors that report none). Returns the replica's
-- token (a backup row), or NULL. A replica pins nothing.
CREATE FUNCTION minion_claim_replica(p_executor uuid, p_token_id bigint, p_caps text[], p_team text)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    cand record;
    tok uuid;
BEGIN
    -- The first 64 checking subtasks in claim order are looked at, no more: a backlog of checks (an
    -- untrusted executor's held results, replicas running) costs a claim a bounded scan, and the
    -- subtasks further back come forward as those ahead resolve.
    FOR cand IN
        SELECT h.task_id, h.subtask_id
          FROM (SELECT s.task_id, s.subtask_id, s.capability, s.team, s.priority FROM subtasks s
                 WHERE s.state = 'checking' AND s.capability = ANY (p_caps) AND (p_team IS NULL OR s.team = p_team)
                 ORDER BY s.priority DESC, s.task_id, s.subtask_id
                 LIMIT 64) h
          JOIN tasks t ON t.id = h.task_id
         WHERE NOT EXISTS (SELECT 1 FROM subtask_backups b WHERE b.task_id = h.task_id AND b.subtask_id = h.subtask_id)
           AND (h.capability = 'sleep:*' OR t.fingerprint IS NULL
                OR t.fingerprint = minion_executor_fingerprint(p_executor, h.capability))
           AND minion_replica_allowed(p_executor, p_token_id, h.task_id, h.subtask_id, h.capability, h.team::text,
                                      t.fingerprint)
         ORDER BY h.priority DESC, h.task_id, h.subtask_id
         LIMIT 4
    LOOP
        tok := minion_take_second_run(cand.task_id, cand.subtask_id, 'checking', p_executor);
        IF tok IS NOT NULL THEN
            RETURN tok;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- Whether backup p_token of subtask s is of an executor not trusted yet, whose result another
-- executor could check now (its first results are all checked, whichever way it got the lease).
CREATE FUNCTION minion_untrusted_backup(s subtasks, p_token uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT minion_trust_setting('trust_agreements', 0) > 0
       AND EXISTS (SELECT 1 FROM subtask_backups k JOIN executors e ON e.id = k.executor_id
                    WHERE k.lease_token = p_token AND NOT e.trusted
                      AND EXISTS (SELECT 1 FROM minion_replica_executors(
                                      s.capability, s.team::text, (SELECT t.fingerprint FROM tasks t WHERE t.id = s.task_id),
                                      ARRAY[e.id])))
$$;

-- Commits candidate w of checking subtask s (locked by the caller): the subtask done with w's
-- result, as if w's lease had completed unchecked; the attempt's outcome is p_outcome ('done' when
-- agreed, 'unchecked' when no check could finish). False, with nothing changed, when w's vectors
-- no longer fit the task's length (another result fixed another one meanwhile).
CREATE FUNCTION minion_commit_candidate(s subtasks, w subtask_checks, p_outcome text, p_note text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF w.dimension IS NOT NULL AND NOT minion_pin_dimension(s.task_id, w.dimension) THEN
        RETURN false;
    END IF;
    DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = w.round;
    UPDATE subtasks
       SET state = 'done', done_at = now(), lease_executor = NULL, lease_token = w.lease_token,
           output_key = w.output_key, result_key = w.result_key, result_sha256 = w.result_sha256,
           result_bytes = w.result_bytes, result_data = w.result_data, check_token = NULL
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    UPDATE subtask_attempts SET outcome = p_outcome, ended_at = now(), error = p_note
     WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = w.lease_token
       AND outcome = 'candidate';
    PERFORM minion_subtask_closed(s.task_id, false, NULL, s.records);
    RETURN true;
END $$;

-- Checking subtask s (locked by the caller) runs again from the queue, its candidates dropped as
-- outvoted with p_error (or fails for good once out of attempts). Nobody is blamed.
CREATE FUNCTION minion_recheck_subtask(s subtasks, p_error text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE subtask_attempts a SET outcome = 'outvoted', error = p_error
      FROM subtask_checks c
     WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id
       AND a.task_id = c.task_id AND a.subtask_id = c.subtask_id AND a.lease_token = c.lease_token
       AND a.outcome = 'candidate';
    DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    DELETE FROM subtask_backups WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    IF s.attempts < (SELECT max_attempts FROM tasks WHERE id = s.task_id) THEN
        UPDATE subtasks
           SET state = 'pending', lease_token = NULL, lease_executor = NULL, leased_at = NULL, check_token = NULL,
               last_error = 'spot check: ' || p_error
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
    ELSE
        UPDATE subtasks
           SET state = 'failed', done_at = now(), check_token = NULL, last_error = 'spot check: ' || p_error
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id;
        PERFORM minion_subtask_closed(s.task_id, true,
            format('subtask %s failed: %s (spot check)', s.subtask_id, p_error));
    END IF;
END $$;

-- The voters of a quorum gain (p_agreed) or lose (p_outvoted) trust, their rows locked in id order
-- (two votes at once take them in one order, never a deadlock). One outvoted minions.quarantine_after
-- times is quarantined here (flagged: its claims are refused from now on; the rest of its quarantine
-- is minion_settle_quarantines, in a transaction of its own).
CREATE FUNCTION minion_executors_voted(p_agreed uuid[], p_outvoted uuid[], p_task_id bigint, p_subtask_id integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e executors%ROWTYPE;
BEGIN
    PERFORM 1 FROM executors WHERE id = ANY (p_agreed || p_outvoted) ORDER BY id FOR UPDATE;
    FOR e IN UPDATE executors SET agreements = agreements + 1
              WHERE id = ANY (p_agreed) AND quarantined_at IS NULL RETURNING * LOOP
        IF NOT e.trusted AND minion_executor_earns_trust(e.id, e.agreements) THEN
            UPDATE executors SET trusted = true WHERE id = e.id;
        END IF;
    END LOOP;
    UPDATE executors SET disagreements = disagreements + 1, trusted = false, agreements = 0
     WHERE id = ANY (p_outvoted);
    UPDATE executors
       SET quarantined_at = now(), quarantine_settled = false,
           quarantine_reason = format('outvoted %s times by other executors'' results (last: task %s, subtask %s)',
                                      disagreements, p_task_id, p_subtask_id)
     WHERE id = ANY (p_outvoted) AND quarantined_at IS NULL
       AND disagreements >= minion_trust_setting('quarantine_after', 2);
END $$;

-- A replica's vote, after the API compared its verified output with the candidates of its subtask:
-- p_agrees_with the round of the candidate it matches, NULL for none. Returns 'agreed' (that
-- candidate committed), 'disputed' (this result held as the second candidate: a third executor
-- runs the subtask), 'no_quorum' (three different answers: the subtask runs again, or fails once out
-- of attempts), or what minion_complete would ('lost', 'cancelled', 'records_mismatch',
-- 'dimension_mismatch').
CREATE FUNCTION minion_check_vote(p_token uuid, p_records integer, p_seconds double precision,
                                  p_result_key text, p_sha256 bytea, p_bytes bigint, p_result_data bytea,
                                  p_dimension integer, p_agrees_with smallint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s subtasks;
    role text;
    b subtask_backups%ROWTYPE;
    w subtask_checks%ROWTYPE;
    l subtask_checks%ROWTYPE;
    n integer;
BEGIN
    s := minion_lock_subtask_of(p_token);
    role := minion_token_role(s, p_token);
    IF role <> 'replica' THEN
        RETURN CASE WHEN role = 'held' THEN 'repeat' ELSE role END;
    END IF;
    IF p_records IS DISTINCT FROM s.records THEN
        RETURN 'records_mismatch';
    END IF;
    DELETE FROM subtask_backups WHERE lease_token = p_token RETURNING * INTO b;
    SELECT count(*) INTO n FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id;

    IF p_agrees_with IS NOT NULL THEN
        SELECT * INTO w FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = p_agrees_with;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'subtask %/% has no candidate of round %', s.task_id, s.subtask_id, p_agrees_with
                USING ERRCODE = 'check_violation';
        END IF;
        SELECT * INTO l FROM subtask_checks
         WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round <> p_agrees_with;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'agreed',
                p_records, p_seconds);
        -- The quorum stands whatever happens to the result: the loser is blamed. A completion replica
        -- was shown the held results to verify their proofs (it could echo them without work), so its
        -- agreement earns it nothing: trust comes from one's own results agreed with.
        PERFORM minion_executors_voted(ARRAY[w.executor_id]
                                       || CASE WHEN s.capability LIKE 'completion:%' THEN '{}'::uuid[]
                                               ELSE ARRAY[b.executor_id] END,
                                       CASE WHEN l.lease_token IS NULL THEN '{}'::uuid[] ELSE ARRAY[l.executor_id] END,
                                       s.task_id, s.subtask_id);
        IF l.lease_token IS NOT NULL THEN
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'its result was outvoted 2 to 1'
             WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND lease_token = l.lease_token
               AND outcome = 'candidate';
            DELETE FROM subtask_checks WHERE task_id = s.task_id AND subtask_id = s.subtask_id AND round = l.round;
        END IF;
        IF NOT minion_commit_candidate(s, w, 'done', NULL) THEN
            -- The agreed vectors' length is not the one a committed result fixed (a liar's, revoked
            -- when its quarantine is settled): the subtask runs again.
            PERFORM minion_recheck_subtask(s, 'the agreed vectors'' length is not the task''s');
        END IF;
        RETURN 'agreed';
    END IF;

    IF n = 1 THEN
        INSERT INTO subtask_checks (task_id, subtask_id, round, lease_token, executor_id, attempt, output_key,
                                    result_key, result_sha256, result_bytes, result_data, dimension, records,
                                    seconds, started_at)
        SELECT s.task_id, s.subtask_id, 3 - c.round, p_token, b.executor_id, s.attempts,
               minion_output_key(s.task_id, s.subtask_id, s.attempts, p_token),
               p_result_key, p_sha256, p_bytes, p_result_data, p_dimension, p_records, p_seconds, b.leased_at
          FROM subtask_checks c WHERE c.task_id = s.task_id AND c.subtask_id = s.subtask_id;
        INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                      outcome, records, seconds)
        VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'candidate',
                p_records, p_seconds);
        RETURN 'disputed';  -- still checking, no replica: offered to a third executor
    END IF;

    -- Three different answers: no majority, no one to blame. Run it again.
    INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                  outcome, error, records, seconds)
    VALUES (s.task_id, s.subtask_id, s.attempts, b.executor_id, p_token, b.leased_at, 'outvoted',
            'no two results agreed', p_records, p_seconds);
    PERFORM minion_recheck_subtask(s, 'no two results agreed');
    RETURN 'no_quorum';
END $$;

-- The rest of each quarantine flagged by a vote (or by minion_quarantine_executor): the executor's
-- leases and replicas released, the results it holds for checks dropped (a subtask left with none
-- runs again from the queue), every result it committed in a task not ended yet revoked and run
-- again, and the ended tasks holding its results warned. One executor per transaction step, in id
-- order; idempotent (each step finds nothing the second time). Returns the subtasks run again.
CREATE FUNCTION minion_settle_quarantines() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    q record;
    c record;
    d record;
    n integer := 0;
BEGIN
    FOR q IN SELECT e.id, e.quarantine_reason AS reason FROM executors e
              WHERE NOT e.quarantine_settled ORDER BY e.id LOOP
        PERFORM minion_end_executor_leases(q.id, 'released', 'executor quarantined: ' || q.reason, false);
        FOR c IN SELECT k.task_id, k.subtask_id, k.lease_token FROM subtask_checks k
                  WHERE k.executor_id = q.id ORDER BY k.task_id, k.subtask_id LOOP
            PERFORM 1 FROM subtasks WHERE task_id = c.task_id AND subtask_id = c.subtask_id FOR UPDATE;
            DELETE FROM subtask_checks WHERE lease_token = c.lease_token;
            CONTINUE WHEN NOT FOUND;
            UPDATE subtask_attempts SET outcome = 'outvoted', error = 'executor quarantined'
             WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND lease_token = c.lease_token
               AND outcome = 'candidate';
            IF NOT EXISTS (SELECT 1 FROM subtask_checks WHERE task_id = c.task_id AND subtask_id = c.subtask_id) THEN
                DELETE FROM subtask_backups WHERE task_id = c.task_id AND subtask_id = c.subtask_id;
                UPDATE subtasks SET state = 'pending', lease_token = NULL, check_token = NULL
                 WHERE task_id = c.task_id AND subtask_id = c.subtask_id AND state = 'checking';
                n := n + 1;
            ELSE
                UPDATE subtasks s SET lease_token = k.lease_token
                  FROM subtask_checks k
                 WHERE s.task_id = c.task_id AND s.subtask_id = c.subtask_id
                   AND k.task_id = s.task_id AND k.subtask_id = s.subtask_id AND s.lease_token = c.lease_token;
            END IF;
        END LOOP;
        -- Its committed results in tasks that have not ended: revoked, run again (a reopened subtask
        -- counts as open again through this backend's progress slot, under the task row's lock, which
        -- a settle takes too: the task cannot end meanwhile). A task left with no committed result
        -- has its vector length fixed again by the next one (it may have been the liar's).
        FOR d IN SELECT s.task_id, s.subtask_id, s.records, s.lease_token
                   FROM subtask_attempts a
                   JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
                                  AND s.state = 'done' AND s.lease_token = a.lease_token
                   JOIN tasks t ON t.id = a.task_id
                  WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
                    AND t.status IN ('splitting', 'queued', 'running')
                  ORDER BY s.task_id, s.subtask_id
                    FOR UPDATE OF s LOOP
            PERFORM 1 FROM tasks WHERE id = d.task_id AND status IN ('splitting', 'queued', 'running') FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            UPDATE subtasks
               SET state = 'pending', lease_token = NULL, output_key = NULL, result_key = NULL, result_sha256 = NULL,
                   result_bytes = NULL, result_data = NULL, done_at = NULL, check_token = NULL,
                   last_error = 'its result came from a quarantined executor'
             WHERE task_id = d.task_id AND subtask_id = d.subtask_id;
            UPDATE subtask_attempts SET outcome = 'revoked', error = 'executor quarantined: ' || q.reason
             WHERE task_id = d.task_id AND subtask_id = d.subtask_id AND lease_token = d.lease_token
               AND outcome IN ('done', 'unchecked');
            INSERT INTO task_progress_slots AS p (task_id, slot, closed, failed, records_done)
            VALUES (d.task_id, pg_backend_pid(), -1, 0, -d.records)
            ON CONFLICT (task_id, slot) DO UPDATE
               SET closed = p.closed - 1, records_done = p.records_done - d.records;
            UPDATE tasks SET embedding_dimension = NULL
             WHERE id = d.task_id AND embedding_dimension IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM subtasks x WHERE x.task_id = d.task_id AND x.state = 'done');
            n := n + 1;
        END LOOP;
        -- Tasks that ended with its results (after the revokes: a task that ended meanwhile is warned).
        INSERT INTO task_quarantine_warnings (task_id, executor_id, subtasks, reason)
        SELECT a.task_id, q.id, count(*), q.reason
          FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.executor_id = q.id AND a.outcome IN ('done', 'unchecked')
           AND t.status IN ('completed', 'failed', 'cancelled')
         GROUP BY a.task_id
        ON CONFLICT (task_id, executor_id) DO UPDATE SET subtasks = excluded.subtasks, reason = excluded.reason;
        UPDATE executors SET quarantine_settled = true WHERE id = q.id;
    END LOOP;
    RETURN n;
END $$;

-- An executor quarantined by hand (and by tests): flagged, then settled at once. Returns the
-- subtasks run again; NULL when it was quarantined already.
CREATE FUNCTION minion_quarantine_executor(p_executor uuid, p_reason text) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE executors SET quarantined_at = now(), quarantine_reason = p_reason, trusted = false,
                         quarantine_settled = false
     WHERE id = p_executor AND quarantined_at IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN minion_settle_quarantines();
END $$;

-- An admin lifts a quarantine: the executor starts again as new (its results checked until it earns
-- trust). Returns false when it was not quarantined.
CREATE FUNCTION minion_release_quarantine(p_executor uuid) RETURNS boolean LANGUAGE sql AS $$
    UPDATE executors SET quarantined_at = NULL, quarantine_reason = NULL, agreements = 0, disagreements = 0,
                         trusted = false, quarantine_settled = true
     WHERE id = p_executor AND quarantined_at IS NOT NULL
    RETURNING true
$$;

-- Checks that could not finish within p_wait_s of their first held result (replicas kept failing,
-- or every executor that could run one left): a lone candidate commits unchecked ('unchecked' in its
-- attempt, trust unchanged), a dispute runs again from the queue; a replica still running is
-- dropped ('superseded'). Returns the subtasks settled. The watchdog's sweep runs it.
CREATE FUNCTION minion_settle_stale_checks(p_wait_s double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    k record;
    s subtasks;
    w subtask_checks%ROWTYPE;
    tok uuid;
    n integer := 0;
    note text := format('unchecked: no replica agreed or disagreed within %s s', p_wait_s);
BEGIN
    FOR k IN SELECT c.task_id, c.subtask_id FROM subtask_checks c
              GROUP BY c.task_id, c.subtask_id
             HAVING min(c.held_at) < now() - make_interval(secs => p_wait_s)
              ORDER BY c.task_id, c.subtask_id LOOP
        SELECT * INTO s FROM subtasks
         WHERE task_id = k.task_id AND subtask_id = k.subtask_id AND state = 'checking' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        FOR tok IN SELECT b.lease_token FROM subtask_backups b
                    WHERE b.task_id = k.task_id AND b.subtask_id = k.subtask_id LOOP
            PERFORM minion_end_backup(tok, 'superseded', note);
        END LOOP;
        IF (SELECT count(*) FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id) = 1 THEN
            SELECT * INTO w FROM subtask_checks c WHERE c.task_id = k.task_id AND c.subtask_id = k.subtask_id;
            IF NOT minion_commit_candidate(s, w, 'unchecked', note) THEN
                PERFORM minion_recheck_subtask(s, 'its vectors'' length is not the task''s');
            END IF;
        ELSE
            PERFORM minion_recheck_subtask(s, format('two results disagreed and no third came within %s s',
                                                     p_wait_s));
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- A replica wanted: a result held (or a second one, disputed), or a replica's row gone (lost,
-- released, failed) while its subtask is still checking. Woken like a requeue: executors waiting on
-- the capability claim again.
CREATE FUNCTION minion_notify_replica_wanted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cap text;
BEGIN
    IF TG_TABLE_NAME = 'subtask_checks' THEN
        SELECT s.capability INTO cap FROM subtasks s WHERE s.task_id = NEW.task_id AND s.subtask_id = NEW.subtask_id;
    ELSE
        SELECT s.capability INTO cap FROM subtasks s
         WHERE s.task_id = OLD.task_id AND s.subtask_id = OLD.subtask_id AND s.state = 'checking';
    END IF;
    IF cap IS NOT NULL THEN
        PERFORM pg_notify('subtasks', cap);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER subtask_checks_notify AFTER INSERT ON subtask_checks
    FOR EACH ROW EXECUTE FUNCTION minion_notify_replica_wanted();

CREATE TRIGGER subtask_backups_notify_replica AFTER DELETE ON subtask_backups
    FOR EACH ROW EXECUTE FUNCTION minion_notify_replica_wanted();

-- The verification task of task p_task_id, named p_name in the same team and project, and how many
-- subtasks it holds. task_id NULL: nothing to verify (subtasks 0), or p_name is taken (subtasks -1).
CREATE FUNCTION minion_verify_task(p_task_id bigint, p_name text, p_all boolean, p_created_by bigint,
                                   OUT task_id bigint, OUT subtasks integer)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks%ROWTYPE;
    picked record;
    new_id bigint;
BEGIN
    SELECT * INTO t FROM tasks WHERE id = p_task_id;
    SELECT array_agg(s.byte_start ORDER BY s.subtask_id) AS starts, array_agg(s.byte_end ORDER BY s.subtask_id) AS ends,
           array_agg(s.first_record ORDER BY s.subtask_id) AS firsts, array_agg(s.records ORDER BY s.subtask_id) AS counts,
           count(*)::integer AS n, max(s.byte_end) AS last_byte, sum(s.records)::bigint AS records
      INTO picked
      FROM subtasks s
     WHERE s.task_id = p_task_id AND s.state = 'done'
       AND (p_all OR EXISTS (SELECT 1 FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                              WHERE a.task_id = s.task_id AND a.subtask_id = s.subtask_id
                                AND a.lease_token = s.lease_token AND a.outcome IN ('done', 'unchecked')
                                AND e.quarantined_at IS NOT NULL));
    subtasks := picked.n;
    IF subtasks = 0 THEN
        RETURN;
    END IF;
    INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size, max_attempts, input_uri,
                       request_hash, created_by)
    VALUES (t.team, t.project, p_name, t.kind,
            CASE WHEN t.fingerprint_from_revision THEN t.model || '@' || t.fingerprint ELSE t.model END,
            t.params, t.priority, t.subtask_size, t.max_attempts, t.input_uri, 'verify:' || t.request_hash,
            p_created_by)
    ON CONFLICT (team, project, name) DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        subtasks := -1;
        RETURN;
    END IF;
    INSERT INTO task_inputs (task_id, team, data) SELECT new_id, i.team, i.data FROM task_inputs i WHERE i.task_id = p_task_id;
    PERFORM minion_begin_split(new_id);
    PERFORM minion_add_subtasks(new_id, picked.starts, picked.ends, picked.firsts, picked.counts, 0,
                                picked.last_byte, picked.records);
    PERFORM minion_finish_split(new_id);
    task_id := new_id;
END $$;

-- ---- 12_retention.sql ----

-- Retention: finished tasks older than the retention age (MINIONS_RETENTION_DAYS) are deleted: their
-- subtasks and attempt history first, a batch per call and so per transaction (a 100,000-subtask
-- task never becomes one long delete holding its rows, or one burst of WAL that a standby lags
-- behind), then the task row itself through minion_delete_task, which re-checks that it is
-- finished. The lease and backup rows of those subtasks go with them by cascade. Their input and
-- result objects become garbage, which the store's collector frees (as after `minions delete`).
-- Running and recently finished tasks are never touched. Tasks an OpenAI batch points at are left
-- to that adapter (openai_batches.task_id is not ON DELETE CASCADE).

-- One batch: up to p_batch subtasks of the oldest expired task, or that task's row once it has no
-- subtask left. No row: nothing is older than p_older_than (the job is done).
CREATE FUNCTION minion_retention_step(p_older_than interval, p_batch integer)
RETURNS TABLE (task_id bigint, subtasks_deleted integer, attempts_deleted integer, task_deleted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t bigint;
    ids integer[];
BEGIN
    IF p_batch < 1 OR p_older_than < interval '0' THEN
        RAISE EXCEPTION 'retention: batch must be >= 1 and age >= 0 (got %, %)', p_batch, p_older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT k.id INTO t FROM tasks k
     WHERE k.finished_at < now() - p_older_than
       AND NOT EXISTS (SELECT 1 FROM openai_batches b WHERE b.task_id = k.id)
     ORDER BY k.finished_at, k.id LIMIT 1;
    IF t IS NULL THEN
        RETURN;
    END IF;
    task_id := t;
    subtasks_deleted := 0;
    attempts_deleted := 0;
    task_deleted := false;
    -- Lock order everywhere: subtasks (by id), then the task.
    SELECT array_agg(s.subtask_id ORDER BY s.subtask_id) INTO ids
      FROM (SELECT subtask_id FROM subtasks WHERE subtasks.task_id = t
             ORDER BY subtask_id LIMIT p_batch FOR UPDATE) s;
    IF ids IS NOT NULL THEN
        DELETE FROM subtask_attempts a WHERE a.task_id = t AND a.subtask_id = ANY (ids);
        GET DIAGNOSTICS attempts_deleted = ROW_COUNT;
        DELETE FROM subtasks s WHERE s.task_id = t AND s.subtask_id = ANY (ids);
        GET DIAGNOSTICS subtasks_deleted = ROW_COUNT;
    END IF;
    IF coalesce(cardinality(ids), 0) < p_batch THEN
        task_deleted := minion_delete_task(t) = 'deleted';
        IF NOT task_deleted AND ids IS NULL THEN
            RETURN;  -- no longer finished (cannot happen today): not ours, and not a step either
        END IF;
    END IF;
    RETURN NEXT;
END $$;

-- ---- 13_grafana.sql ----

-- Grafana's read side: views over the tables, named grafana_*, and a read-only role that can read
-- them and nothing else (not the tables, so never api_tokens or the store signing key). What a fleet
-- operator watches (infra/grafana/dashboards/ and the alert rules in
-- infra/grafana/provisioning/alerting/minions.yaml): the backlog, how long work waits, whether any
-- executor can take it, whether the splitter and the watchdog are doing their jobs, trust.
--
-- Every view has a `team` column, so a dashboard filters with `team IN ($team)`. Row-level views
-- (grafana_attempts, grafana_queue_wait, grafana_tasks) keep the raw timestamp columns, so a panel's
-- `$__timeFilter(ended_at)` reaches the table's index; the aggregated views summarise all history.

-- An error's kind, for grouping failures: ids and measurements out, whitespace folded, 80 chars.
-- 'executor 5f0c…-… lost: no heartbeat for 131.2 s' -> 'executor <id> lost: no heartbeat for N s'.
CREATE FUNCTION minion_error_reason(p_error text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(p_error,
               '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
               '0x[0-9a-f]+', '<addr>', 'gi'),
               '[0-9]+\.[0-9]+', 'N', 'g'),
               '\s+', ' ', 'g')), 80)
$$;

-- Every team the system knows of: from tasks, team-scoped executors and live team tokens.
CREATE VIEW grafana_teams AS
SELECT team::text AS team FROM tasks
UNION
SELECT team::text FROM executors WHERE team IS NOT NULL
UNION
SELECT team::text FROM api_tokens WHERE team IS NOT NULL AND revoked_at IS NULL;

-- One row per executor and team it serves (a shared executor: one row under every team).
CREATE VIEW grafana_executors AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
), ex AS (
    SELECT e.id, e.name, e.team, e.hardware, e.kinds, e.models, e.registered_at, h.beat_at,
           l.leases,
           minion_executor_status(e.status, l.leases, h.alive_at, s.lease_timeout_s) AS status
      FROM executors e
      LEFT JOIN heartbeats h ON h.executor_id = e.id
     CROSS JOIN settings s
     -- Counted here, not by minion_lease_count(): functions run with the reader's rights, and
     -- minions_grafana may not read the tables.
     CROSS JOIN LATERAL (
           SELECT ((SELECT count(*) FROM subtasks sub WHERE sub.lease_executor = e.id AND sub.state = 'leased')
                 + (SELECT count(*) FROM subtask_backups b WHERE b.executor_id = e.id))::integer AS leases) l
)
SELECT t.team,
       ex.id AS executor_id,
       ex.name AS executor,
       CASE WHEN ex.team IS NULL THEN 'shared' ELSE 'team' END AS scope,
       coalesce(ex.hardware ->> 'device', 'unknown') AS device,
       coalesce(ex.hardware ->> 'chip', 'unknown') AS chip,
       coalesce(ex.hardware ->> 'os', 'unknown') AS os,
       ex.status,
       ex.status IN ('busy', 'idle') AS online,
       ex.leases,
       ex.beat_at AS last_heartbeat_at,
       ex.registered_at,
       array_to_string(ex.kinds, ',') AS kinds,
       array_to_string(ex.models, ',') AS models
  FROM ex
  JOIN grafana_teams t ON ex.team IS NULL OR t.team = ex.team::text;

-- Executors registered / online / busy / idle / offline / lost, per team and hardware.
CREATE VIEW grafana_executor_counts AS
SELECT team, device, chip, os,
       count(*) AS registered,
       count(*) FILTER (WHERE online) AS online,
       count(*) FILTER (WHERE status = 'busy') AS busy,
       count(*) FILTER (WHERE status = 'idle') AS idle,
       count(*) FILTER (WHERE status = 'offline') AS offline,
       count(*) FILTER (WHERE status = 'lost') AS lost
  FROM grafana_executors
 GROUP BY team, device, chip, os;

-- One row per task; phase: active (submitted, splitting, queued, running), completed, failed,
-- cancelled. Counters read through the progress slots, so they are live while the task runs.
CREATE VIEW grafana_tasks AS
SELECT t.team::text AS team,
       t.project::text AS project,
       t.name::text AS task_name,
       t.id AS task_id,
       t.kind,
       t.model,
       t.status,
       CASE WHEN t.status IN ('submitted', 'splitting', 'queued', 'running') THEN 'active'
            ELSE t.status END AS phase,
       t.priority,
       t.split_records AS records,
       -- Scalar subqueries, not a join or minion_task_slot_sums: a view reads its tables with its
       -- owner's rights (a function it calls runs with the reader's, and minions_grafana reads
       -- views only), and the view stays a simple one, so writing to it is refused for want of
       -- the privilege.
       (t.open_subtasks - (SELECT coalesce(sum(s.closed), 0) FROM task_progress_slots s
                            WHERE s.task_id = t.id))::integer AS open_subtasks,
       (t.failed_subtasks + (SELECT coalesce(sum(s.failed), 0) FROM task_progress_slots s
                              WHERE s.task_id = t.id))::integer AS failed_subtasks,
       t.created_at,
       t.started_at,
       t.finished_at,
       t.error
  FROM tasks t;

CREATE VIEW grafana_tasks_by_status AS
SELECT team, phase, status, count(*) AS tasks, sum(records) AS records
  FROM grafana_tasks
 GROUP BY team, phase, status;

-- Inference kinds and models: tasks and records (split, and done) per team.
CREATE VIEW grafana_kinds_models AS
SELECT t.team::text AS team, t.kind, t.model,
       count(*) AS tasks,
       count(*) FILTER (WHERE t.status IN ('submitted', 'splitting', 'queued', 'running')) AS active_tasks,
       sum(t.split_records) AS records,
       coalesce(sum(d.records_done), 0) AS records_done
  FROM tasks t
  LEFT JOIN (SELECT task_id, sum(records) AS records_done FROM subtasks
              WHERE state = 'done' GROUP BY task_id) d ON d.task_id = t.id
 GROUP BY t.team, t.kind, t.model;

-- One row per ended attempt, with its task and executor. duration_s: lease to end (wall clock, with
-- downloads and uploads); compute_s: what the executor reported (done attempts only); reason: the
-- normalised error of an attempt that did not end done.
CREATE VIEW grafana_attempts AS
SELECT a.ended_at,
       a.started_at,
       t.team::text AS team,
       t.project::text AS project,
       t.name::text AS task_name,
       a.task_id,
       a.subtask_id,
       a.attempt,
       t.kind,
       t.model,
       a.outcome,
       a.executor_id,
       coalesce(e.name, 'unknown') AS executor,
       coalesce(e.hardware ->> 'device', 'unknown') AS device,
       coalesce(e.hardware ->> 'chip', 'unknown') AS chip,
       coalesce(e.hardware ->> 'os', 'unknown') AS os,
       a.records,
       a.seconds AS compute_s,
       extract(epoch FROM a.ended_at - a.started_at)::double precision AS duration_s,
       a.error,
       CASE WHEN a.outcome <> 'done' THEN minion_error_reason(coalesce(a.error, a.outcome)) END AS reason
  FROM subtask_attempts a
  JOIN tasks t ON t.id = a.task_id
  LEFT JOIN executors e ON e.id = a.executor_id;

-- Records committed per minute, per team, kind and model.
CREATE VIEW grafana_records_per_minute AS
SELECT date_trunc('minute', ended_at) AS "time", team, kind, model,
       sum(records) AS records, count(*) AS subtasks
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY 1, team, kind, model;

-- Queue wait per task: submission to first lease. A task still waiting counts with its wait so far
-- (waiting = true, waited_until = now), so a stuck queue shows up rather than hiding.
CREATE VIEW grafana_queue_wait AS
SELECT w.team, w.project, w.task_name, w.task_id, w.kind, w.model, w.created_at, w.first_lease_at,
       w.first_lease_at IS NULL AS waiting,
       coalesce(w.first_lease_at, now()) AS waited_until,
       extract(epoch FROM coalesce(w.first_lease_at, now()) - w.created_at)::double precision AS wait_s
  FROM (SELECT t.team::text AS team, t.project::text AS project, t.name::text AS task_name,
               t.id AS task_id, t.kind, t.model, t.created_at, t.status,
               coalesce(t.started_at,
                        (SELECT min(a.started_at) FROM subtask_attempts a WHERE a.task_id = t.id))
                   AS first_lease_at
          FROM tasks t) w
 WHERE w.first_lease_at IS NOT NULL
    OR w.status IN ('submitted', 'splitting', 'queued', 'running');

CREATE VIEW grafana_queue_wait_percentiles AS
SELECT team, kind, model,
       count(*) AS tasks,
       count(*) FILTER (WHERE waiting) AS waiting,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS p95_s,
       max(wait_s) AS max_s
  FROM grafana_queue_wait
 GROUP BY team, kind, model;

-- Done subtasks' durations, p50/p95, by model and by hardware.
CREATE VIEW grafana_subtask_duration_by_model AS
SELECT team, kind, model,
       count(*) AS subtasks,
       sum(records) AS records,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_s) AS p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY compute_s) AS p50_compute_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY compute_s) AS p95_compute_s,
       sum(records) / nullif(sum(compute_s), 0) AS records_per_compute_s
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY team, kind, model;

CREATE VIEW grafana_subtask_duration_by_hardware AS
SELECT team, device, chip, os,
       count(*) AS subtasks,
       sum(records) AS records,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_s) AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_s) AS p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY compute_s) AS p50_compute_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY compute_s) AS p95_compute_s,
       sum(records) / nullif(sum(compute_s), 0) AS records_per_compute_s
  FROM grafana_attempts
 WHERE outcome = 'done'
 GROUP BY team, device, chip, os;

-- Failed and lost attempts by normalised reason.
CREATE VIEW grafana_failures_by_reason AS
SELECT team, outcome, reason,
       count(*) AS failures,
       count(DISTINCT task_id) AS tasks,
       count(DISTINCT executor_id) AS executors,
       min(ended_at) AS first_at,
       max(ended_at) AS last_at
  FROM grafana_attempts
 WHERE outcome IN ('failed', 'lost')
 GROUP BY team, outcome, reason;

-- What each executor contributed to each team (the team of the tasks it ran).
CREATE VIEW grafana_top_executors AS
SELECT team, executor_id, executor, device, chip, os,
       count(*) FILTER (WHERE outcome = 'done') AS subtasks_done,
       coalesce(sum(records) FILTER (WHERE outcome = 'done'), 0) AS records_done,
       coalesce(sum(compute_s) FILTER (WHERE outcome = 'done'), 0) AS compute_s,
       count(*) FILTER (WHERE outcome IN ('failed', 'lost')) AS failures,
       max(ended_at) FILTER (WHERE outcome = 'done') AS last_done_at
  FROM grafana_attempts
 GROUP BY team, executor_id, executor, device, chip, os;

CREATE VIEW grafana_executor_precision AS
SELECT ge.team,
       ge.executor_id,
       ge.executor,
       ge.device,
       ge.chip,
       ge.status,
       ge.online,
       p.value ->> 'model' AS model,
       coalesce(p.value ->> 'precision', 'unknown') AS precision,
       CASE WHEN jsonb_typeof(p.value -> 'cosine') = 'number'
            THEN (p.value ->> 'cosine')::double precision END AS cosine,
       coalesce(p.value ->> 'setting', 'auto') AS setting
  FROM grafana_executors ge
  JOIN executors e ON e.id = ge.executor_id
 CROSS JOIN LATERAL jsonb_array_elements(
           CASE WHEN jsonb_typeof(e.hardware -> 'precision') = 'array' THEN e.hardware -> 'precision'
                ELSE '[]'::jsonb END) AS p(value)
 WHERE jsonb_typeof(p.value) = 'object';

-- Per team and capability (kind:model, as claims match it): queued work, how old the oldest of it
-- is, and how many online executors could claim it (a shared executor serves every team, a team's
-- own executor only its team). A subtask has no creation time of its own: its task's `created_at`
-- is when it became due (splitting follows within seconds).
CREATE VIEW grafana_backlog AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
), queued AS (
    SELECT s.team::text AS team, t.kind, t.model, s.capability,
           count(*) FILTER (WHERE s.state = 'pending')::integer AS pending,
           count(*) FILTER (WHERE s.state = 'leased')::integer AS leased,
           min(t.created_at) FILTER (WHERE s.state = 'pending') AS oldest_pending_since
      FROM subtasks s JOIN tasks t ON t.id = s.task_id
     WHERE s.state IN ('pending', 'leased')
     GROUP BY s.team, t.kind, t.model, s.capability
), online AS (
    SELECT e.team::text AS team, e.capabilities
      FROM executors e
      LEFT JOIN heartbeats h ON h.executor_id = e.id
     CROSS JOIN settings st
     -- Leases do not matter here (busy and idle are both online): counted as 0.
     WHERE minion_executor_status(e.status, 0, h.alive_at, st.lease_timeout_s) IN ('busy', 'idle')
)
SELECT q.team, q.kind, q.model, q.capability, q.pending, q.leased, q.oldest_pending_since,
       coalesce(extract(epoch FROM now() - q.oldest_pending_since), 0)::double precision AS oldest_pending_age_s,
       (SELECT count(*) FROM online o
         WHERE q.capability = ANY (o.capabilities) AND (o.team IS NULL OR o.team = q.team))::integer
           AS online_executors
  FROM queued q;

-- One row per subtask with the span it was outstanding (due, until done, failed or cancelled;
-- NULL while still pending or leased): the backlog at any past moment is the spans covering it.
CREATE VIEW grafana_subtask_spans AS
SELECT s.team::text AS team, t.kind, t.model, t.created_at AS due_at,
       CASE WHEN s.state IN ('pending', 'leased') THEN NULL
            ELSE coalesce(s.done_at, t.finished_at, t.created_at) END AS ended_at
  FROM subtasks s JOIN tasks t ON t.id = s.task_id;

-- The splitter and the watchdog, judged by their work: tasks submitted and still unsplit, and
-- leases whose executor has been silent past the lease timeout (the watchdog reclaims those within
-- a second or two; one still there a minute later means no watchdog is running).
CREATE VIEW grafana_service_health AS
WITH settings AS (
    SELECT coalesce((SELECT value::double precision FROM minion_settings
                      WHERE key = 'lease_timeout_s'), 120) AS lease_timeout_s
)
SELECT (SELECT count(*) FROM tasks WHERE status = 'submitted')::integer AS unsplit_tasks,
       coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM tasks WHERE status = 'submitted'), 0)
           ::double precision AS oldest_unsplit_age_s,
       (SELECT count(*) FROM subtasks s LEFT JOIN heartbeats h ON h.executor_id = s.lease_executor
         WHERE s.state = 'leased'
           AND coalesce(h.alive_at, s.leased_at) < now() - make_interval(secs => st.lease_timeout_s))::integer
           AS overdue_leases,
       coalesce((SELECT extract(epoch FROM now() - min(coalesce(h.alive_at, s.leased_at)))
                   FROM subtasks s LEFT JOIN heartbeats h ON h.executor_id = s.lease_executor
                  WHERE s.state = 'leased'), 0)::double precision - st.lease_timeout_s AS most_overdue_s
  FROM settings st;

-- One row per executor and team it serves (a shared executor: one row under every team, as in
-- grafana_executors); its trust and its counts are the executor's own, over every team's tasks, so a
-- panel over several teams takes one row per executor_id. owner: its token's label ('' reads NULL).
CREATE VIEW grafana_executor_trust AS
WITH recent AS (
    SELECT a.executor_id,
           count(*) FILTER (WHERE a.outcome = 'agreed')::integer AS agreed_24h,
           count(*) FILTER (WHERE a.outcome = 'outvoted')::integer AS outvoted_24h,
           count(*) FILTER (WHERE a.outcome = 'revoked')::integer AS revoked_24h,
           count(*) FILTER (WHERE a.outcome = 'unchecked')::integer AS unchecked_24h,
           count(*) FILTER (WHERE a.outcome = 'candidate')::integer AS candidate_24h
      FROM subtask_attempts a
     WHERE a.outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked')
       AND a.ended_at >= now() - interval '24 hours'
       AND a.executor_id IS NOT NULL
     GROUP BY a.executor_id
)
SELECT t.team,
       e.id AS executor_id,
       e.name AS executor,
       CASE WHEN e.team IS NULL THEN 'shared' ELSE 'team' END AS scope,
       nullif(k.label, '') AS owner,
       e.agreements,
       e.disagreements,
       e.trusted,
       e.quarantined_at IS NOT NULL AS quarantined,
       e.quarantined_at,
       e.quarantine_reason,
       CASE WHEN e.quarantined_at IS NOT NULL THEN 'quarantined'
            WHEN e.trusted THEN 'trusted'
            ELSE 'checked' END AS trust,
       coalesce(r.agreed_24h, 0) AS agreed_24h,
       coalesce(r.outvoted_24h, 0) AS outvoted_24h,
       coalesce(r.revoked_24h, 0) AS revoked_24h,
       coalesce(r.unchecked_24h, 0) AS unchecked_24h,
       coalesce(r.candidate_24h, 0) AS candidate_24h
  FROM executors e
  JOIN api_tokens k ON k.id = e.token_id
  LEFT JOIN recent r ON r.executor_id = e.id
  JOIN grafana_teams t ON e.team IS NULL OR t.team = e.team::text;

-- The attempts of checks per minute, per team (of the task) and outcome, over the last 24 h: a time
-- series (`$__timeFilter("time")`).
CREATE VIEW grafana_spot_check_outcomes AS
SELECT date_trunc('minute', a.ended_at) AS "time",
       t.team::text AS team,
       a.outcome,
       count(*)::integer AS attempts
  FROM subtask_attempts a
  JOIN tasks t ON t.id = a.task_id
 WHERE a.outcome IN ('candidate', 'agreed', 'outvoted', 'revoked', 'unchecked')
   AND a.ended_at >= now() - interval '24 hours'
 GROUP BY 1, t.team, a.outcome;

-- The read-only role Grafana logs in as. Roles are cluster-wide (several databases may share one
-- server, and may migrate at once), so it is created only if missing, and a concurrent creation is
-- not an error. It logs in but has no password: set one (ALTER ROLE minions_grafana PASSWORD ...)
-- where Postgres asks for one. A migrating user that may not create roles leaves it to an operator
-- (a warning, not a failure); the grants below then wait for an operator to create it and run them again.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        BEGIN
            CREATE ROLE minions_grafana LOGIN;
            ALTER ROLE minions_grafana SET default_transaction_read_only = on;
            ALTER ROLE minions_grafana SET statement_timeout = '30s';
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it first
            WHEN insufficient_privilege THEN
                RAISE WARNING 'cannot create role minions_grafana (%); create it, then grant it '
                              'SELECT on the grafana_* views', SQLERRM;
        END;
    END IF;
END $$;

-- The grants: SELECT on the grafana_* views and nothing else. Views read the tables with their
-- owner's rights, so the role needs no table privilege at all.
DO $$
DECLARE
    v record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minions_grafana') THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM PUBLIC, minions_grafana', current_schema());
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM PUBLIC, minions_grafana',
                   current_schema());
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO minions_grafana', current_schema());
    FOR v IN SELECT c.relname FROM pg_class c
              WHERE c.relkind = 'v' AND c.relnamespace = current_schema()::regnamespace
                AND c.relname LIKE 'grafana\_%'
              ORDER BY c.relname LOOP
        EXECUTE format('GRANT SELECT ON %I TO minions_grafana', v.relname);
    END LOOP;
    -- Functions the views call run as the querying role (EXECUTE is PUBLIC's by default; granted
    -- here explicitly so a REVOKE FROM PUBLIC elsewhere cannot break the dashboards).
    GRANT EXECUTE ON FUNCTION minion_executor_status(text, integer, timestamptz, double precision),
                              minion_error_reason(text)
       TO minions_grafana;
END $$;
