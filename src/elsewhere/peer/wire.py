"""The peer wire protocol, sans-IO: bytes in, events out, no sockets.

A :class:`Connection` is one end of one TCP connection between two peers. The
socket loop hands it received bytes (:meth:`Connection.feed`, or without a copy
through :meth:`Connection.receive_buffer` + :meth:`Connection.received`) and gets
back events; what the connection wants sent waits in
:meth:`Connection.data_to_send` as :class:`~.frames.OutgoingFrame` objects whose
parts are memoryviews for ``socket.sendmsg``. The module never unpickles anything:
it hands authenticated bytes and buffers to the caller.

This module describes the protocol and keeps the connection, its limits and
its events; the numbers, the fixed header and the messages with their msgpack
header codec are in :mod:`.messages`, the keys, MACs and outgoing frames in
:mod:`.frames`.

Frame layout (all integers big-endian)::

    offset  size   field
    ------  -----  ------------------------------------------------------------
       0      4    magic            b"ELSW"
       4      1    version          1 (PROTOCOL_VERSION)
       5      1    message type     MessageType; numbers never change
       6      2    flags            Flags; unknown bits are refused
       8      8    sequence number  per direction: 0, 1, 2, ...; refused unless
                                    exactly the next one (no replay, no reorder)
      16      4    header length    H, bytes of the msgpack header, 1 <= H <= cap
      20      8    body length      B, total bytes of the raw buffers, <= cap
      28      2    buffer count     N, raw buffers (only TASK and RESULT have any)
      30      2    reserved         0
      32    8*N    buffer lengths   N x uint64; their sum must equal B
    32+8N     H    msgpack header   a map: the message's fields
      ...    16    head tag         keyed only: GMAC of every byte before it,
                                    nonce = seq || 0 (HMAC-SHA256/128 in the handshake)
      ...     B    raw buffers      N buffers, back to back (pickle-5 out-of-band data)
      ...    16    body tag         keyed and N > 0 only: GMAC of every byte of
                                    the frame before it, nonce = seq || 1

Every length is checked against :class:`Limits` from the 32 fixed bytes,
before anything else is read or allocated; the head tag is checked before the
msgpack header is parsed, and before any buffer is allocated; the body tag is
checked before the frame is handed on.

Handshake (the initiator is the side that connected)::

    initiator                                          responder
    HELLO      (nonce_i, id, group, keyed)     --->
                                               <---    CHALLENGE (nonce_r, id, group, keyed)
                                                       tag = HMAC(K_hs, "CHALLENGE" | H(hello) | head)
    AUTH       tag = HMAC(K_hs, "AUTH" | H(hello | challenge) | head)  --->
    (ready)                                            (ready after checking AUTH)

``K_hs`` is derived from the group key with HKDF. After the handshake each
direction has its own AES-256 key, HKDF(group key, salt = SHA-256 of the three
handshake frames, info = direction), so keys are fresh for every connection and
a sequence number (the GCM nonce) never repeats under one key. Without a key
(loopback-only mode) the same frames flow without tags; a connection made with
a key never accepts a frame without a tag, and both sides refuse a peer whose
mode differs from theirs.

Admission before payload: a TASK is refused unless the receiver accepted an
ASK for that task id on this connection; this is checked from the
authenticated header, before the TASK's buffers are received. One ACCEPT
admits one TASK; a CANCEL from the asker withdraws its ASK (open or accepted).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import msgpack

from ..util.errors import PeerError, ProtocolError
from .frames import SMALL_BODY, DirectionKey, OutgoingFrame, as_bytes_view, hkdf
from .keys import GroupKey
from .messages import (
    FIXED,
    FIXED_SIZE,
    FLAG_VALUES,
    HANDSHAKE_HEADER_CAP,
    HANDSHAKE_TYPES,
    MAGIC,
    NONCE_BYTES,
    PAYLOAD_TYPES,
    PROTOCOL_VERSION,
    TAG_SIZE,
    Accept,
    Ack,
    Ask,
    Auth,
    Cancel,
    Challenge,
    Error,
    FixedHeader,
    Flags,
    Greeting,
    Hello,
    Identity,
    Message,
    MessageType,
    Refuse,
    Result,
    Task,
    TaskMessage,
    parse_header,
)

__all__ = [
    "CAPABILITIES",
    "Allocator",
    "Buffer",
    "Connection",
    "ConnectionState",
    "Event",
    "HandshakeComplete",
    "Limits",
    "Received",
    "Role",
]

CAPABILITIES = ("ack-many", "fold", "job-part")
"""What this end understands beyond protocol 1's first form, said in HELLO and CHALLENGE
(``caps``; a peer that says nothing understands none): ``ack-many``, an ACK whose ``more``
lists further task ids it acknowledges; ``fold``, a TASK that carries the ASK of the next
task (``ask``) and a RESULT that carries ACCEPTs (``accepted``), two frames a task
instead of four; ``job-part``, a TASK whose job data and files travel in a part of their
own (``jpart``, ``njpart``), once per connection whatever the functions."""

_MAX_SEQ = 2**64 - 1


@functools.lru_cache(maxsize=64)
def _lengths_struct(nbuf: int) -> struct.Struct:
    """A buffer table of ``nbuf`` lengths."""
    return struct.Struct(f">{nbuf}Q")


@functools.lru_cache(maxsize=64)
def _head_struct(nbuf: int) -> struct.Struct:
    """The fixed header and a buffer table of ``nbuf`` lengths, as one :mod:`struct`."""
    return struct.Struct(f"{FIXED.format}{nbuf}Q")


@dataclass(frozen=True)
class Limits:
    """Caps on what a peer may make us read or allocate for one frame."""

    max_header_bytes: int = 1 << 20
    """msgpack header of a TASK or RESULT."""
    max_control_header_bytes: int = 64 << 10
    """msgpack header of every other message after the handshake."""
    max_buffers: int = 1024
    max_body_bytes: int = 4 << 30
    max_pending_asks: int = 1024
    """ASKs a peer may have open (not yet answered) on one connection."""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_control_header_bytes", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value < 2**63:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_buffers, int) or not 0 <= self.max_buffers <= 0xFFFF:
            raise ValueError(f"Limits.max_buffers must be 0..65535, got {self.max_buffers!r}")
        if not isinstance(self.max_pending_asks, int) or self.max_pending_asks < 1:
            raise ValueError(f"Limits.max_pending_asks must be >= 1, got {self.max_pending_asks!r}")


# ---------------------------------------------------------------- events

Buffer = Union[bytearray, memoryview]
"""A received raw buffer: what the allocator returned, filled."""


@dataclass(frozen=True)
class HandshakeComplete:
    """The peer proved it holds the group key (or, keyless, said hello)."""

    peer: Greeting


class Received(NamedTuple):
    """A message, and its raw buffers (filled, authenticated, never unpickled); a tuple,
    as one is made for every frame received."""

    message: Message
    buffers: tuple[Buffer, ...] = ()
    flags: Flags = Flags.NONE


Event = Union[HandshakeComplete, Received]
"""What :meth:`Connection.received` and :meth:`Connection.feed` return."""
Allocator = Callable[[int], Buffer]
"""Returns a writable buffer of exactly the given size (e.g. from a pool)."""


# ---------------------------------------------------------------- connection


class Role(enum.Enum):
    """Which end of the connection: the one that connected, or the one that accepted."""

    INITIATOR = "initiator"
    RESPONDER = "responder"


class ConnectionState(enum.Enum):
    """Where a connection is in its life."""

    HANDSHAKE = "handshake"
    READY = "ready"
    CLOSED = "closed"


class _Stage(enum.Enum):
    FIXED = 1
    HEAD = 2
    BUFFER = 3
    TAG = 4


class Connection:
    """One end of a peer connection: handshake, framing, MACs and admission rules.

    ``key`` is the group key, or ``None`` for loopback-only mode (no tags;
    the caller must only use such a connection over 127.0.0.1). A responder
    that serves several groups gives the others' keys as ``more_keys``: the
    group the initiator names in its HELLO picks the key the handshake then
    proves (and :attr:`group` says which it was). ``allocate``
    makes the buffers that raw buffers are received into (default
    ``bytearray``). After any :class:`ProtocolError` the connection is closed;
    send what :meth:`data_to_send` still holds (perhaps an ERROR frame for the
    peer) and close the socket. Not thread-safe: one thread drives it.

    A socket loop::

        conn = Connection(Role.INITIATOR, key, Identity(peer_id))
        while True:
            for frame in conn.data_to_send():
                for part in frame.iter_parts():  # MAC each 1 MiB slice as it is sent
                    sock.sendall(part)           # (or sendmsg(frame.parts()), looping
                                                 #  on partial sends and IOV_MAX)
            if conn.next_size() >= 65536:        # inside a large buffer: no copy
                n = sock.recv_into(conn.receive_buffer())
                events = conn.received(n) if n else conn.receive_eof()
            else:
                data = sock.recv(65536)
                events = conn.feed(data) if data else conn.receive_eof()
            for event in events: ...
    """

    def __init__(
        self,
        role: Role,
        key: GroupKey | None,
        identity: Identity,
        *,
        limits: Limits | None = None,
        allocate: Allocator = bytearray,
        more_keys: Sequence[GroupKey] = (),
    ) -> None:
        self.role = role
        self.identity = identity
        self.limits = limits if limits is not None else Limits()
        self.keyed = key is not None
        if more_keys and (key is None or role is not Role.RESPONDER):
            raise ValueError("more_keys are for a keyed responder")
        self._keys = {k.group: k for k in (*more_keys, *([key] if key is not None else []))}
        self.peer: Greeting | None = None
        self.state = ConnectionState.HANDSHAKE
        self._use_key(key)
        self._allocate = allocate
        self._packer = msgpack.Packer(use_bin_type=True)
        self._outbox: list[OutgoingFrame] = []
        self._send_seq = 0
        self._recv_seq = 0
        self._send_key: DirectionKey | None = None
        self._recv_key: DirectionKey | None = None
        self._nonce = os.urandom(NONCE_BYTES)
        self._transcript: list[bytes] = []
        self._sent_bye = False
        # admission: task ids by direction
        self._asks_from_peer: set[str] = set()
        self._accepted_for_peer: set[str] = set()
        self._asks_to_peer: set[str] = set()
        self._accepted_by_peer: set[str] = set()
        # reader
        self._fixed_buf = bytearray(FIXED_SIZE)
        self._fixed: FixedHeader | None = None
        self._stage = _Stage.FIXED
        self._target = memoryview(self._fixed_buf)
        self._pos = 0
        self._head: bytes | bytearray = b""
        self._lengths: tuple[int, ...] = ()
        self._buffers: list[Buffer] = []
        self._message: Message | None = None
        self._body_mac: Any = None
        self._small_body = False
        self._tag_buf = bytearray(TAG_SIZE)
        # READY: type number -> (type, header cap, most buffers, body cap), made once ready
        self._ready_specs: dict[int, tuple[MessageType, int, int, int]] = {}
        if role is Role.INITIATOR:
            self._expect = frozenset({MessageType.CHALLENGE, MessageType.ERROR})
            hello = Hello(identity.peer_id, self.group, identity.user, identity.host,
                          self.keyed, self._nonce, CAPABILITIES)  # fmt: skip
            self._transcript.append(self._queue_handshake(hello, b""))
        else:
            self._expect = frozenset({MessageType.HELLO})

    def _use_key(self, key: GroupKey | None) -> None:
        self.group = key.group if key is not None else ""
        self._secret = key.secret if key is not None else b""
        self._hs_key = (
            hkdf(self._secret, None, b"elsewhere peer v1 handshake\0" + self.group.encode())
            if key is not None
            else b""
        )

    # ------------------------------------------------------------ sending

    def data_to_send(self) -> list[OutgoingFrame]:
        """Frames to send, in order; the list is handed over (and emptied here)."""
        out, self._outbox = self._outbox, []
        return out

    def send(
        self,
        message: Message,
        buffers: Iterable[Any] = (),
        flags: Flags = Flags.NONE,
    ) -> OutgoingFrame:
        """Queue ``message`` (and raw buffers: only TASK and RESULT) for sending.

        Raises :class:`PeerError` for what the protocol forbids: sending before
        the handshake is complete or after BYE/ERROR, ACCEPT or REFUSE without an
        ASK, TASK without an ACCEPT, buffers on other messages, sizes over our
        own limits. Returns the frame, which is also in :meth:`data_to_send`.
        """
        mtype = message.TYPE
        if self.state is not ConnectionState.READY or self._sent_bye:
            raise PeerError(f"cannot send {mtype.name}: connection is {self._state_text()}")
        payload = mtype in PAYLOAD_TYPES
        if not payload and mtype in HANDSHAKE_TYPES:
            raise PeerError(f"{mtype.name} is sent by the connection itself")
        views = [as_bytes_view(b) for b in buffers]
        header = self._packer.pack(message.to_header())
        limits = self.limits
        if views:
            if not payload:
                raise PeerError(f"{mtype.name} cannot carry buffers")
            if len(views) > limits.max_buffers:
                raise PeerError(f"{len(views)} buffers, over the cap of {limits.max_buffers}")
            lengths = [len(v) for v in views]
            if sum(lengths) > limits.max_body_bytes:
                raise PeerError(f"buffers over the cap of {limits.max_body_bytes} bytes")
        else:
            lengths = []
        cap = limits.max_header_bytes if payload else limits.max_control_header_bytes
        if len(header) > cap:
            raise PeerError(f"{mtype.name} header is {len(header)} bytes, over the cap of {cap}")
        if isinstance(message, TaskMessage):
            self._admit_outgoing(message)
        frame = self._queue(mtype, header, views, flags, lengths)
        if mtype is MessageType.BYE or mtype is MessageType.ERROR:
            self._sent_bye = True
        return frame

    def _admit_outgoing(self, message: TaskMessage) -> None:
        # what is folded in is checked first, so that nothing changes if the send fails
        folded: list[tuple[MessageType, str]] = []
        if isinstance(message, Task) and message.ask:
            folded = [(MessageType.ASK, message.ask[0])]
            if message.ask[0] in self._asks_to_peer or message.ask[0] in self._accepted_by_peer:
                raise PeerError(f"task {message.ask[0]!r} was already asked for")
        elif isinstance(message, Result):
            folded = [(MessageType.ACCEPT, task_id) for task_id in message.accepted]
            for _, task_id in folded:
                if task_id not in self._asks_from_peer:
                    raise PeerError(f"ACCEPT for task {task_id!r}, which the peer did not ask for")
        self._admit_task_message(message.TYPE, message.task_id)
        for mtype, task_id in folded:
            self._admit_task_message(mtype, task_id)

    def _admit_task_message(self, mtype: MessageType, task_id: str) -> None:
        if mtype is MessageType.ASK:
            if task_id in self._asks_to_peer or task_id in self._accepted_by_peer:
                raise PeerError(f"task {task_id!r} was already asked for")
            self._asks_to_peer.add(task_id)
        elif mtype in (MessageType.ACCEPT, MessageType.REFUSE):
            if task_id not in self._asks_from_peer:
                raise PeerError(
                    f"{mtype.name} for task {task_id!r}, which the peer did not ask for"
                )
            self._asks_from_peer.discard(task_id)
            if mtype is MessageType.ACCEPT:
                self._accepted_for_peer.add(task_id)
        elif mtype is MessageType.TASK:
            if task_id not in self._accepted_by_peer:
                raise PeerError(f"TASK {task_id!r} was not accepted by the peer (send ASK first)")
            self._accepted_by_peer.discard(task_id)
        elif mtype is MessageType.CANCEL:  # withdraws our ASK, if still open or accepted
            self._asks_to_peer.discard(task_id)
            self._accepted_by_peer.discard(task_id)

    def _queue(
        self,
        mtype: MessageType,
        header: bytes,
        views: list[memoryview],
        flags: int,
        lengths: list[int] | None = None,
    ) -> OutgoingFrame:
        """Frame and queue an already-encoded header (no protocol checks: tests use it)."""
        if lengths is None:
            lengths = [len(v) for v in views]
        seq = self._send_seq
        head = self._build_head(mtype, header, lengths, flags)
        key = self._send_key
        if key is not None:
            head += key.head_tag(seq, head)
        frame = OutgoingFrame(mtype, seq, head, views, key, sum(lengths))
        self._send_seq = seq + 1
        self._outbox.append(frame)
        return frame

    def _build_head(self, mtype: MessageType, header: bytes, lengths: list[int], flags: int) -> bytes:
        """The fixed header, the buffer table and the msgpack header of the next frame."""
        seq = self._send_seq
        if seq >= _MAX_SEQ:
            raise PeerError("sequence numbers exhausted: open a new connection")
        n = len(lengths)
        return _head_struct(n).pack(MAGIC, PROTOCOL_VERSION, mtype, flags, seq, len(header),
                                    sum(lengths), n, 0, *lengths) + header  # fmt: skip

    def _queue_handshake(self, message: Message, label: bytes) -> bytes:
        """Queue a handshake frame, tagged with HMAC over the transcript when keyed."""
        header = msgpack.packb(message.to_header(), use_bin_type=True)
        head = self._build_head(message.TYPE, header, [], 0)
        if self.keyed and label:
            head += self._handshake_tag(label, head)
        self._outbox.append(OutgoingFrame(message.TYPE, self._send_seq, head, [], None))
        self._send_seq += 1
        return head

    def _handshake_tag(self, label: bytes, head: bytes | memoryview) -> bytes:
        prior = hashlib.sha256(b"".join(self._transcript)).digest()
        mac = hmac.new(self._hs_key, label + b"\0" + prior, hashlib.sha256)
        mac.update(head)
        return mac.digest()[:TAG_SIZE]

    def _fail_handshake(self, code: str, text: str) -> ProtocolError:
        """Queue an (untagged) ERROR for the peer and return the error to raise."""
        header = msgpack.packb(Error(code, text).to_header(), use_bin_type=True)
        head = self._build_head(MessageType.ERROR, header, [], 0)
        self._outbox.append(OutgoingFrame(MessageType.ERROR, self._send_seq, head, [], None))
        self._send_seq += 1
        return ProtocolError(text)

    # ------------------------------------------------------------ receiving

    def next_size(self) -> int:
        """How many bytes the connection needs to finish the part it is reading."""
        return len(self._target) - self._pos

    def receive_buffer(self) -> memoryview:
        """Where to put the next bytes: exactly :meth:`next_size` bytes, for ``recv_into``."""
        if self.state is ConnectionState.CLOSED:
            raise ProtocolError("bytes received after the connection was closed")
        return self._target[self._pos :]

    def received(self, nbytes: int) -> list[Event]:
        """``nbytes`` were written at the start of :meth:`receive_buffer`; process them."""
        if self.state is ConnectionState.CLOSED:
            raise ProtocolError("bytes received after the connection was closed")
        if not 0 < nbytes <= len(self._target) - self._pos:
            raise ValueError(f"received({nbytes}) but {self.next_size()} bytes were asked for")
        start = self._pos
        self._pos += nbytes
        events: list[Event] = []
        try:
            if self._stage is _Stage.BUFFER and self._body_mac is not None:
                self._body_mac.authenticate_additional_data(self._target[start : self._pos])
            while self._pos == len(self._target) and self.state is not ConnectionState.CLOSED:
                self._complete_part(events)
        except ProtocolError:
            self._close()
            raise
        return events

    def feed(self, data: bytes | bytearray | memoryview, events: list[Event] | None = None) -> list[Event]:
        """Process received bytes of any length (copies them into place); returns the
        events, appended to ``events`` if given (those of good frames stay there when
        a later frame raises)."""
        view = memoryview(data).cast("B")
        if events is None:
            events = []
        while len(view):
            if self._stage is _Stage.FIXED and not self._pos and self.state is ConnectionState.READY:
                try:
                    n = self._whole_frame(view, events)
                except ProtocolError:
                    self._close()
                    raise
                if n:
                    view = view[n:]
                    continue
            target = self.receive_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            events.extend(self.received(n))
            view = view[n:]
        return events

    def _whole_frame(self, view: memoryview, events: list[Event]) -> int:
        """Read a frame that ``view`` holds whole, straight from it (the same checks in
        the same order as byte by byte, with fewer steps); returns the bytes it took, or 0
        if the frame is not all there (it is then read part by part)."""
        if len(view) < FIXED_SIZE:
            return 0
        magic, version, code, bits, seq, hlen, blen, nbuf, reserved = FIXED.unpack_from(view)
        spec = self._ready_specs.get(code)
        flags = FLAG_VALUES.get(bits)
        if (spec is not None and flags is not None and magic == MAGIC and version == PROTOCOL_VERSION
                and seq == self._recv_seq and not reserved and 1 <= hlen <= spec[1]
                and nbuf <= spec[2] and blen <= spec[3] and (nbuf or not blen)):  # fmt: skip
            mtype = spec[0]
        else:  # refused: the full check says why
            mtype, flags, seq, hlen, blen, nbuf = self._check_fixed(view[:FIXED_SIZE])
        key = self._recv_key
        size = FIXED_SIZE + 8 * nbuf + hlen + (TAG_SIZE if key is not None else 0)
        end = size + blen + (TAG_SIZE if key is not None and nbuf else 0)
        if len(view) < end:
            return 0
        message, lengths = self._parse_head(mtype, seq, nbuf, blen, view[:size])
        if lengths:
            buffers: list[Buffer] = []
            pos = size
            for n in lengths:
                buf = self._allocate(n)
                if len(buf) != n:
                    raise PeerError(f"allocator returned {len(buf)} bytes, {n} were asked for")
                buf[:n] = view[pos : pos + n]
                buffers.append(buf)
                pos += n
            if key is not None and not key.body_ok(seq, view[:pos], view[pos:end]):
                raise ProtocolError("frame body failed authentication (altered in transit?)")
            got = tuple(buffers)
        else:
            got = ()
        self._recv_seq += 1
        self._admit(message)
        events.append(Received(message, got, flags))
        return end

    def receive_eof(self) -> list[Event]:
        """The peer closed its end. Raises :class:`ProtocolError` if that cut a frame."""
        state = self.state
        cut = self._stage is not _Stage.FIXED or self._pos
        self._close()
        if state is ConnectionState.HANDSHAKE:
            raise ProtocolError("the peer closed the connection during the handshake")
        if cut and state is ConnectionState.READY:
            raise ProtocolError("the peer closed the connection in the middle of a frame")
        return []

    def _close(self) -> None:
        self.state = ConnectionState.CLOSED
        self._buffers = []
        self._small_body = False
        self._target = memoryview(self._fixed_buf)
        self._pos = 0
        self._stage = _Stage.FIXED

    def _state_text(self) -> str:
        if self._sent_bye and self.state is ConnectionState.READY:
            return "closing (BYE or ERROR sent)"
        return self.state.value

    def _set_target(self, stage: _Stage, buf: Buffer, pos: int = 0) -> None:
        self._stage = stage
        self._target = memoryview(buf)
        self._pos = pos

    def _head_tag_size(self, mtype: MessageType) -> int:
        if not self.keyed:
            return 0
        if self.state is ConnectionState.READY:
            return TAG_SIZE
        return TAG_SIZE if mtype in (MessageType.CHALLENGE, MessageType.AUTH) else 0

    def _complete_part(self, events: list[Event]) -> None:
        if self._stage is _Stage.FIXED:
            self._start_head()
        elif self._stage is _Stage.HEAD:
            self._finish_head(events)
        elif self._stage is _Stage.BUFFER:
            self._next_buffer(events)
        else:
            self._finish_body(events)

    def _start_head(self) -> None:
        fixed = self._check_fixed(self._fixed_buf)
        self._fixed = fixed
        size = FIXED_SIZE + 8 * fixed.nbuf + fixed.header_len + self._head_tag_size(fixed.msg_type)
        head = bytearray(size)
        head[:FIXED_SIZE] = self._fixed_buf
        self._head = head
        self._set_target(_Stage.HEAD, head, FIXED_SIZE)

    def _check_fixed(self, data: bytes | bytearray | memoryview) -> FixedHeader:
        """Parse the fixed header and check it against the state and the limits."""
        fixed = FixedHeader.parse(data)
        mtype = fixed.msg_type
        if fixed.seq != self._recv_seq:
            raise ProtocolError(
                f"frame out of order or replayed: sequence number {fixed.seq}, expected {self._recv_seq}"
            )
        if mtype not in self._expect:
            raise ProtocolError(f"unexpected {mtype.name} frame ({self._state_text()})")
        if self.state is ConnectionState.HANDSHAKE:
            cap, max_buffers, max_body = HANDSHAKE_HEADER_CAP, 0, 0
        else:
            _, cap, max_buffers, max_body = self._ready_specs[int(mtype)]
        if not 1 <= fixed.header_len <= cap:
            raise ProtocolError(f"{mtype.name} header length {fixed.header_len} not in 1..{cap}")
        if fixed.nbuf > max_buffers:
            raise ProtocolError(f"{mtype.name} with {fixed.nbuf} buffers; at most {max_buffers}")
        if fixed.body_len > max_body:
            raise ProtocolError(f"{mtype.name} body of {fixed.body_len} bytes is over the cap")
        if fixed.nbuf == 0 and fixed.body_len:
            raise ProtocolError("body length without buffers")
        return fixed

    def _finish_head(self, events: list[Event]) -> None:
        fixed = self._fixed
        assert fixed is not None  # set by _start_head on the way here
        head = memoryview(self._head)
        message, lengths = self._parse_head(fixed.msg_type, fixed.seq, fixed.nbuf, fixed.body_len, head)
        self._message = message
        self._lengths = lengths
        self._buffers = []
        if not lengths:
            self._deliver(events)
            return
        if self._recv_key is not None:
            if fixed.body_len <= SMALL_BODY:  # checked in one call once all is here
                self._small_body = True
            else:
                self._body_mac = self._recv_key.body_mac(fixed.seq)
                self._body_mac.authenticate_additional_data(head)
        self._begin_buffer(0)

    def _parse_head(
        self, mtype: MessageType, seq: int, nbuf: int, body_len: int, head: memoryview
    ) -> tuple[Message, tuple[int, ...]]:
        """Check the head tag, then parse the buffer table and the msgpack header."""
        tag_size = self._head_tag_size(mtype)
        body = head[: len(head) - tag_size]
        if tag_size:
            tag = head[len(head) - tag_size :]
            if self.state is ConnectionState.READY:
                assert self._recv_key is not None  # READY and keyed
                ok = self._recv_key.head_ok(seq, body, tag)
            else:
                expected = self._handshake_tag(mtype.name.encode(), body)
                ok = hmac.compare_digest(expected, tag)
            if not ok:
                raise ProtocolError(
                    f"{mtype.name} frame failed authentication (wrong group key, or altered in transit)"
                )
        table_end = FIXED_SIZE + 8 * nbuf
        lengths: tuple[int, ...] = _lengths_struct(nbuf).unpack_from(head, FIXED_SIZE) if nbuf else ()
        if sum(lengths) != body_len:
            raise ProtocolError("buffer lengths do not add up to the body length")
        message = parse_header(body[table_end:], mtype)
        if isinstance(message, Task):
            if message.task_id not in self._accepted_for_peer:
                raise ProtocolError(f"TASK {message.task_id!r} arrived without an accepted ASK")
            self._accepted_for_peer.discard(message.task_id)
        return message, lengths

    def _begin_buffer(self, index: int) -> None:
        size = self._lengths[index]
        buf = self._allocate(size)
        if len(buf) != size:
            raise PeerError(f"allocator returned {len(buf)} bytes, {size} were asked for")
        self._buffers.append(buf)
        self._set_target(_Stage.BUFFER, buf)

    def _next_buffer(self, events: list[Event]) -> None:
        index = len(self._buffers)
        if index < len(self._lengths):
            self._begin_buffer(index)
        elif self._body_mac is not None or self._small_body:
            self._set_target(_Stage.TAG, self._tag_buf)
        else:
            self._deliver(events)

    def _finish_body(self, events: list[Event]) -> None:
        if self._small_body:
            assert self._fixed is not None and self._recv_key is not None  # a keyed frame
            data = b"".join([self._head, *self._buffers])
            ok = self._recv_key.body_ok(self._fixed.seq, data, self._tag_buf)
        else:
            mac = self._body_mac
            mac.finalize()
            ok = hmac.compare_digest(mac.tag, self._tag_buf)
        if not ok:
            raise ProtocolError("frame body failed authentication (altered in transit?)")
        self._deliver(events)

    def _deliver(self, events: list[Event]) -> None:
        fixed, message = self._fixed, self._message
        assert fixed is not None and message is not None  # a whole frame was read
        buffers = tuple(self._buffers)
        self._recv_seq += 1
        self._body_mac = None
        self._small_body = False
        self._buffers = []
        self._message = None
        self._set_target(_Stage.FIXED, self._fixed_buf)
        if self.state is ConnectionState.HANDSHAKE:
            self._handshake_step(message, events)
        else:
            self._admit(message)
            events.append(Received(message, buffers, fixed.flags))

    def _admit(self, message: Message) -> None:
        # most frequent first: a RESULT, a TASK, an ACK for every task
        if isinstance(message, Result):
            for task_id in message.accepted:
                self._admit_answer(MessageType.ACCEPT, task_id)
        elif isinstance(message, Task):  # its own admission was checked with its head
            if message.ask:
                self._admit_ask(message.ask[0])
        elif isinstance(message, Ack):
            pass
        elif isinstance(message, Ask):
            self._admit_ask(message.task_id)
        elif isinstance(message, (Accept, Refuse)):
            self._admit_answer(message.TYPE, message.task_id)
        elif isinstance(message, Cancel):  # the peer withdraws its ASK: no TASK will follow
            self._asks_from_peer.discard(message.task_id)
            self._accepted_for_peer.discard(message.task_id)
        elif message.TYPE is MessageType.BYE or message.TYPE is MessageType.ERROR:
            self.state = ConnectionState.CLOSED

    def _admit_answer(self, mtype: MessageType, task_id: str) -> None:
        """The peer answered our ASK for ``task_id`` (ACCEPT or REFUSE)."""
        if task_id not in self._asks_to_peer:
            raise ProtocolError(f"{mtype.name} for task {task_id!r}, which was not asked for")
        self._asks_to_peer.discard(task_id)
        if mtype is MessageType.ACCEPT:
            self._accepted_by_peer.add(task_id)

    def _admit_ask(self, task_id: str) -> None:
        if task_id in self._asks_from_peer or task_id in self._accepted_for_peer:
            raise ProtocolError(f"ASK for task {task_id!r} repeated")
        if len(self._asks_from_peer) + len(self._accepted_for_peer) >= self.limits.max_pending_asks:
            raise ProtocolError(f"more than {self.limits.max_pending_asks} open ASKs")
        self._asks_from_peer.add(task_id)

    def _handshake_step(self, message: Message, events: list[Event]) -> None:
        frame = bytes(self._head)
        if isinstance(message, Error):
            raise ProtocolError(
                f"the peer refused the handshake: {message.code}: {message.message}"
            )
        if isinstance(message, Hello):
            self._transcript.append(frame)
            self._check_greeting(message)
            challenge = Challenge(self.identity.peer_id, self.group, self.identity.user,
                                  self.identity.host, self.keyed, self._nonce, CAPABILITIES)  # fmt: skip
            self._transcript.append(self._queue_handshake(challenge, b"CHALLENGE"))
            self.peer = message
            self._expect = frozenset({MessageType.AUTH, MessageType.ERROR})
        elif isinstance(message, Challenge):
            self._transcript.append(frame)
            self._check_greeting(message)
            self._transcript.append(self._queue_handshake(Auth(), b"AUTH"))
            self.peer = message
            self._ready(events)
        else:  # AUTH, its tag already checked
            self._transcript.append(frame)
            self._ready(events)

    def _check_greeting(self, greeting: Greeting) -> None:
        if greeting.keyed != self.keyed:
            mine = "has a group key" if self.keyed else "has no group key (loopback-only)"
            theirs = "has one" if greeting.keyed else "has none"
            raise self._fail_handshake("key", f"this peer {mine}, the other {theirs}")
        if greeting.group != self.group and isinstance(greeting, Hello) and greeting.group in self._keys:
            self._use_key(self._keys[greeting.group])  # a responder of several groups: this one
        if greeting.group != self.group:
            mine = (f"this peer serves {', '.join(map(repr, sorted(self._keys)))}" if len(self._keys) > 1
                    else f"this peer in {self.group!r}")  # fmt: skip
            raise self._fail_handshake("group", f"the peer is in group {greeting.group!r}, {mine}")
        if greeting.nonce == self._nonce:
            raise self._fail_handshake("nonce", "the peer echoed our nonce")

    def _ready(self, events: list[Event]) -> None:
        if self.keyed:
            salt = hashlib.sha256(b"".join(self._transcript)).digest()
            i2r = DirectionKey(
                hkdf(self._secret, salt, b"elsewhere peer v1 initiator->responder")
            )
            r2i = DirectionKey(
                hkdf(self._secret, salt, b"elsewhere peer v1 responder->initiator")
            )
            initiator = self.role is Role.INITIATOR
            self._send_key, self._recv_key = (i2r, r2i) if initiator else (r2i, i2r)
        self._transcript = []
        self.state = ConnectionState.READY
        self._expect = frozenset(MessageType) - HANDSHAKE_TYPES
        limits = self.limits
        for mtype in self._expect:  # the caps of each type, for _check_fixed and _whole_frame
            payload = mtype in PAYLOAD_TYPES
            nbuf = limits.max_buffers if payload else 0
            cap = limits.max_header_bytes if payload else limits.max_control_header_bytes
            self._ready_specs[int(mtype)] = (mtype, cap, nbuf, limits.max_body_bytes if nbuf else 0)
        assert self.peer is not None  # set by the HELLO or CHALLENGE step
        events.append(HandshakeComplete(self.peer))
