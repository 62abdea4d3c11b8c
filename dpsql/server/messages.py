"""PostgreSQL protocol 3.0 messages: bytes out of values and values out of bytes, no I/O.

Every backend message is ``type byte, int32 length (itself included), body``; the startup
packet has no type byte. Strings are NUL-terminated UTF-8.

>>> command_complete("SELECT 1")
b'C\\x00\\x00\\x00\\rSELECT 1\\x00'
>>> parse_startup(b"\\x00\\x03\\x00\\x00user\\x00ada\\x00database\\x00shop\\x00\\x00")
Startup(code=196608, parameters={'user': 'ada', 'database': 'shop'})
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSS_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP = 10_000
"""Bytes a startup packet may take (PostgreSQL's own limit)."""
MAX_MESSAGE = 1 << 20
"""Bytes any later message may take: a query of a megabyte is already absurd."""


class ProtocolError(Exception):
    """The client broke the protocol; the connection is closed after saying so."""


@dataclass(frozen=True)
class Startup:
    """A startup-phase packet: protocol 3.0, or an SSL, GSS or cancel request."""

    code: int
    parameters: dict = field(default_factory=dict)
    """user, database, application_name... (protocol 3.0); pid and key (cancel)."""


def parse_startup(body: bytes) -> Startup:
    """The packet after its length word."""
    if len(body) < 4:
        raise ProtocolError("startup packet too short")
    (code,) = struct.unpack("!i", body[:4])
    if code == CANCEL_REQUEST:
        if len(body) != 12:
            raise ProtocolError("malformed cancel request")
        pid, key = struct.unpack("!ii", body[4:12])
        return Startup(code, {"pid": pid, "key": key})
    if code in (SSL_REQUEST, GSS_REQUEST):
        return Startup(code)
    if code >> 16 != 3:
        raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                            "this server speaks protocol 3.0")
    strings = body[4:].split(b"\x00")
    if len(strings) < 2 or strings[-1] != b"" or strings[-2] != b"" or len(strings) % 2:
        raise ProtocolError("malformed startup packet")
    try:
        decoded = [s.decode("utf-8") for s in strings[:-2]]
    except UnicodeDecodeError:
        raise ProtocolError("startup packet is not UTF-8") from None
    return Startup(code, dict(zip(decoded[::2], decoded[1::2])))


class Reader:
    """Reads NUL-terminated strings and integers from a message body in order."""

    def __init__(self, body: bytes):
        self._body, self._at = body, 0

    def string(self) -> str:
        end = self._body.find(b"\x00", self._at)
        if end < 0:
            raise ProtocolError("unterminated string in message")
        try:
            text = self._body[self._at:end].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("message text is not UTF-8") from None
        self._at = end + 1
        return text

    def int16(self) -> int:
        return self._unpack("!h", 2)

    def int32(self) -> int:
        return self._unpack("!i", 4)

    def raw(self, size: int) -> bytes:
        if size < 0 or self._at + size > len(self._body):
            raise ProtocolError("message shorter than its fields")
        chunk = self._body[self._at:self._at + size]
        self._at += size
        return chunk

    def _unpack(self, fmt: str, size: int) -> int:
        return struct.unpack(fmt, self.raw(size))[0]


@dataclass(frozen=True)
class Bind:
    """A Bind message: which statement, which parameters, which result formats."""

    portal: str
    statement: str
    parameter_formats: tuple
    """0 text, 1 binary: one for all, or one per parameter."""
    parameters: tuple
    result_formats: tuple


def parse_bind(body: bytes) -> Bind:
    read = Reader(body)
    portal, statement = read.string(), read.string()
    parameter_formats = tuple(read.int16() for _ in range(read.int16()))
    parameters = []
    for _ in range(read.int16()):
        size = read.int32()
        parameters.append(None if size == -1 else read.raw(size))
    formats = tuple(read.int16() for _ in range(read.int16()))
    return Bind(portal, statement, parameter_formats, tuple(parameters), formats)


def bound_parameters(bind: Bind) -> tuple:
    """The parameters as text: text-format ones decoded, binary ones read as the integers or
    booleans drivers send that way (their size tells which); anything else is refused.

    >>> bound_parameters(Bind("", "", (1,), (b"\\x00\\x00\\x00\\x07", None), ()))
    ('7', None)
    """
    formats = bind.parameter_formats or (0,)
    values: list[str | None] = []
    for index, value in enumerate(bind.parameters):
        binary = (formats[index] if len(formats) > 1 else formats[0]) == 1
        if value is None:
            values.append(None)
        elif not binary:
            try:
                values.append(value.decode("utf-8"))
            except UnicodeDecodeError:
                raise ProtocolError(f"parameter ${index + 1} is not UTF-8 text") from None
        elif len(value) == 1:
            values.append("t" if value != b"\x00" else "f")
        elif len(value) in (2, 4, 8):
            values.append(str(int.from_bytes(value, "big", signed=True)))
        else:
            raise ProtocolError(f"parameter ${index + 1} is in a binary format this server does not read")
    return tuple(values)


def parse_parse(body: bytes) -> tuple[str, str, int]:
    """(statement name, query, number of declared parameter types)."""
    read = Reader(body)
    return read.string(), read.string(), read.int16()


def parse_target(body: bytes) -> tuple[str, str]:
    """Describe and Close: ('S' or 'P', name)."""
    read = Reader(body)
    kind = read.raw(1).decode("latin-1")
    if kind not in "SP":
        raise ProtocolError(f"describe or close of unknown kind {kind!r}")
    return kind, read.string()


def parse_execute(body: bytes) -> tuple[str, int]:
    read = Reader(body)
    return read.string(), read.int32()


# -- backend messages --------------------------------------------------------------------------

def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstring(text: str) -> bytes:
    return text.replace("\x00", "").encode("utf-8") + b"\x00"


def authentication(code: int, data: bytes = b"") -> bytes:
    """AuthenticationOk (0), SASL (10), SASLContinue (11), SASLFinal (12)."""
    return message(b"R", struct.pack("!i", code) + data)


def sasl_mechanisms(*names: str) -> bytes:
    return authentication(10, b"".join(_cstring(n) for n in names) + b"\x00")


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", _cstring(name) + _cstring(value))


def backend_key(pid: int, key: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, key))


def ready_for_query(status: str) -> bytes:
    """status: 'I' idle, 'T' in a transaction block."""
    return message(b"Z", status.encode("ascii"))


def row_description(columns: list[tuple[str, int]]) -> bytes:
    """One field per (name, type OID); values always go in text format (format code 0)."""
    body = struct.pack("!h", len(columns))
    for name, oid in columns:
        body += _cstring(name) + struct.pack("!ihihih", 0, 0, oid, -1, -1, 0)
    return message(b"T", body)


def data_row(values: list[bytes | None]) -> bytes:
    body = struct.pack("!h", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return message(b"D", body)


def command_complete(tag: str) -> bytes:
    return message(b"C", _cstring(tag))


def fields_message(kind: bytes, fields: dict[str, str]) -> bytes:
    """ErrorResponse (b'E') or NoticeResponse (b'N') from single-letter fields."""
    body = b"".join(code.encode("ascii") + _cstring(value) for code, value in fields.items())
    return message(kind, body + b"\x00")


def error_response(sqlstate: str, text: str, *, position: int | None = None, hint: str | None = None,
                   severity: str = "ERROR") -> bytes:
    fields = {"S": severity, "V": severity, "C": sqlstate, "M": text}
    if hint:
        fields["H"] = hint
    if position is not None:
        fields["P"] = str(position)
    return fields_message(b"E", fields)


def notice(text: str, *, detail: str | None = None) -> bytes:
    fields = {"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": text}
    if detail:
        fields["D"] = detail
    return fields_message(b"N", fields)


EMPTY_QUERY = message(b"I")
PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")


def parameter_description(oids: list[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!i", oid) for oid in oids))


def printable(text: str, limit: int = 300) -> str:
    """Text as one log line: control characters escaped (a user name holding a newline forged
    a second log line), cut to ``limit`` characters (long names flooded the log).

    >>> printable("x\\n2026 INFO analyst bob ok")
    'x\\\\n2026 INFO analyst bob ok'
    """
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."
