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
    prefix      text CHECK (length(prefix) <= 16),
    -- Who the token was issued to (a person or an organisation): spot checks count owners, not
    -- tokens or executor names (sql/schema/11_checks.sql). NULL: the token is its own owner.
    owner       text CHECK (owner IS NULL OR (length(owner) BETWEEN 1 AND 200 AND owner !~ '^token:')),
    -- An executor token an admin vouches for (`minions token create --trusted`): its machines'
    -- results commit without a check and settle volunteers' checks; any other executor token is a
    -- volunteer's.
    trusted     boolean NOT NULL DEFAULT false
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
    -- Who may lease it: any executor, or only those of a token an admin vouched for (11_checks.sql).
    placement       text NOT NULL DEFAULT 'any' CHECK (placement IN ('any', 'trusted')),
    -- The last lease-made pin released because no executor reported its fingerprint any more
    -- (minion_release_orphan_pins): shown as the task's warning.
    pin_released_at timestamptz,
    pin_released_fingerprint text,
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

-- Every model the pool knows: each capability ('kind:model') an executor has ever advertised, kept
-- when the executor leaves or stops serving it (minion_note_known_models), so that work for a model
-- the pool knows waits for its next executor while one nobody ever served is refused at once.
CREATE TABLE known_models (
    capability     text PRIMARY KEY,   -- 'kind:model', as in executors.capabilities
    kind           text NOT NULL,
    model          text NOT NULL,
    advertised_at  timestamptz NOT NULL DEFAULT now()   -- first advertised
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
    -- A volunteer's lone result no replica judged within the check wait: held on, and its task warned.
    overdue        boolean NOT NULL DEFAULT false,
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

-- ---------------------------------------------------------------------------------------------
-- Teams' shares of the common pool
-- ---------------------------------------------------------------------------------------------

-- What an admin set for a team (teams.sql); a team with no row has the defaults. weight: its share
-- of claims when several teams have work an executor may run; priority_cap: the highest priority
-- its users may give a task (admins any); max_leases: leases it may hold at once (0: no cap).
CREATE TABLE team_shares (
    team          minion_name PRIMARY KEY,
    weight        double precision NOT NULL DEFAULT 1
                      CONSTRAINT team_shares_weight CHECK (weight > 0 AND weight <= 1000000),
    priority_cap  integer NOT NULL DEFAULT 0
                      CONSTRAINT team_shares_priority_cap CHECK (priority_cap BETWEEN -1000 AND 1000),
    max_leases    integer NOT NULL DEFAULT 0 CONSTRAINT team_shares_max_leases CHECK (max_leases >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Each team's recent use of the pool: compute-seconds of its attempts as the usage account charges
-- them (minion_attempt_use: used and verification; lost is nobody's use),
-- decayed with a half-life (MINIONS_FAIR_SHARE_HALF_LIFE_S), as of usage_at. Folded from the
-- attempts by the negotiator (minion_fair_share_cycle), never written by a claim or a complete.
CREATE TABLE team_usage (
    team      text PRIMARY KEY,
    usage     double precision NOT NULL DEFAULT 0 CHECK (usage >= 0),
    usage_at  timestamptz NOT NULL DEFAULT now()
);

-- Whose turn it is: for each capability several teams have work pending for (or one team with a
-- lease cap), a round of turns in which each team has turns in proportion to its weight, the team
-- with the least weighted recent usage first. A claim takes the turn a shared sequence points at
-- (minion_fair_share_cursor), so nothing is written per claim. Rewritten by each negotiation.
CREATE TABLE fair_share_turns (
    capability  text NOT NULL,
    turn        integer NOT NULL CHECK (turn >= 0),
    turns       integer NOT NULL CHECK (turns > turn),
    team        text NOT NULL,
    PRIMARY KEY (capability, turn)
);
CREATE SEQUENCE minion_fair_share_cursor;

-- The negotiator's place in the attempts' history: attempts that ended up to folded_to are in
-- team_usage. One row.
CREATE TABLE fair_share_state (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    folded_to  timestamptz NOT NULL DEFAULT now()
);

-- Tasks with work pending and no lease in flight for longer than MINIONS_STARVATION_S while an
-- executor that could serve them was busy with other work (the negotiator notes and clears them;
-- shown in the task's warnings and on Grafana). since: its last result, or its submission.
CREATE TABLE task_starvation (
    task_id   bigint PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    since     timestamptz NOT NULL,
    noted_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX team_shares_capped ON team_shares (team) WHERE max_leases > 0;
