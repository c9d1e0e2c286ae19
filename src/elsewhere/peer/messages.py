"""The peer protocol's messages: one frozen dataclass per message type.

What one frame says, without the frame around it: one frozen dataclass per
message whose fields are its msgpack header (:meth:`Message.to_header`,
:func:`parse_header`), each checked as it is built, and the reasons a worker
refuses an ASK (:class:`RefuseReason`, whose numbers never change).
:class:`Identity` is what a peer says of itself in HELLO or CHALLENGE.

The protocol's numbers, the message types, the flags and the fixed frame
header are in :mod:`.layout` (and importable from here too); the handshake
and its keys in :mod:`.handshake`; the admission rules in :mod:`.wire`, whose
:class:`~.wire.Connection` frames, sends and receives these messages.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import msgpack

from ..util.errors import ProtocolError
from .fields import MAX_ACKS, check_ask, check_info, count, task_ids, task_numbers, text
from .layout import (  # the frame's numbers, importable from here as they always were
    FIXED,
    FIXED_SIZE,
    FLAG_VALUES,
    HANDSHAKE_HEADER_CAP,
    HANDSHAKE_TYPES,
    LANE_SUFFIX,
    MAGIC,
    NONCE_BYTES,
    PAYLOAD_TYPES,
    PROTOCOL_VERSION,
    TAG_SIZE,
    FixedHeader,
    Flags,
    MessageType,
    RefuseReason,
)

__all__ = [
    "FIXED",
    "FIXED_SIZE",
    "FLAG_VALUES",
    "HANDSHAKE_HEADER_CAP",
    "HANDSHAKE_TYPES",
    "LANE_SUFFIX",
    "MAGIC",
    "MAX_ACKS",
    "MESSAGE_CLASSES",
    "NONCE_BYTES",
    "PAYLOAD_TYPES",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "Accept",
    "Ack",
    "Ask",
    "Auth",
    "Bye",
    "Cancel",
    "Challenge",
    "Error",
    "FixedHeader",
    "Flags",
    "Greeting",
    "Hello",
    "Identity",
    "Message",
    "MessageType",
    "Ping",
    "Pong",
    "Refuse",
    "RefuseReason",
    "Result",
    "Task",
    "TaskMessage",
    "parse_header",
]

# ---------------------------------------------------------------- messages

_M = TypeVar("_M", bound="Message")


def _built(cls: type[_M], **fields: Any) -> _M:
    """A message this end built of values it made itself, every field given: not checked
    again (the receiver checks every message it reads). A frozen dataclass's own
    ``__init__`` and checks cost more than the rest of making a frame of a tiny task."""
    message = object.__new__(cls)
    message.__dict__.update(fields)
    return message


@dataclass(frozen=True)
class Message:
    """Base of the messages; each subclass is one :class:`MessageType`."""

    TYPE: ClassVar[MessageType]
    _FIELDS: ClassVar[tuple[str, ...]] = ()  # set below, once the classes exist
    _FIELD_SET: ClassVar[frozenset[str]] = frozenset()

    def to_header(self) -> dict[str, Any]:
        """The msgpack header (a dict of plain values) of this message."""
        out = {name: getattr(self, name) for name in self._FIELDS}
        for name, value in out.items():
            if isinstance(value, enum.IntEnum):
                out[name] = int(value)
        return out

    @classmethod
    def from_header(cls: type[_M], header: Mapping[str, Any]) -> _M:
        """Build from a received header; unknown keys are ignored (newer peers)."""
        names = cls._FIELD_SET
        try:
            if header.keys() <= names:  # the usual case: nothing to leave out
                return cls(**header)
            return cls(**{k: v for k, v in header.items() if k in names})
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid {cls.TYPE.name} message: {exc}") from None


@dataclass(frozen=True)
class Greeting(Message):
    """Who a peer is: the fields of HELLO and CHALLENGE."""

    peer_id: str
    group: str
    user: str
    host: str
    keyed: bool
    nonce: bytes = field(repr=False)
    caps: tuple[str, ...] = ()
    encrypt: bool = False
    """Whether this end encrypts its frames after the handshake (absent: it does not, as a
    peer older than encryption); with a key both ends must say the same."""
    keys: tuple[str, ...] = ()
    """In a HELLO: the fingerprints of the group keys the initiator holds, newest first (after
    a rotation, the previous keys still in their overlap); the responder proves the newest
    one it holds too. Absent: the initiator's one key."""
    dh: bytes = field(default=b"", repr=False)
    """This end's X25519 key share for this connection (32 bytes; absent from an older
    peer): the connection's keys come from the group key *and* the exchange of the two."""
    ciphers: tuple[str, ...] = ()
    """The ciphers this end offers, best first (names of :mod:`.ciphers`; absent: an older
    peer's AES-256-GCM alone); the worker takes the first of the controller's that it has."""

    def __post_init__(self) -> None:
        text(self.peer_id, "peer_id", empty=False)
        text(self.group, "group")
        text(self.user, "user")
        text(self.host, "host")
        if not isinstance(self.keyed, bool):
            raise ValueError(f"keyed must be a bool, got {self.keyed!r:.80}")
        if not isinstance(self.nonce, bytes) or len(self.nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        if not isinstance(self.caps, (list, tuple)) or len(self.caps) > 32:
            raise ValueError(f"caps must be a list of at most 32 names, got {self.caps!r:.80}")
        for cap in self.caps:
            if not isinstance(cap, str) or not 0 < len(cap) <= 64:
                raise ValueError(f"a capability must be a str of 1..64 characters, got {cap!r:.80}")
        object.__setattr__(self, "caps", tuple(self.caps))
        if not isinstance(self.encrypt, bool):
            raise ValueError(f"encrypt must be a bool, got {self.encrypt!r:.80}")
        if not isinstance(self.keys, (list, tuple)) or len(self.keys) > 8:
            raise ValueError(f"keys must be a list of at most 8 fingerprints, got {self.keys!r:.80}")
        for fingerprint in self.keys:
            if not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= 64:
                raise ValueError(f"a key fingerprint must be a str of 1..64 characters, got {fingerprint!r:.80}")
        object.__setattr__(self, "keys", tuple(self.keys))
        if not isinstance(self.dh, bytes) or len(self.dh) not in (0, 32):
            raise ValueError("dh must be 32 bytes (an X25519 public key), or none")
        if not isinstance(self.ciphers, (list, tuple)) or len(self.ciphers) > 8:
            raise ValueError(f"ciphers must be a list of at most 8 names, got {self.ciphers!r:.80}")
        for name in self.ciphers:
            if not isinstance(name, str) or not 0 < len(name) <= 32:
                raise ValueError(f"a cipher must be a str of 1..32 characters, got {name!r:.80}")
        object.__setattr__(self, "ciphers", tuple(self.ciphers))


@dataclass(frozen=True)
class Hello(Greeting):
    """First frame, from the initiator."""

    TYPE = MessageType.HELLO


@dataclass(frozen=True)
class Challenge(Greeting):
    """The responder's answer to HELLO, with its proof of the key."""

    TYPE = MessageType.CHALLENGE


@dataclass(frozen=True)
class Identity:
    """Who this end says it is in HELLO or CHALLENGE."""

    peer_id: str
    user: str = ""
    host: str = ""

    def __post_init__(self) -> None:
        text(self.peer_id, "peer_id", empty=False)
        text(self.user, "user")
        text(self.host, "host")


@dataclass(frozen=True)
class Auth(Message):
    """The initiator's proof of the key; it ends the handshake."""

    TYPE = MessageType.AUTH


@dataclass(frozen=True)
class TaskMessage(Message):
    """Base of the messages about one task (ASK, ACCEPT, REFUSE, TASK, RESULT, ACK, CANCEL)."""

    task_id: str

    def __post_init__(self) -> None:
        text(self.task_id, "task_id", empty=False)


@dataclass(frozen=True)
class Ask(TaskMessage):
    """Admission request: may I send this task? Sent before any payload. ``lane``: the
    controller asks, on a connection of its own, for the slot to be served by a task process
    directly (to a peer that said ``lane``; see "Lanes" in docs/peer-protocol.md)."""

    TYPE = MessageType.ASK
    mem_bytes: int = 0
    time_s: float = 0.0
    cores: int = 1
    lane: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "time_s", check_ask(self.mem_bytes, self.time_s, self.cores, self.lane))

    def to_header(self) -> dict[str, Any]:  # (no "lane" unless asked: the header of the first form)
        out = {"task_id": self.task_id, "mem_bytes": self.mem_bytes, "time_s": self.time_s, "cores": self.cores}
        return {**out, "lane": True} if self.lane else out

    @classmethod
    def made(cls, task_id: str, mem_bytes: int, time_s: float, cores: int) -> Ask:
        """The ASK of a batch this end made, of figures checked when they were set (the
        job's settings): built without checking them again, as a placing turn makes one a
        batch. (The receiver checks every ASK it reads.)"""
        return _built(cls, task_id=task_id, mem_bytes=mem_bytes, time_s=float(time_s), cores=cores, lane=False)


@dataclass(frozen=True)
class Accept(TaskMessage):
    """The worker admits the task: the TASK may follow."""

    TYPE = MessageType.ACCEPT


@dataclass(frozen=True)
class Refuse(TaskMessage):
    """The worker refuses the task, and says why."""

    TYPE = MessageType.REFUSE
    reason: RefuseReason = RefuseReason.BUSY
    detail: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.reason, bool) or not isinstance(self.reason, int):
            raise ValueError(f"reason must be a RefuseReason, got {self.reason!r:.80}")
        object.__setattr__(self, "reason", RefuseReason(self.reason))
        text(self.detail, "detail")


@dataclass(frozen=True)
class Task(TaskMessage):
    """A task's payload: by convention buffer 0 is the pickle stream, the rest
    its out-of-band buffers. ``info`` holds small plain values (msgpack).

    ``ask``: the ASK of a next task, folded in (only to a peer that said ``fold``), as
    ``[task_id, mem_bytes, time_s, cores]``; it is admitted as if sent on its own.
    """

    TYPE = MessageType.TASK
    info: dict[str, Any] = field(default_factory=dict)
    ask: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_info(self.info)
        if not isinstance(self.ask, (list, tuple)) or len(self.ask) not in (0, 4):
            raise ValueError(f"ask must be empty or [task_id, mem_bytes, time_s, cores], got {self.ask!r:.80}")
        if self.ask:
            task_id, mem_bytes, time_s, cores = self.ask
            text(task_id, "task_id", empty=False)
            if task_id == self.task_id:
                raise ValueError("a TASK cannot ask for itself")
            object.__setattr__(self, "ask", (task_id, mem_bytes, check_ask(mem_bytes, time_s, cores), cores))
        elif type(self.ask) is not tuple:
            object.__setattr__(self, "ask", ())

    @classmethod
    def made(cls, task_id: str, info: dict[str, Any], ask: tuple[Any, ...] = ()) -> Task:
        """The TASK of a batch this end made (``ask``: a folded ASK from :meth:`folding`),
        built without its checks (see :func:`_built`)."""
        return _built(cls, task_id=task_id, info=info, ask=ask)

    def next_ask(self) -> Ask | None:
        """The folded ASK, validated, or None."""
        if not self.ask:
            return None
        task_id, mem_bytes, time_s, cores = self.ask
        return Ask(task_id, mem_bytes=mem_bytes, time_s=time_s, cores=cores)

    @staticmethod
    def folding(ask: Ask) -> tuple[Any, ...]:
        """``ask`` in the form :attr:`ask` carries."""
        return (ask.task_id, ask.mem_bytes, ask.time_s, ask.cores)

    def to_header(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id, "info": self.info}
        if self.ask:
            out["ask"] = list(self.ask)
        return out


@dataclass(frozen=True)
class Result(TaskMessage):
    """A task's result (or error), laid out like :class:`Task`. ``accepted``: task ids
    whose ASKs the sender admits, ACCEPTs folded in (only to a peer that said ``fold``)."""

    TYPE = MessageType.RESULT
    info: dict[str, Any] = field(default_factory=dict)
    accepted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_info(self.info)
        object.__setattr__(self, "accepted", task_ids(self.accepted, "accepted"))

    @classmethod
    def made(cls, task_id: str, info: dict[str, Any], accepted: tuple[str, ...] = ()) -> Result:
        """The RESULT of a run this end made, built without its checks (see :func:`_built`)."""
        return _built(cls, task_id=task_id, info=info, accepted=accepted)

    def to_header(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id, "info": self.info}
        if self.accepted:
            out["accepted"] = list(self.accepted)
        return out


@dataclass(frozen=True)
class Ack(TaskMessage):
    """The controller has stored the result; the worker may forget it. ``more``: further
    task ids acknowledged at once (only to a peer that said ``ack-many``)."""

    TYPE = MessageType.ACK
    more: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "more", task_ids(self.more, "more"))

    @classmethod
    def made(cls, task_id: str, more: tuple[str, ...] = ()) -> Ack:
        """The ACK of results this end stored, built without its checks (see :func:`_built`)."""
        return _built(cls, task_id=task_id, more=more)

    def to_header(self) -> dict[str, Any]:
        # without ``more`` when there is none: the ACK of protocol 1's first form
        return {"task_id": self.task_id, "more": list(self.more)} if self.more else {"task_id": self.task_id}


@dataclass(frozen=True)
class Cancel(TaskMessage):
    """Stop (or do not start) this task. ``tasks``: to a worker, on the controller's own
    connection, the job's task numbers of a batch the controller sent on one of its lanes,
    which the worker never saw (only to a peer that said ``lane-kill``): the lane's task
    process is stopped if it runs one of them."""

    TYPE = MessageType.CANCEL
    tasks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "tasks", task_numbers(self.tasks, "tasks"))

    def to_header(self) -> dict[str, Any]:  # (no "tasks" unless some: the CANCEL of the first form)
        return {"task_id": self.task_id, "tasks": list(self.tasks)} if self.tasks else {"task_id": self.task_id}


@dataclass(frozen=True)
class _TokenMessage(Message):
    token: int = 0

    def __post_init__(self) -> None:
        count(self.token, "token")


@dataclass(frozen=True)
class Ping(_TokenMessage):
    """Are you there? Answered by a PONG with the same token."""

    TYPE = MessageType.PING


@dataclass(frozen=True)
class Pong(_TokenMessage):
    """Answer to PING."""

    TYPE = MessageType.PONG


@dataclass(frozen=True)
class Bye(Message):
    """The sender closes the connection after this frame."""

    TYPE = MessageType.BYE
    reason: str = ""

    def __post_init__(self) -> None:
        text(self.reason, "reason")


@dataclass(frozen=True)
class Error(Message):
    """The sender gives up on the connection; ``code`` is a short word."""

    TYPE = MessageType.ERROR
    code: str = "error"
    message: str = ""

    def __post_init__(self) -> None:
        text(self.code, "code", empty=False)
        text(self.message, "message")


MESSAGE_CLASSES: Mapping[MessageType, type[Message]] = {
    cls.TYPE: cls
    for cls in (Hello, Challenge, Auth, Ask, Accept, Refuse, Task, Result, Ack, Cancel,
                Ping, Pong, Bye, Error)
}  # fmt: skip
for _cls in MESSAGE_CLASSES.values():
    _cls._FIELDS = tuple(f.name for f in fields(_cls))
    _cls._FIELD_SET = frozenset(_cls._FIELDS)
del _cls


def parse_header(data: bytes | bytearray | memoryview, msg_type: MessageType) -> Message:
    """Parse a msgpack header into its message; raise :class:`ProtocolError`."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"bad msgpack header in {msg_type.name}: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"the header of {msg_type.name} is not a map")
    return MESSAGE_CLASSES[msg_type].from_header(header)


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not allowed")
