/*
 * Mainspring's copy of Machinegun's state processing protocol (machinegun-proto,
 * state_processing.thrift): the Automaton service clients call (served by automaton.py at
 * POST /v1/machinegun/automaton) and the Processor service Mainspring calls for a namespace whose
 * `processor.protocol` is "machinegun" (processor.py).
 *
 * Names, field ids, types and requiredness are Machinegun's: they are the wire format. Ids that look
 * out of order (Machine 6-8, Event 4-5, MachineStateChange 3-4) are Machinegun's too; the missing ones
 * were legacy fields it retired, and must stay unused.
 */

include "base.thrift"
include "msgpack.thrift"

namespace py mainspring_mg_stateproc

exception EventNotFound {}
exception MachineNotFound {}
exception NamespaceNotFound {}
exception MachineAlreadyExists {}
exception MachineFailed {}
exception MachineAlreadyWorking {}

/** A payload with the version of its shape (the processor's own numbering). */
struct Content {
    1: optional i32 format_version
    2: required msgpack.Value data
}

typedef Content EventBody
typedef list<EventBody> EventBodies
typedef Content AuxState
typedef msgpack.Value Args

/** One event of a machine's history. */
struct Event {
    1: required base.EventID id
    2: required base.Timestamp created_at
    /* Content's two fields, inlined under other ids. */
    5: optional i32 format_version
    4: required msgpack.Value data
}

/** A range of a machine's history, in the order the range asked for. */
typedef list<Event> History

union MachineStatus {
    1: MachineStatusWorking working
    2: MachineStatusFailed failed
}

struct MachineStatusWorking {}

struct MachineStatusFailed {
    1: optional string reason
}

/** A machine as a processor or a GetMachine caller sees it. */
struct Machine {
    1: required base.Namespace ns
    2: required base.ID id
    3: required History history
    /** The range the history above was read with. */
    4: required HistoryRange history_range
    8: optional MachineStatus status
    7: optional AuxState aux_state
    /** When the machine's timer fires, if it has one. */
    6: optional base.Timestamp timer
}

/** Which machine, and which part of its history goes to the processor (or back to the caller). */
struct MachineDescriptor {
    1: required base.Namespace ns
    2: required Reference ref
    3: required HistoryRange range
}

/** What the processor wants done after its step; absent fields ask for nothing. */
struct ComplexAction {
    3: optional TimerAction timer
    4: optional RemoveAction remove
}

union TimerAction {
    1: SetTimerAction set_timer
    2: UnsetTimerAction unset_timer
}

/** Set (or move) the machine's one timer; it fires a TimeoutSignal. */
struct SetTimerAction {
    1: required base.Timer timer
    /** The history the timeout step is sent (default: all of it). */
    2: optional HistoryRange range
    /** Seconds the timeout step's processor call may take (default: the namespace's timeout). */
    3: optional base.Timeout timeout
}

/** Remove the machine's timer; without it a timer stays set. */
struct UnsetTimerAction {}

/** Remove the machine after this step's events are written. */
struct RemoveAction {}

union Reference {
    1: base.ID id
}

/** What a step changes: a new aux state (absent: unchanged) and new events. */
struct MachineStateChange {
    3: optional AuxState aux_state
    4: optional EventBodies events
}

typedef msgpack.Value CallResponse

struct CallArgs {
    1: required Args arg
    2: required Machine machine
}

struct CallResult {
    1: required CallResponse response
    2: required MachineStateChange change
    3: required ComplexAction action
}

union Signal {
    1: InitSignal init
    2: TimeoutSignal timeout
    3: NotificationSignal notification
}

struct InitSignal {
    1: required msgpack.Value arg
}

struct TimeoutSignal {}

struct NotificationSignal {
    1: required Args arg
}

struct SignalArgs {
    1: required Signal signal
    2: required Machine machine
}

struct SignalResult {
    1: required MachineStateChange change
    2: required ComplexAction action
}

struct RepairArgs {
    1: required Args arg
    2: required Machine machine
}

struct RepairResult {
    1: required RepairResponse response
    2: required MachineStateChange change
    3: required ComplexAction action
}

typedef msgpack.Value RepairResponse

/** The processor refused a repair; the machine stays failed and the caller gets `reason`. */
exception RepairFailed {
    1: required msgpack.Value reason
}

/** The user's business logic: one step of one machine per call. */
service Processor {
    SignalResult ProcessSignal (1: SignalArgs a) throws ()
    CallResult ProcessCall (1: CallArgs a) throws ()
    RepairResult ProcessRepair (1: RepairArgs a) throws (1: RepairFailed ex1)
}

struct MachineEvent {
    1: required base.Namespace ns
    2: required base.ID id
    3: required Event event
}

struct ModernizeEventResult {
    1: required EventBody event_payload
}

/** Rewrites old event shapes: Automaton.Modernize calls it for each outdated event of the machine. */
service Modernizer {
    ModernizeEventResult ModernizeEvent (1: MachineEvent ev) throws ()
}

enum Direction {
    forward = 1
    backward = 2
}

/** Events after `after` (absent: from the start), at most `limit` (absent: all), in `direction`. */
struct HistoryRange {
    1: optional base.EventID after
    2: optional i32 limit
    3: optional Direction direction = Direction.forward
}

typedef string NotificationID

struct NotifyResponse {
    1: required NotificationID id
}

/**
 * The machines themselves. A reference to a machine that does not exist throws MachineNotFound; a
 * range whose `after` is past the machine's last event is an empty history (GetMachine); a machine that
 * failed on the way throws MachineFailed.
 */
service Automaton {
    void Start (1: base.Namespace ns, 2: base.ID id, 3: Args a)
        throws (1: NamespaceNotFound ex1, 2: MachineAlreadyExists ex2, 3: MachineFailed ex3);

    RepairResponse Repair (1: MachineDescriptor desc, 2: Args a)
        throws (
            1: NamespaceNotFound ex1,
            2: MachineNotFound ex2,
            3: MachineFailed ex3,
            4: MachineAlreadyWorking ex4,
            5: RepairFailed ex5
        );

    void SimpleRepair (1: base.Namespace ns, 2: Reference ref)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2, 3: MachineFailed ex3, 4: MachineAlreadyWorking ex4);

    CallResponse Call (1: MachineDescriptor desc, 2: Args a)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2, 3: MachineFailed ex3);

    Machine GetMachine (1: MachineDescriptor desc)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2, 3: EventNotFound ex3);

    /** Remove a machine with its events; events already on a sink stay there. */
    void Remove (1: base.Namespace ns, 2: base.ID id)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2);

    void Modernize (1: MachineDescriptor desc)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2);

    NotifyResponse Notify (1: MachineDescriptor desc, 2: Args a)
        throws (1: NamespaceNotFound ex1, 2: MachineNotFound ex2)
}

// The polling event sink (machinegun-proto retired it in 2024; machinegun-woody-api still serves it at
// /v1/event_sink): the events of every machine of the sink namespaces, in the order they were committed.
// SinkEvent.id is the sink event id (the outbox position of Mainspring): total ordered, the next after.
struct SinkEvent {
    1: required base.EventID    id;
    2: required base.ID         source_id;
    3: required base.Namespace  source_ns;
    4: required Event           event;
}

typedef list<SinkEvent> SinkHistory;

exception EventSinkNotFound {}

service EventSink {
    SinkHistory GetHistory (1: base.ID event_sink_id, 2: HistoryRange range)
         throws (1: EventSinkNotFound ex1, 2: EventNotFound ex2, 3: base.InvalidRequest ex3);
}
