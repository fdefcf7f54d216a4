"""``/openapi.json``, generated from the declared operations: every path, method, parameter, body and
answer the server has — nothing is described that the route table does not serve, and the reverse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from mainspring.web.http import PROBLEM, Problem
from mainspring.web.routing import AnySegment, Operation, RawBody

REF = "#/components/schemas/{model}"
# What any authenticated operation may answer, whatever else it documents.
COMMON_PROBLEMS = {401: "unauthenticated", 403: "forbidden", 413: "too_large", 429: "rate_limited", 503: "unavailable"}
REASONS = {200: "OK", 201: "Created", 202: "Accepted", 204: "No content", 400: "Bad request", 401: "Unauthenticated",
           403: "Forbidden", 404: "Not found", 409: "Conflict", 413: "Too large", 422: "Invalid request",
           429: "Too many requests", 499: "Client gone", 502: "Bad gateway", 503: "Unavailable", 504: "Gateway timeout"}


def build(operations: Sequence[Operation], *, title: str, version: str, description: str) -> dict[str, object]:
    shown = [op for op in operations if op.in_schema]
    inputs: list[tuple[Any, JsonSchemaMode, TypeAdapter[Any]]] = [(("problem", "serialization"), "serialization", TypeAdapter(Problem))]
    for op in shown:
        if op.body is not None and op.body is not RawBody:
            inputs.append(((id(op), "body"), "validation", TypeAdapter(op.body)))
        if op.answer is not None:
            inputs.append(((id(op), "answer"), "serialization", TypeAdapter(op.answer)))
    schemas, defs = TypeAdapter.json_schemas(inputs, ref_template=REF)
    components = dict(defs.get("$defs", {}))
    components["Problem"] = schemas[(("problem", "serialization"), "serialization")]
    paths: dict[str, dict[str, object]] = {}
    names: set[str] = set()
    for op in shown:
        if op.operation_id in names:
            raise ValueError(f"two operations with the id {op.operation_id}: operation ids must be unique")
        names.add(op.operation_id)
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A token (`mainspring token create`), when the server has any."}},
        },
    }


def _operation(op: Operation, schemas: dict[Any, Any]) -> dict[str, object]:
    out: dict[str, object] = {"tags": [op.tag], "summary": op.summary, "description": op.description, "operationId": op.operation_id}
    parameters = [_path_parameter(op, name) for name in op.param_names]
    if op.query is not None:
        parameters += _query_parameters(op.query)
    if parameters:
        out["parameters"] = parameters
    if op.body is RawBody:
        out["requestBody"] = {"required": True, "content": dict(op.content or {"application/octet-stream": {"schema": {"type": "string", "format": "binary", "minLength": 1}}})}
    elif op.body is not None:
        out["requestBody"] = {"required": op.body_required,
                              "content": {"application/json": {"schema": schemas[((id(op), "body"), "validation")]}}}
    responses: dict[str, object] = {}
    for status in (op.status, *op.answers):
        description = op.answers.get(status) or REASONS.get(status, "Success")
        if status == 204 or status >= 400 or (op.answer is None and op.content is None):
            responses[str(status)] = {"description": description}
        elif op.answer is None:
            responses[str(status)] = {"description": description, "content": dict(op.content or {})}
        else:
            responses[str(status)] = {"description": description,
                                      "content": {"application/json": {"schema": schemas[((id(op), "answer"), "serialization")]}}}
    problems: dict[int, list[str]] = {}
    for error in (*op.permission.problems(), *op.problems):
        codes = problems.setdefault(error.status, [])
        if error.code not in codes:
            codes.append(error.code)
    if parameters or op.body is not None:
        problems.setdefault(422, ["invalid_request"])
    if not op.public:
        for status, code in COMMON_PROBLEMS.items():
            problems.setdefault(status, [code])
        out["security"] = [{"bearer": []}]
    out["x-mainspring-permission"] = op.permission.describe()
    for status, codes in sorted(problems.items()):
        responses[str(status)] = {"description": f"{REASONS.get(status, 'Problem')}: {' / '.join(codes)}",
                                  "content": {PROBLEM: {"schema": {"$ref": REF.format(model="Problem")}}},
                                  "x-mainspring-codes": codes}
    out["responses"] = responses
    return out


def _path_parameter(op: Operation, name: str) -> dict[str, object]:
    schema = TypeAdapter(op.params.get(name, AnySegment)).json_schema()
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, object]]:
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", []))
    parameters = []
    for name, field_schema in schema.get("properties", {}).items():
        field_schema = dict(field_schema)
        description = field_schema.pop("description", None)
        parameter: dict[str, object] = {"name": name, "in": "query", "required": name in required, "schema": field_schema}
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters


__all__ = ["COMMON_PROBLEMS", "build"]
