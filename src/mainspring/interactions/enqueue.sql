-- mainspring_enqueue(queue, data, fields): create an interaction inside the caller's own transaction, from any
-- language (API.md §6). Loaded by migration interactions_0017; PostgreSQL only.
--
-- What ``POST /v1/queues/{queue}/interactions`` does, in SQL: the same checks (a bad value raises SQLSTATE 22023
-- with the field's name, and writes nothing), the queue created with the default settings when it is new, the
-- owner under the queue's ``owner_by``, a ``message_id`` already used in the queue answering the existing item, a
-- completed item's two events and its parent woken. Its events go to ``events_at_commit``, numbered when the
-- caller commits (a deferred trigger), so an open transaction never holds the events' numbering lock; the queue's
-- wake-up is the NOTIFY of the ``interactions_wake_after_insert`` trigger, delivered by that commit.

CREATE TABLE IF NOT EXISTS events_at_commit (
    id bigserial PRIMARY KEY,
    type varchar(100) NOT NULL,
    at bigint NOT NULL,
    subject_kind varchar(50) NOT NULL,
    subject_id varchar(400) NOT NULL,
    data jsonb NOT NULL
) WITH (autovacuum_vacuum_threshold = 200, autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 200);

-- At commit, the transaction's staged events move to ``events`` in the order they were staged: the first
-- trigger of the transaction moves them all (rows of other transactions are not visible before their commit,
-- which moved them), the later ones find none.
CREATE OR REPLACE FUNCTION mainspring_events_at_commit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    WITH moved AS (DELETE FROM events_at_commit RETURNING *)
    INSERT INTO events (type, at, subject_kind, subject_id, data)
    SELECT type, at, subject_kind, subject_id, data FROM moved ORDER BY id;
    PERFORM pg_notify('mainspring', 'events');
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS events_at_commit_move ON events_at_commit;
CREATE CONSTRAINT TRIGGER events_at_commit_move AFTER INSERT ON events_at_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mainspring_events_at_commit();

CREATE OR REPLACE FUNCTION mainspring_enqueue(queue text, data jsonb, fields jsonb DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    -- The parameters' names are the contract's (named calls); inside, the columns of the same names win.
    v_queue text := mainspring_enqueue.queue;
    v_data jsonb := mainspring_enqueue.data;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_fields jsonb := coalesce(mainspring_enqueue.fields, '{}');
    v_key text;
    v_name_pattern text := '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$';
    v_parent bigint;
    v_priority integer := 0;
    v_due bigint;
    v_completed boolean := false;
    v_owner_by text;
    v_row interactions;
    v_parent_row interactions;
BEGIN
    IF v_queue IS NULL OR v_queue !~ v_name_pattern THEN
        RAISE EXCEPTION 'mainspring_enqueue: queue % is not a name ([A-Za-z0-9][A-Za-z0-9._:-]{0,127})', coalesce(quote_literal(v_queue), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_fields) <> 'object' THEN
        RAISE EXCEPTION 'mainspring_enqueue: fields must be a JSON object' USING ERRCODE = '22023';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(v_fields) LOOP
        IF v_key NOT IN ('parent_id', 'name', 'message_id', 'channel', 'user', 'source', 'priority', 'process_at',
                         'process_in_ms', 'completed', 'result') THEN
            RAISE EXCEPTION 'mainspring_enqueue: unknown field %', v_key USING ERRCODE = '22023';
        END IF;
    END LOOP;
    FOREACH v_key IN ARRAY ARRAY['name', 'message_id', 'channel', 'user', 'source'] LOOP
        IF v_fields ? v_key AND jsonb_typeof(v_fields -> v_key) <> 'null'
           AND (jsonb_typeof(v_fields -> v_key) <> 'string' OR (v_fields ->> v_key) !~ v_name_pattern) THEN
            RAISE EXCEPTION 'mainspring_enqueue: % must be a name ([A-Za-z0-9][A-Za-z0-9._:-]{0,127})', v_key USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF jsonb_typeof(v_fields -> 'priority') = 'number' AND (v_fields ->> 'priority') ~ '^-?[0-9]+$'
       AND (v_fields ->> 'priority')::numeric BETWEEN -1000 AND 1000 THEN
        v_priority := (v_fields ->> 'priority')::integer;
    ELSIF coalesce(jsonb_typeof(v_fields -> 'priority'), 'null') <> 'null' THEN
        RAISE EXCEPTION 'mainspring_enqueue: priority must be an integer from -1000 to 1000' USING ERRCODE = '22023';
    END IF;
    IF coalesce(jsonb_typeof(v_fields -> 'completed'), 'null') NOT IN ('null', 'boolean') THEN
        RAISE EXCEPTION 'mainspring_enqueue: completed must be true or false' USING ERRCODE = '22023';
    END IF;
    v_completed := coalesce((v_fields ->> 'completed')::boolean, false);
    IF coalesce(jsonb_typeof(v_fields -> 'process_at'), 'null') <> 'null'
       AND coalesce(jsonb_typeof(v_fields -> 'process_in_ms'), 'null') <> 'null' THEN
        RAISE EXCEPTION 'mainspring_enqueue: give process_at or process_in_ms, not both' USING ERRCODE = '22023';
    END IF;
    IF coalesce(jsonb_typeof(v_fields -> 'process_in_ms'), 'null') <> 'null' THEN
        IF jsonb_typeof(v_fields -> 'process_in_ms') <> 'number' OR (v_fields ->> 'process_in_ms') !~ '^[0-9]{1,12}$'
           OR (v_fields ->> 'process_in_ms')::bigint > 315360000000 THEN
            RAISE EXCEPTION 'mainspring_enqueue: process_in_ms must be an integer from 0 to 315360000000' USING ERRCODE = '22023';
        END IF;
        v_due := v_now + (v_fields ->> 'process_in_ms')::bigint;
    ELSIF coalesce(jsonb_typeof(v_fields -> 'process_at'), 'null') <> 'null' THEN
        BEGIN
            v_due := (extract(epoch FROM (v_fields ->> 'process_at')::timestamptz) * 1000)::bigint;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'mainspring_enqueue: process_at must be an RFC 3339 time' USING ERRCODE = '22023';
        END;
    END IF;
    IF v_completed AND v_due IS NOT NULL THEN
        RAISE EXCEPTION 'mainspring_enqueue: a completed interaction cannot be scheduled' USING ERRCODE = '22023';
    END IF;
    IF coalesce(jsonb_typeof(v_fields -> 'parent_id'), 'null') <> 'null' THEN
        IF (v_fields ->> 'parent_id') !~ '^[0-9]{1,18}$' THEN
            RAISE EXCEPTION 'mainspring_enqueue: no interaction %', v_fields ->> 'parent_id' USING ERRCODE = '22023';
        END IF;
        v_parent := (v_fields ->> 'parent_id')::bigint;
        -- Locked as the server's create locks it (its children's finishes wake it).
        SELECT * INTO v_parent_row FROM interactions WHERE id = v_parent;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'mainspring_enqueue: no interaction %', v_parent USING ERRCODE = '22023';
        END IF;
    END IF;

    -- A new queue gets the default settings (InteractionsSettings' defaults).
    INSERT INTO interaction_queues (name, lease_ms, error_delay_ms, max_attempts, processing_timeout_ms, retention_ms,
                                    created_at, updated_at)
    VALUES (v_queue, 30000, 1000, 10, NULL, 604800000, v_now, v_now)
    ON CONFLICT (name) DO NOTHING;
    SELECT q.owner_by INTO v_owner_by FROM interaction_queues AS q WHERE q.name = v_queue;

    INSERT INTO interactions (queue, parent_id, name, message_id, channel, "user", source, data, result, state,
                              next_processing, attempts, created_at, updated_at, finished_at, priority, owner)
    VALUES (v_queue, v_parent, v_fields ->> 'name', v_fields ->> 'message_id', v_fields ->> 'channel', v_fields ->> 'user',
            v_fields ->> 'source', coalesce(v_data, 'null'::jsonb),
            CASE WHEN v_completed THEN coalesce(v_fields -> 'result', 'null'::jsonb) END,
            CASE WHEN v_completed THEN 'completed' ELSE 'queued' END,
            CASE WHEN v_completed THEN NULL ELSE coalesce(v_due, v_now) END, 0, v_now, v_now,
            CASE WHEN v_completed THEN v_now END, v_priority,
            coalesce(CASE v_owner_by WHEN 'user' THEN v_fields ->> 'user' WHEN 'source' THEN v_fields ->> 'source'
                     WHEN 'channel' THEN v_fields ->> 'channel' END, ''))
    ON CONFLICT (queue, message_id) DO NOTHING
    RETURNING * INTO v_row;
    IF v_row.id IS NULL THEN
        -- The message_id is used in this queue: the existing item is the answer, nothing is written.
        RETURN (SELECT i.id FROM interactions AS i WHERE i.queue = v_queue AND i.message_id = v_fields ->> 'message_id');
    END IF;

    INSERT INTO events_at_commit (type, at, subject_kind, subject_id, data)
    VALUES ('interaction.created', v_now, 'interaction', v_row.id::text, jsonb_build_object(
        'queue', v_queue,
        'status', CASE WHEN v_completed THEN 'completed' WHEN v_row.next_processing > v_now THEN 'scheduled' ELSE 'ready' END,
        'next_processing', (to_char(to_timestamp(((v_row.next_processing) - (((v_row.next_processing) % 1000 + 1000) % 1000)) / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS') || '.' || lpad((((v_row.next_processing) % 1000 + 1000) % 1000)::text, 3, '0') || 'Z')));
    IF v_completed THEN
        INSERT INTO events_at_commit (type, at, subject_kind, subject_id, data)
        VALUES ('interaction.completed', v_now, 'interaction', v_row.id::text,
                jsonb_build_object('queue', v_queue, 'status', 'completed', 'next_processing', NULL, 'failed', false));
        IF v_parent IS NOT NULL THEN
            -- A child created completed makes its parent due now (a processing parent is marked to run again).
            UPDATE interactions SET next_processing = v_now, updated_at = v_now
            WHERE id = v_parent AND state = 'queued' AND (next_processing IS NULL OR next_processing > v_now)
            RETURNING * INTO v_parent_row;
            IF FOUND THEN
                INSERT INTO events_at_commit (type, at, subject_kind, subject_id, data)
                VALUES ('interaction.changed', v_now, 'interaction', v_parent::text, jsonb_build_object(
                    'queue', v_parent_row.queue, 'status', 'ready', 'next_processing',
                    (to_char(to_timestamp(((v_now) - (((v_now) % 1000 + 1000) % 1000)) / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS') || '.' || lpad((((v_now) % 1000 + 1000) % 1000)::text, 3, '0') || 'Z')));
            ELSE
                UPDATE interactions SET wake = true, updated_at = v_now WHERE id = v_parent AND state = 'processing';
            END IF;
        END IF;
    END IF;
    RETURN v_row.id;
END
$fn$;
