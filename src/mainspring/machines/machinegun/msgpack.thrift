/*
 * Mainspring's copy of Machinegun's msgpack-shaped value (machinegun-proto, msgpack.thrift): every
 * payload that crosses the Automaton and Processor services (args, events, aux state, responses) is one.
 * Mainspring keeps it as JSON, losslessly: see codec.py and docs/machinegun.md.
 */

namespace py mainspring_mg_msgpack

union Value {
    1: Nil nl
    2: bool b
    3: i64 i
    /** Finite only: no ±Inf, no NaN. */
    4: double flt
    5: string str
    6: binary bin
    7: Object obj
    8: Array arr
}

struct Nil {}
typedef list<Value> Array
typedef map<Value, Value> Object
