"""Machinegun's own protocol on the machines face: Thrift over HTTP ("woody").

- ``*.thrift``: the project's IDL, wire-compatible with machinegun-proto (same names, ids, types).
- ``idl``: the IDL loaded once with thriftpy2.
- ``codec``: msgpack ``Value``/``Content`` <-> the JSON the store keeps, losslessly.
- ``woody``: woody's HTTP conventions (trace headers, deadline, error headers and status codes).
- ``automaton``: the ``Automaton`` service served at ``machines.machinegun.automaton_path``.
- ``processor``: calling a user's ``Processor`` service for a namespace with ``processor.protocol = "machinegun"``.
- ``sink``: machine events to Kafka as Thrift-binary ``SinkEvent`` records.

Everything here maps onto the face's service functions; nothing here touches the store directly.
"""
