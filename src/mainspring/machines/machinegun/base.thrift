/*
 * Mainspring's copy of Machinegun's base definitions (machinegun-proto, base.thrift).
 *
 * Written for Mainspring; the names, field ids and types are Machinegun's, because they are the wire
 * format: a Machinegun client or processor must read what Mainspring writes, byte for byte.
 */

namespace py mainspring_mg_base

/** A machine's id. */
typedef string ID

/** A namespace's name. */
typedef string Namespace

/** An event's id: 1, 2, 3… within one machine. */
typedef i64 EventID

/** Bytes only the sender understands. */
typedef binary Opaque

/** Bytes with a MIME type (RFC 2046) saying how to read them. */
struct Content {
    1: required string type
    2: required binary data
}

/** A moment, RFC 3339 in UTC, e.g. `2016-03-22T06:12:27Z` (Mainspring writes milliseconds too). */
typedef string Timestamp

/** A span of time; an absent bound is infinite. */
struct TimestampInterval {
    1: optional TimestampIntervalBound lower_bound
    2: optional TimestampIntervalBound upper_bound
}

struct TimestampIntervalBound {
    1: required BoundType bound_type
    2: required Timestamp bound_time
}

enum BoundType {
    inclusive
    exclusive
}

typedef map<string, string> StringMap

/** p / q. */
struct Rational {
    1: required i64 p
    2: required i64 q
}

/** Seconds. */
typedef i32 Timeout

/** When a timer fires: after so many seconds, or at a moment. */
union Timer {
    1: Timeout timeout
    2: Timestamp deadline
}

/** Input the business logic cannot accept. */
exception InvalidRequest {
    1: required list<string> errors
}
