"""Strict decoding of JSON request bodies into Consul's definition structs.

Consul decodes bodies with Go's ``encoding/json``: keys match struct fields
case-insensitively, snake_case spellings are translated (``tagged_addresses``,
``deregister_critical_service_after``), durations are Go duration strings or
integer nanoseconds, and a value of the wrong JSON type fails the whole request
with ``json: cannot unmarshal ...``.  The dev agent does the same, with one
deliberate difference: a key that names no field of the struct is rejected
(``json: unknown field "X"``) where Consul silently drops it, so a misspelt key
fails loudly in tests instead of registering something else than intended.
"""

from __future__ import annotations

from typing import Any

from hvd_elastic.gotypes import parse_duration

STRING, INT, BOOL, DURATION, STRLIST, STRMAP, HEADERS, OBJECT, ANY = (
    "string", "int", "bool", "time.Duration", "[]string", "map[string]string",
    "map[string][]string", "object", "any",
)


class DecodeError(ValueError):
    """The body does not decode; the message is Consul's ``Request decode failed: ...`` reason."""


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _fail(value: Any, struct: str, field: str, gotype: str) -> DecodeError:
    kind = _json_kind(value)
    shown = f"number {value}" if kind == "number" else kind
    return DecodeError(f"json: cannot unmarshal {shown} into Go struct field {struct}.{field} of type {gotype}")


def _key(name: str) -> str:
    return name.replace("_", "").lower()


def _convert(value: Any, gotype: str, struct: str, field: str) -> Any:
    if value is None:
        return None  # JSON null leaves a Go field at its zero value
    if gotype == ANY:
        return value
    if gotype == STRING:
        if not isinstance(value, str):
            raise _fail(value, struct, field, gotype)
        return value
    if gotype == INT:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise _fail(value, struct, field, gotype)
        return int(value)
    if gotype == BOOL:
        if not isinstance(value, bool):
            raise _fail(value, struct, field, gotype)
        return value
    if gotype == DURATION:
        if isinstance(value, str):
            try:
                return parse_duration(value)
            except ValueError as exc:
                raise DecodeError(f"error decoding '{field}': {exc}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(value, struct, field, gotype)
        return int(value)
    if gotype == STRLIST:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(value, struct, field, gotype)
        return list(value)
    if gotype == STRMAP:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _fail(value, struct, field, gotype)
        return dict(value)
    if gotype == HEADERS:
        ok = isinstance(value, dict) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()
        )
        if not ok:
            raise _fail(value, struct, field, gotype)
        return {k: list(v) for k, v in value.items()}
    if gotype == OBJECT:
        if not isinstance(value, dict):
            raise _fail(value, struct, field, gotype)
        return value
    raise AssertionError(gotype)


_LOOKUPS: dict[str, dict[str, str]] = {}


def _lookup(struct: str, fields: dict[str, str], aliases: dict[str, str] | None) -> dict[str, str]:
    """Normalised key -> canonical field name, built once per struct."""
    table = _LOOKUPS.get(struct)
    if table is None:
        table = {_key(name): name for name in fields}
        for alias, target in (aliases or {}).items():
            table[_key(alias)] = target
        _LOOKUPS[struct] = table
    return table


def decode_struct(raw: Any, struct: str, fields: dict[str, str], aliases: dict[str, str] | None = None) -> dict:
    """Decode a JSON object into ``{CanonicalField: value}`` following ``fields``.

    ``fields`` maps each canonical (CamelCase) field name to its Go type name;
    ``aliases`` maps extra accepted spellings to canonical names.
    """
    if not isinstance(raw, dict):
        raise DecodeError(f"json: cannot unmarshal {_json_kind(raw)} into Go value of type structs.{struct}")
    lookup = _lookup(struct, fields, aliases)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = lookup.get(_key(key))
        if name is None:
            raise DecodeError(f'json: unknown field "{key}"')
        converted = _convert(value, fields[name], struct, name)
        if converted is not None:
            out[name] = converted
    return out


CHECK_FIELDS = {
    "CheckID": STRING, "Name": STRING, "Status": STRING, "Notes": STRING, "ServiceID": STRING,
    "TTL": DURATION, "HTTP": STRING, "Header": HEADERS, "Method": STRING, "Body": STRING,
    "DisableRedirects": BOOL, "TLSServerName": STRING, "TLSSkipVerify": BOOL, "TCP": STRING,
    "Interval": DURATION, "Timeout": DURATION, "DeregisterCriticalServiceAfter": DURATION,
    "SuccessBeforePassing": INT, "FailuresBeforeWarning": INT, "FailuresBeforeCritical": INT,
    "OutputMaxSize": INT,
    # Check kinds Consul has and the dev agent does not run: decoded so that
    # their use is refused with a clear message rather than "unknown field".
    "ScriptArgs": STRLIST, "Args": STRLIST, "DockerContainerID": STRING, "Shell": STRING, "GRPC": STRING,
    "GRPCUseTLS": BOOL, "H2PING": STRING, "H2PingUseTLS": BOOL, "UDP": STRING, "TCPUseTLS": BOOL,
    "AliasNode": STRING, "AliasService": STRING, "OSService": STRING,
}
CHECK_ALIASES = {"ID": "CheckID"}
UNSUPPORTED_CHECK_FIELDS = (
    "ScriptArgs", "Args", "DockerContainerID", "Shell", "GRPC", "H2PING", "UDP", "AliasNode",
    "AliasService", "OSService",
)

SERVICE_FIELDS = {
    "Kind": STRING, "ID": STRING, "Name": STRING, "Tags": STRLIST, "Address": STRING,
    "TaggedAddresses": OBJECT, "Meta": STRMAP, "Port": INT, "SocketPath": STRING,
    "EnableTagOverride": BOOL, "Weights": OBJECT, "Check": OBJECT, "Checks": ANY, "Token": STRING,
    "Proxy": OBJECT, "Connect": OBJECT, "Namespace": STRING, "Partition": STRING, "Locality": OBJECT,
}
WEIGHTS_FIELDS = {"Passing": INT, "Warning": INT}
SESSION_FIELDS = {
    "LockDelay": ANY, "Name": STRING, "Node": STRING, "Checks": STRLIST, "NodeChecks": STRLIST,
    "ServiceChecks": ANY, "Behavior": STRING, "TTL": STRING, "Namespace": STRING, "Partition": STRING,
}
CHECK_UPDATE_FIELDS = {"Status": STRING, "Output": STRING}
SERVICE_ADDRESS_FIELDS = {"Address": STRING, "Port": INT}


def decode_service_addresses(raw: Any, struct: str) -> dict[str, dict]:
    """A service's ``TaggedAddresses``: ``{tag: {"Address": str, "Port": int}}``, keys capitalised.

    Consul decodes each entry into its ``ServiceAddress`` struct (keys matched
    case-insensitively) and always writes it back as ``Address``/``Port``.
    """
    if not isinstance(raw, dict):
        raise _fail(raw, struct, "TaggedAddresses", "map[string]structs.ServiceAddress")
    out = {}
    for tag, entry in raw.items():
        if not isinstance(entry, dict):
            raise _fail(entry, struct, "TaggedAddresses", "structs.ServiceAddress")
        fields = decode_struct(entry, "ServiceAddress", SERVICE_ADDRESS_FIELDS)
        out[tag] = {"Address": fields.get("Address", ""), "Port": fields.get("Port", 0)}
    return out


def decode_check(raw: Any, struct: str = "CheckType") -> dict:
    check = decode_struct(raw, struct, CHECK_FIELDS, CHECK_ALIASES)
    for name in UNSUPPORTED_CHECK_FIELDS:
        if check.get(name):
            raise DecodeError(f"{name} checks are not supported by the hvd-elastic dev agent (TTL, HTTP and TCP are)")
    return check


def decode_service(raw: Any) -> dict:
    svc = decode_struct(raw, "ServiceDefinition", SERVICE_FIELDS)
    if "TaggedAddresses" in svc:
        svc["TaggedAddresses"] = decode_service_addresses(svc["TaggedAddresses"], "ServiceDefinition")
    if "Weights" in svc:
        svc["Weights"] = decode_struct(svc["Weights"], "Weights", WEIGHTS_FIELDS)
    if "Check" in svc:
        svc["Check"] = decode_check(svc["Check"])
    checks = svc.get("Checks")
    if checks is not None:
        if not isinstance(checks, list):
            raise _fail(checks, "ServiceDefinition", "Checks", "structs.CheckTypes")
        svc["Checks"] = [decode_check(c) for c in checks]
    for name in ("Proxy", "Connect", "SocketPath"):
        if svc.get(name):
            raise DecodeError(f"{name} (Consul service mesh) is not supported by the hvd-elastic dev agent")
    if svc.get("Kind"):
        raise DecodeError(f"service Kind {svc['Kind']!r} is not supported by the hvd-elastic dev agent")
    for name in ("Namespace", "Partition"):
        if svc.get(name) not in (None, "", "default"):
            raise DecodeError(f"{name}s are a Consul Enterprise feature")
    return svc
