-- Minions schema: the tables. Every invariant the database can hold is a constraint here;
-- state changes live in functions (030_*.sql onwards) so psql can do what the services do.

CREATE DOMAIN minion_name AS text
    CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$');

-- Settings shared by every replica (e.g. the local store's URL-signing key).
CREATE TABLE minion_settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO minion_settings (key, value)
VALUES ('store_signing_key', md5(gen_random_uuid()::text) || md5(gen_random_uuid()::text));

CREATE TABLE api_tokens (
    id          bigserial PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE,            -- sha256 of the secret; the secret is never stored
    role        text NOT NULL CHECK (role IN ('admin', 'user', 'executor')),
    team        minion_name,                      -- NULL: every team
    label       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

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
    input_uri       text NOT NULL,
    request_hash    text NOT NULL,                -- identical re-submission returns the same task
    status          text NOT NULL DEFAULT 'submitted' CHECK (status IN
                        ('submitted', 'splitting', 'queued', 'running', 'completed', 'failed', 'cancelled')),
    error           text,
    -- Bookkeeping the splitter and the lease functions keep, so finishing a task is O(1):
    split_done      boolean NOT NULL DEFAULT false,
    split_offset    bigint NOT NULL DEFAULT 0,    -- bytes of input already turned into subtasks
    split_records   bigint NOT NULL DEFAULT 0,    -- records already turned into subtasks
    -- Progress counters, kept by the functions that change a subtask's state (never by a claim,
    -- whose hot path must not touch the task row), so reading a task's progress is O(1).
    subtasks_total  integer NOT NULL DEFAULT 0 CHECK (subtasks_total >= 0),
    open_subtasks   integer NOT NULL DEFAULT 0 CHECK (open_subtasks >= 0),   -- pending + leased
    failed_subtasks integer NOT NULL DEFAULT 0 CHECK (failed_subtasks >= 0),
    cancelled_subtasks integer NOT NULL DEFAULT 0 CHECK (cancelled_subtasks >= 0),
    records_done    bigint NOT NULL DEFAULT 0 CHECK (records_done >= 0),
    created_by      bigint REFERENCES api_tokens (id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    UNIQUE (team, project, name),
    CHECK ((status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);
-- Splittable: the split is not done and the task has not ended. Not a status: the first claim makes a
-- task 'running' while it is still splitting.
CREATE INDEX tasks_unsplit ON tasks (id) WHERE NOT split_done AND status NOT IN ('completed', 'failed', 'cancelled');
CREATE INDEX tasks_team_created ON tasks (team, id DESC);

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
    registered_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (token_id, name)                       -- one machine, one executor row
);

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
    state            text NOT NULL DEFAULT 'pending'
                         CHECK (state IN ('pending', 'leased', 'done', 'failed', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,  -- attempts started (claims that were not released)
    lease_token      uuid,
    lease_executor   uuid REFERENCES executors (id),
    leased_at        timestamptz,
    output_key       text,                        -- the committed attempt's object
    last_error       text,
    done_at          timestamptz,
    PRIMARY KEY (task_id, subtask_id),
    CHECK (byte_end > byte_start),
    CHECK ((state = 'leased') = (lease_executor IS NOT NULL)),
    CHECK (state <> 'leased' OR lease_token IS NOT NULL),
    CHECK (state <> 'done' OR output_key IS NOT NULL)
);
-- The claim path: O(log n) in pending subtasks, per capability, in claim order.
CREATE INDEX subtasks_pending_queue ON subtasks (capability, priority DESC, task_id, subtask_id)
    WHERE state = 'pending';
CREATE INDEX subtasks_pending_team ON subtasks (team, capability, priority DESC, task_id, subtask_id)
    WHERE state = 'pending';
CREATE UNIQUE INDEX subtasks_lease_token ON subtasks (lease_token) WHERE lease_token IS NOT NULL;
CREATE INDEX subtasks_lease_executor ON subtasks (lease_executor) WHERE state = 'leased';
CREATE INDEX subtasks_leased_task ON subtasks (task_id) WHERE state = 'leased';  -- a task's running count

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

-- Straggler backup: near the end of a task an idle executor may run a copy of a lease that has run
-- far longer than its peers. At most one backup per subtask (the primary key is the referee); the
-- first of the two to complete wins and the other's token goes stale (invariant 2 makes this safe).
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
CREATE INDEX subtasks_leased_at ON subtasks (leased_at) WHERE state = 'leased';

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
    outcome      text NOT NULL CHECK (outcome IN ('done', 'failed', 'lost', 'released', 'cancelled', 'superseded')),
    error        text,
    records      integer,
    seconds      double precision,
    FOREIGN KEY (task_id, subtask_id) REFERENCES subtasks (task_id, subtask_id) ON DELETE CASCADE
);
CREATE INDEX subtask_attempts_subtask ON subtask_attempts (task_id, subtask_id);
CREATE INDEX subtask_attempts_ended ON subtask_attempts (ended_at);
-- A task's latest finished attempts (the straggler threshold).
CREATE INDEX subtask_attempts_task_done ON subtask_attempts (task_id, ended_at DESC) WHERE outcome = 'done';
