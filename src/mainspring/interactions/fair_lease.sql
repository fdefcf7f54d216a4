-- The lease of a fair owned queue (``owner_by`` + ``fair``, no aging) in one round trip, on PostgreSQL: the
-- statements of ``leasing._lease_once`` and ``_fair_shares`` in their order, each with its own snapshot (one SQL
-- statement cannot: its snapshot is taken before it waits for the queue's row lock). ``data.fair_lease_alone``
-- calls it; tests/interactions/test_fair_lease_differential.py drives random scenarios through it and through the
-- transaction and asserts the same picks. The rate limits' logs are read and written by mainspring_rate_*
-- (migration interactions_0015).
--
-- Migrations load this file (``interactions.functions``): a migration that changes the function edits it here and
-- loads it at its upgrade; its downgrade restores the text it replaced. A store upgraded from an older revision
-- may get this text at an earlier revision's step: PostgreSQL checks a plpgsql body's references only when it
-- runs, and the later step runs in the same upgrade.
CREATE OR REPLACE FUNCTION mainspring_interactions_fair_lease(
    p_queue text, p_now bigint, p_max integer, p_token text, p_lease_ms bigint, p_worker text,
    p_pg_channel text, p_sequencer text, p_stride bigint, p_settle_read integer)
RETURNS TABLE (status text, q_lease_ms bigint, q_processing_timeout_ms bigint, upcoming_due bigint,
               upcoming_expiry bigint, slots integer, limited_until bigint, item interactions)
LANGUAGE plpgsql AS $fn$
DECLARE
    q interaction_queues;
    v_now bigint;
    v_room integer;
    v_slots integer;
    v_limited bigint;
    v_left integer;
    v_starts jsonb;
    v_busy jsonb;
    v_total integer;
    -- The owners read, by position: name, rate log, turn, start, room (0: none now), stride, heads read, exhausted.
    o_owner text[] := '{}';
    o_rs jsonb[] := '{}';
    o_start bigint[] := '{}';
    o_cap integer[] := '{}';
    o_stride bigint[] := '{}';
    o_got integer[] := '{}';
    o_exh boolean[] := '{}';
    o_in boolean[] := '{}';
    o_share integer[];
    -- The heads read: the owner's position, the head's place in the owner's order (from 0), its id.
    h_i integer[] := '{}';
    h_k integer[] := '{}';
    h_id bigint[] := '{}';
    v_after_turn bigint := -9223372036854775808;
    v_after_owner text := '';
    v_unread bigint;
    v_last bigint;
    v_sum integer;
    v_page integer;
    v_n integer;
    v_i integer;
    v_clock bigint;
    v_ids bigint[];
    v_taken interactions[];
    v_expires bigint;
    v_due bigint;
    v_expiry bigint;
    v_exhausted text[];
    r record;
BEGIN
    SELECT * INTO q FROM interaction_queues WHERE name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing', NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::integer, NULL::bigint, NULL::interactions;
        RETURN;
    END IF;
    IF q.owner_by IS NULL OR NOT q.fair OR q.priority_aging_ms IS NOT NULL THEN
        status := 'other';
    ELSIF q.paused THEN
        status := 'paused';
    ELSIF EXISTS (SELECT 1 FROM interactions WHERE queue = p_queue AND state = 'processing' AND lease_expires_at <= p_now) THEN
        status := 'expired';
    END IF;
    IF status IS NOT NULL THEN
        RETURN QUERY SELECT status, q.lease_ms, q.processing_timeout_ms, NULL::bigint, NULL::bigint, NULL::integer, NULL::bigint, NULL::interactions;
        RETURN;
    END IF;

    -- What is processing, counted before the lease's time is read (see the module's note).
    IF q.concurrency IS NOT NULL THEN
        SELECT count(*) INTO v_total FROM interactions WHERE queue = p_queue AND state = 'processing';
    END IF;
    IF q.per_owner_concurrency IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(b.owner, b.n), '{}') INTO v_busy
        FROM (SELECT owner, count(*) AS n FROM interactions WHERE queue = p_queue AND state = 'processing' GROUP BY owner) AS b;
    END IF;
    -- The latest finish, read from the end of ix_interactions_finished whatever the statistics say.
    v_now := greatest(p_now, (SELECT finished_at FROM interactions WHERE queue = p_queue AND finished_at IS NOT NULL
                              ORDER BY finished_at DESC LIMIT 1));
    IF q.rate_limit_count IS NOT NULL OR q.per_owner_rate_count IS NOT NULL THEN
        -- Nor earlier than the leases before it (the caller read its clock before waiting for the queue's row, which
        -- they held): each lease's time is in the rate window it was counted in.
        v_now := greatest(v_now, (SELECT max(leased_at) FROM interactions WHERE queue = p_queue AND state = 'processing'));
    END IF;

    v_room := p_max;
    IF q.concurrency IS NOT NULL THEN
        v_slots := q.concurrency - v_total;
        v_room := least(v_room, v_slots);
    END IF;
    IF q.rate_limit_count IS NOT NULL THEN
        v_left := mainspring_rate_left(q.rate_starts, v_now, q.rate_limit_per_ms, q.rate_limit_count);
        IF v_left < v_room THEN
            v_limited := mainspring_rate_free_at(q.rate_starts, v_now, q.rate_limit_per_ms);
        END IF;
        v_room := least(v_room, v_left);
    END IF;

    IF v_room > 0 THEN
        -- Stride scheduling (leasing._fair_shares): owners read in turn order a page at a time, only until no
        -- owner not read yet could come before those given an item; their heads read as their turns need.
        v_unread := q.fair_clock;
        LOOP
            -- Each owner's share of the room as the owners read so far take turns (leasing._stride), the items given
            -- and the last turn that gave one. An owner's items after the room-th owner's first turn cannot be among
            -- the room first (at least room items come no later), so none is generated.
            WITH bound AS (
                SELECT x.start AS t FROM unnest(o_start, o_cap) AS x(start, cap) WHERE x.cap > 0 ORDER BY x.start LIMIT 1 OFFSET v_room - 1)
            SELECT array_agg(coalesce(s.n, 0) ORDER BY c.i), coalesce(sum(s.n), 0), coalesce(max(s.last), -1)
            INTO o_share, v_sum, v_last
            FROM generate_subscripts(o_owner, 1) AS c(i) LEFT JOIN (
                SELECT p.i, count(*)::integer AS n, max(p.t) AS last FROM (
                    SELECT c2.i, c2.start + g.k * c2.stride AS t, c2.owner, g.k
                    FROM unnest(o_owner, o_start, o_stride, o_cap) WITH ORDINALITY AS c2(owner, start, stride, cap, i),
                         generate_series(0, least(c2.cap, v_room, coalesce(((SELECT b.t FROM bound AS b) - c2.start) / c2.stride + 1, v_room)) - 1) AS g(k)
                    ORDER BY 2, 3, 4 LIMIT v_room) AS p GROUP BY p.i) AS s ON s.i = c.i;
            IF v_unread IS NOT NULL AND (v_sum < v_room OR v_last > v_unread) THEN
                v_page := 0;
                FOR r IN SELECT o.owner, o.rate_starts, o.turn FROM interaction_owners AS o
                         WHERE o.queue = p_queue AND o.next_due IS NOT NULL AND o.next_due <= p_now
                         AND (o.turn, o.owner) > (v_after_turn, v_after_owner)
                         ORDER BY o.turn, o.owner LIMIT v_room + 1 LOOP
                    v_page := v_page + 1;
                    v_n := v_room;
                    IF q.per_owner_concurrency IS NOT NULL THEN
                        v_n := least(v_n, q.per_owner_concurrency - coalesce((v_busy ->> r.owner)::integer, 0));
                    END IF;
                    IF q.per_owner_rate_count IS NOT NULL AND q.per_owner_rate_per_ms IS NOT NULL THEN
                        v_n := least(v_n, mainspring_rate_left(r.rate_starts, v_now, q.per_owner_rate_per_ms, q.per_owner_rate_count));
                    END IF;
                    o_owner := o_owner || r.owner::text;
                    o_rs := array_append(o_rs, r.rate_starts);
                    o_start := o_start || greatest(r.turn, q.fair_clock);
                    o_cap := o_cap || greatest(v_n, 0);
                    o_in := o_in || (v_n > 0);
                    o_stride := o_stride || (p_stride / greatest(1, coalesce((q.weights ->> r.owner)::numeric::integer, 1)))::bigint;
                    o_got := o_got || 0;
                    o_exh := o_exh || false;
                    v_after_turn := r.turn;
                    v_after_owner := r.owner;
                END LOOP;
                IF v_page <= v_room THEN
                    v_unread := NULL;
                ELSE
                    v_unread := greatest(v_after_turn, q.fair_clock);
                END IF;
                CONTINUE;
            END IF;
            -- The heads the owners' shares still need.
            -- Counts the owners found with fewer heads than their share: only then do the shares change.
            v_n := 0;
            FOR r IN SELECT w.i, w.off, w.lim, ARRAY(SELECT d.id FROM interactions AS d WHERE d.queue = p_queue AND d.owner = w.owner
                                                    AND d.state = 'queued' AND d.next_processing <= p_now
                                                    ORDER BY d.priority DESC, d.next_processing, d.id LIMIT w.lim OFFSET w.off) AS ids
                     FROM (SELECT c.i, o_owner[c.i] AS owner, o_got[c.i] AS off, o_share[c.i] - o_got[c.i] AS lim
                           FROM generate_subscripts(o_owner, 1) AS c(i)
                           WHERE o_share[c.i] > o_got[c.i] AND NOT o_exh[c.i]) AS w LOOP
                FOR v_i IN 1 .. coalesce(cardinality(r.ids), 0) LOOP
                    h_i := h_i || r.i::integer;
                    h_k := h_k || (r.off + v_i - 1)::integer;
                    h_id := h_id || r.ids[v_i];
                END LOOP;
                o_got[r.i] := r.off + coalesce(cardinality(r.ids), 0);
                IF coalesce(cardinality(r.ids), 0) < r.lim THEN
                    v_n := v_n + 1;
                    o_exh[r.i] := true;
                    o_cap[r.i] := o_got[r.i];
                END IF;
            END LOOP;
            EXIT WHEN v_n = 0;
        END LOOP;

        -- The items, in the order of the turns taken; the served owners' windows and turns; the queue's clock,
        -- which follows the least-served owner still waiting.
        SELECT array_agg(h.id ORDER BY o_start[h.i] + h.k * o_stride[h.i], o_owner[h.i], h.k) INTO v_ids
        FROM unnest(h_i, h_k, h_id) AS h(i, k, id) WHERE h.k < o_share[h.i];
        SELECT min(w.t) INTO v_clock FROM (
            SELECT CASE WHEN o_share[c.i] > 0 THEN o_start[c.i] + o_share[c.i] * o_stride[c.i] ELSE o_start[c.i] END AS t
            FROM generate_subscripts(o_owner, 1) AS c(i)
            WHERE o_in[c.i] AND (NOT o_exh[c.i] OR o_got[c.i] > o_share[c.i])
            UNION ALL SELECT v_unread WHERE v_unread IS NOT NULL) AS w;
        IF v_clock IS NULL THEN
            SELECT max(o_start[c.i] + o_share[c.i] * o_stride[c.i]) INTO v_clock FROM generate_subscripts(o_owner, 1) AS c(i) WHERE o_share[c.i] > 0;
        END IF;
        IF v_clock IS NOT NULL AND v_clock <= q.fair_clock THEN
            v_clock := NULL;
        END IF;
        SELECT array_agg(o_owner[c.i] ORDER BY o_owner[c.i]) INTO v_exhausted FROM generate_subscripts(o_owner, 1) AS c(i) WHERE o_exh[c.i];

        INSERT INTO interaction_owners AS io (queue, owner, rate_starts, turn)
        SELECT p_queue, o_owner[c.i],
               CASE WHEN q.per_owner_rate_count IS NOT NULL AND q.per_owner_rate_per_ms IS NOT NULL
                    THEN mainspring_rate_started(o_rs[c.i], v_now, o_share[c.i], q.per_owner_rate_per_ms) ELSE o_rs[c.i] END,
               o_start[c.i] + o_share[c.i] * o_stride[c.i]
        FROM generate_subscripts(o_owner, 1) AS c(i) WHERE o_share[c.i] > 0 ORDER BY o_owner[c.i]
        ON CONFLICT (queue, owner) DO UPDATE SET rate_starts = excluded.rate_starts, turn = excluded.turn;

        v_expires := v_now + coalesce(p_lease_ms, q.lease_ms);
        IF q.processing_timeout_ms IS NOT NULL THEN
            v_expires := least(v_expires, v_now + q.processing_timeout_ms);
        END IF;
        WITH due AS MATERIALIZED (
            SELECT id FROM interactions WHERE id = ANY(v_ids) AND queue = p_queue AND state = 'queued' AND next_processing <= p_now
            FOR UPDATE SKIP LOCKED),
        taken AS (
            UPDATE interactions AS t SET state = 'processing', lease_token = p_token, lease_expires_at = v_expires, leased_at = v_now,
                worker = p_worker, wake = false, attempts = t.attempts + 1, updated_at = v_now
            WHERE t.id = ANY(ARRAY(SELECT id FROM due)) RETURNING t),
        ev AS (
            INSERT INTO events (type, at, subject_kind, subject_id, data)
            SELECT 'interaction.changed', v_now, 'interaction', (taken.t).id::text,
                   jsonb_build_object('queue', (taken.t).queue, 'status', 'processing', 'worker', p_worker)
            FROM taken ORDER BY array_position(v_ids, (taken.t).id))
        SELECT array_agg(taken.t ORDER BY array_position(v_ids, (taken.t).id)) INTO v_taken FROM taken;

        IF v_exhausted IS NOT NULL THEN
            -- After the take (what it took is no longer queued), under the owners' row locks taken first: a writer
            -- that queued an item for one of them has committed, or holds the row, which is then left as it is.
            SELECT array_agg(o.owner ORDER BY o.owner) INTO v_exhausted FROM (
                SELECT io.owner FROM interaction_owners AS io WHERE io.queue = p_queue AND io.owner = ANY(v_exhausted)
                ORDER BY io.owner FOR UPDATE SKIP LOCKED) AS o;
            UPDATE interaction_owners AS io SET next_due = (
                SELECT CASE WHEN count(*) < p_settle_read THEN min(s.next_processing) ELSE p_now END FROM (
                    SELECT d.next_processing FROM interactions AS d WHERE d.queue = p_queue AND d.owner = io.owner AND d.state = 'queued'
                    ORDER BY d.priority DESC, d.next_processing, d.id LIMIT p_settle_read) AS s)
            WHERE io.queue = p_queue AND io.owner = ANY(v_exhausted);
        END IF;
    END IF;

    IF cardinality(v_taken) > 0 AND q.rate_limit_count IS NOT NULL THEN
        v_starts := mainspring_rate_started(q.rate_starts, v_now, cardinality(v_taken), q.rate_limit_per_ms);
    END IF;
    IF v_clock IS NOT NULL OR v_starts IS NOT NULL THEN
        UPDATE interaction_queues SET fair_clock = coalesce(v_clock, fair_clock), rate_starts = coalesce(v_starts, rate_starts)
        WHERE name = p_queue;
    END IF;
    IF cardinality(v_taken) > 0 THEN
        PERFORM pg_notify(p_pg_channel, p_sequencer);
    END IF;
    IF coalesce(cardinality(v_taken), 0) < p_max THEN
        SELECT min(next_processing) INTO v_due FROM interactions WHERE queue = p_queue AND state = 'queued';
        SELECT min(lease_expires_at) INTO v_expiry FROM interactions WHERE queue = p_queue AND state = 'processing';
    END IF;
    IF cardinality(v_taken) > 0 THEN
        RETURN QUERY SELECT 'ok', q.lease_ms, q.processing_timeout_ms, v_due, v_expiry, v_slots, v_limited, v_taken[g.n]
                     FROM generate_subscripts(v_taken, 1) AS g(n) ORDER BY g.n;
    ELSE
        RETURN QUERY SELECT 'ok', q.lease_ms, q.processing_timeout_ms, v_due, v_expiry, v_slots, v_limited, NULL::interactions;
    END IF;
END
$fn$;
