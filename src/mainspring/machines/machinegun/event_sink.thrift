/*
 * Mainspring's copy of Machinegun's event sink message (machinegun-proto, event_sink.thrift): what the
 * Thrift Kafka sink (sink.py) writes, one Thrift-binary SinkEvent per machine event.
 */

include "base.thrift"
include "msgpack.thrift"

namespace py mainspring_mg_evsink

union SinkEvent {
    1: MachineEvent event
}

/** One new event of one machine. */
struct MachineEvent {
    1: required base.Namespace source_ns
    2: required base.ID source_id
    /** 1, 2, 3… without gaps within one machine: the order the machine made them in. */
    3: required base.EventID event_id
    4: required base.Timestamp created_at
    5: optional i32 format_version
    6: required msgpack.Value data
}
