"""The reading half of a :class:`~.wire.Connection`: bytes in, checked frames out.

A frame is read in stages (:class:`_Stage`): its 32 fixed bytes, then its head
(buffer table, msgpack header, head tag), then each raw buffer straight into
memory the connection's allocator gives (a pooled, shared one in the daemon),
decrypted there in place as it arrives, then the body tag. Each stage is checked
before the next is read or allocated (see the byte table in :mod:`.layout`): the
fixed bytes against the connection's state and :class:`~.layout.Limits`, the
head tag before the msgpack header is decrypted and parsed, the body tag before
the frame is handed on (no byte of a buffer is used before). A frame
that arrived whole in one read is taken straight from it (the same checks, in
the same order, in fewer steps).

``received(n)`` after ``recv_into(receive_buffer())`` reads without a copy: a buffer
that is encrypted is received into a small landing buffer, hot in the core's cache, and
decrypted from there into place (the cipher's one pass writes it; ``cryptography`` takes
no output that overlaps its input); ``feed(data)`` copies what it is given into place. A
:class:`ProtocolError` closes the connection.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from ..util.errors import PeerError, ProtocolError
from .events import Allocator, Buffer, ConnectionState, Event, Received
from .frames import SMALL_BODY, BodyOpener, DirectionKey
from .layout import (
    FIXED,
    FIXED_SIZE,
    FLAG_VALUES,
    HANDSHAKE_HEADER_CAP,
    MAGIC,
    PROTOCOL_VERSION,
    TAG_SIZE,
    FixedHeader,
    MessageType,
    lengths_struct,
)
from .messages import Message, Task, parse_header

__all__ = ["Reader"]


LANDING_BYTES = 256 << 10
"""The landing buffer of an encrypted buffer's bytes (:meth:`Reader.receive_buffer`): small
enough to stay in the core's cache between the read and the decryption."""


class _Stage(enum.Enum):
    FIXED = 1
    HEAD = 2
    BUFFER = 3
    TAG = 4


class Reader:
    """The receiving side of :class:`~.wire.Connection` (a part of it, not used alone)."""

    # the connection's, read or set here (Connection.__init__ makes them)
    state: ConnectionState
    keyed: bool
    _allocate: Allocator
    _recv_seq: int
    _recv_key: DirectionKey | None
    _expect: frozenset[MessageType]
    _ready_specs: dict[int, tuple[MessageType, int, int, int]]  # see Handshake._ready
    _accepted_for_peer: set[str]
    # the frame being read
    _fixed_buf: bytearray
    _fixed: FixedHeader | None
    _stage: _Stage
    _target: memoryview
    _pos: int
    _head: bytes | bytearray
    _lengths: tuple[int, ...]
    _buffers: list[Buffer]
    _message: Message | None
    _body_mac: BodyOpener | None
    _landing: memoryview | None  # where an encrypted buffer's bytes land (LANDING_BYTES)
    _small_body: bool
    _tag_buf: bytearray

    if TYPE_CHECKING:  # the other parts of the connection

        def _state_text(self) -> str: ...
        def _admit(self, message: Message) -> None: ...
        def _handshake_step(self, message: Message, events: list[Event]) -> None: ...
        def _handshake_tag_ok(self, label: bytes, head: bytes | memoryview, tag: bytes | memoryview) -> bool: ...

    def next_size(self) -> int:
        """How many bytes the connection needs to finish the part it is reading."""
        return len(self._target) - self._pos

    def receive_buffer(self) -> memoryview:
        """Where to put the next bytes, for ``recv_into``: :meth:`next_size` bytes, or fewer
        for an encrypted buffer (its landing buffer)."""
        if self.state is ConnectionState.CLOSED:
            raise ProtocolError("bytes received after the connection was closed")
        if self._stage is _Stage.BUFFER and self._body_mac is not None and self._body_mac.decrypts:
            landing = self._landing
            if landing is None:
                landing = self._landing = memoryview(bytearray(LANDING_BYTES))
            return landing[: len(self._target) - self._pos]
        return self._target[self._pos :]

    def received(self, nbytes: int) -> list[Event]:
        """``nbytes`` were written at the start of :meth:`receive_buffer`; process them."""
        if self.state is ConnectionState.CLOSED:
            raise ProtocolError("bytes received after the connection was closed")
        if not 0 < nbytes <= len(self._target) - self._pos:
            raise ValueError(f"received({nbytes}) but {self.next_size()} bytes were asked for")
        start = self._pos
        events: list[Event] = []
        try:
            opener = self._body_mac
            if self._stage is _Stage.BUFFER and opener is not None:
                if opener.decrypts:  # (it landed in the landing buffer: decrypted into place)
                    assert self._landing is not None and nbytes <= len(self._landing)
                    opener.open_into(self._landing[:nbytes], self._target[start : start + nbytes])
                else:
                    opener.update(self._target[start : start + nbytes])  # checked where it is
            self._pos += nbytes
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
            body: bytes | memoryview = view[size : size + blen]
            if key is not None:
                if key.encrypt:
                    opened = key.open_body(seq, view[:size], view[size:end])
                    if opened is None:
                        raise ProtocolError("frame body failed authentication (altered in transit?)")
                    body = memoryview(opened)
                elif not key.body_ok(seq, view[: size + blen], view[size + blen : end]):
                    raise ProtocolError("frame body failed authentication (altered in transit?)")
            got = tuple(self._split(body, lengths))
        else:
            got = ()
        self._recv_seq += 1
        self._admit(message)
        events.append(Received(message, got, flags))
        return end

    def _split(self, body: bytes | memoryview, lengths: tuple[int, ...]) -> list[Buffer]:
        """The buffers of a frame read whole: allocated, and filled from ``body``."""
        buffers: list[Buffer] = []
        pos = 0
        for n in lengths:
            buf = self._allocate(n)
            if len(buf) != n:
                raise PeerError(f"allocator returned {len(buf)} bytes, {n} were asked for")
            buf[:n] = body[pos : pos + n]
            buffers.append(buf)
            pos += n
        return buffers

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
        self._head = b""
        self._buffers = []
        self._small_body = False
        self._target = memoryview(self._fixed_buf)
        self._pos = 0
        self._stage = _Stage.FIXED

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
            if fixed.body_len <= SMALL_BODY:  # checked (and decrypted) in one call once all is here
                self._small_body = True
            else:
                self._body_mac = self._recv_key.body_opener(fixed.seq, head)
        self._begin_buffer(0)

    def _parse_head(
        self, mtype: MessageType, seq: int, nbuf: int, body_len: int, head: memoryview
    ) -> tuple[Message, tuple[int, ...]]:
        """Check the head tag, then parse the buffer table and the msgpack header."""
        tag_size = self._head_tag_size(mtype)
        table_end = FIXED_SIZE + 8 * nbuf
        header: bytes | memoryview | None = head[table_end : len(head) - tag_size]
        if tag_size:
            if self.state is ConnectionState.READY:
                assert self._recv_key is not None  # READY and keyed
                header = self._recv_key.open_head(seq, head, table_end)  # decrypted, if encrypted
            else:
                body = head[: len(head) - tag_size]
                if not self._handshake_tag_ok(mtype.name.encode(), body, head[len(head) - tag_size :]):
                    header = None
        if header is None:
            raise ProtocolError(
                f"{mtype.name} frame failed authentication (wrong group key, or altered in transit)"
            )
        lengths: tuple[int, ...] = lengths_struct(nbuf).unpack_from(head, FIXED_SIZE) if nbuf else ()
        if sum(lengths) != body_len:
            raise ProtocolError("buffer lengths do not add up to the body length")
        message = parse_header(header, mtype)
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
            key, fixed = self._recv_key, self._fixed
            assert fixed is not None and key is not None  # a keyed frame
            if key.encrypt:
                opened = key.open_body(fixed.seq, self._head, b"".join([*self._buffers, self._tag_buf]))
                ok = opened is not None
                if opened is not None:  # the plaintext into the buffers handed on
                    pos = 0
                    for buf in self._buffers:
                        n = len(buf)
                        buf[:n] = opened[pos : pos + n]
                        pos += n
            else:
                ok = key.body_ok(fixed.seq, b"".join([self._head, *self._buffers]), self._tag_buf)
        else:
            assert self._body_mac is not None  # a large keyed frame
            ok = self._body_mac.finish(self._tag_buf)
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
            self._handshake_step(message, events)  # reads the frame from _head
            self._head = b""
        else:
            self._head = b""  # not kept between frames: a head may be a MiB
            self._admit(message)
            events.append(Received(message, buffers, fixed.flags))
