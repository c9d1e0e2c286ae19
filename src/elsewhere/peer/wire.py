"""The peer wire protocol, sans-IO: bytes in, events out, no sockets.

A :class:`Connection` is one end of one TCP connection between two peers. The
socket loop hands it received bytes (:meth:`Connection.feed`, or without a copy
through :meth:`Connection.receive_buffer` + :meth:`Connection.received`) and gets
back events; what the connection wants sent waits in
:meth:`Connection.data_to_send` as :class:`~.frames.OutgoingFrame` objects whose
parts are memoryviews for ``socket.sendmsg``. The module never unpickles anything:
it hands authenticated bytes and buffers to the caller.

Where each part of the protocol is:

- the frame's byte table, the protocol's numbers, the fixed header and the caps
  (:class:`Limits`): :mod:`.layout`;
- the messages and their msgpack header codec: :mod:`.messages`;
- the keys, ciphers, tags and outgoing frames: :mod:`.frames`;
- the handshake (HELLO, CHALLENGE, AUTH; keys per connection and direction):
  :mod:`.handshake`;
- reading a frame stage by stage, each checked before the next is read or
  allocated: :mod:`.reader`;
- the connection's role, state and events: :mod:`.events`;
- here: the :class:`Connection` itself, what it sends, and its admission rules.

Every length is checked against :class:`Limits` from the 32 fixed bytes,
before anything else is read or allocated; the head tag is checked before the
msgpack header is parsed, and before any buffer is allocated; the body tag is
checked before the frame is handed on.

Admission before payload: a TASK is refused unless the receiver accepted an
ASK for that task id on this connection; this is checked from the
authenticated header, before the TASK's buffers are received. One ACCEPT
admits one TASK; a CANCEL from the asker withdraws its ASK (open or accepted).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from ..util.errors import PeerError, ProtocolError
from .ciphers import offered_ciphers
from .events import (
    Allocator,
    Buffer,
    ConnectionState,
    Event,
    HandshakeComplete,
    Received,
    Role,
)
from .frames import SMALL_BODY, DirectionKey, OutgoingFrame, SliceRing, as_bytes_view
from .handshake import EphemeralKeys, Handshake
from .keys import GroupKey
from .layout import (
    FIXED_SIZE,
    HANDSHAKE_TYPES,
    MAGIC,
    NONCE_BYTES,
    PAYLOAD_TYPES,
    PROTOCOL_VERSION,
    TAG_SIZE,
    FixedHeader,
    Flags,
    Limits,
    MessageType,
    head_struct,
)
from .messages import (
    Accept,
    Ack,
    Ask,
    Cancel,
    Challenge,
    Greeting,
    Hello,
    Identity,
    Message,
    Refuse,
    Result,
    Task,
    TaskMessage,
)
from .reader import Reader, _Stage

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

CAPABILITIES = ("ack-many", "alone", "fold", "job-part", "lane", "lane-kill", "runs")
"""What this end understands beyond protocol 1's first form, said in HELLO and CHALLENGE
(``caps``; a peer that says nothing understands none): ``ack-many``, an ACK whose ``more``
lists further task ids it acknowledges; ``fold``, a TASK that carries the ASK of the next
task (``ask``) and a RESULT that carries ACCEPTs (``accepted``), two frames a task
instead of four; ``job-part``, a TASK whose job data and files travel in a part of their
own (``jpart``, ``njpart``), once per connection whatever the functions; ``runs``, a
RESULT whose ``runs`` hold the successes without output of consecutive tasks as one entry
each (see "Layout of TASK and RESULT" in docs/peer.md); ``alone``, a RESULT whose ``alone``
lists tasks its sender asks to get back each in a batch of its own (their task process died
working for them together, and could not tell which of them did it); ``lane``, a worker that
hands a connection named as a lane to a task process once its ASK with ``lane`` is admitted
(see "Lanes" in docs/peer-protocol.md); ``lane-kill``, a worker that stops a lane's task
process on a CANCEL whose ``tasks`` name the task it runs."""

_MAX_SEQ = 2**64 - 1
_PACKER_BYTES = 4 << 10
"""The msgpack packer's first buffer (msgpack's default is 256 KiB, for every connection,
the unauthenticated ones included); it grows for a larger header and is made anew after
one over :data:`_PACKER_KEEP`, so a connection does not keep the memory of its largest
header."""
_PACKER_KEEP = 64 << 10


class Connection(Reader, Handshake):
    """One end of a peer connection: handshake, framing, encryption and MACs, admission rules.

    ``key`` is the group key, or ``None`` for loopback-only mode (no tags;
    the caller must only use such a connection over 127.0.0.1). With a key,
    ``encrypt`` (default) encrypts every frame after the handshake (both ends
    must agree); ``ciphers`` are the ciphers this end offers, best first (default:
    :func:`~.ciphers.offered_ciphers`; the handshake chooses one, :attr:`cipher`);
    ``ephemeral`` gives the X25519 key shares of the handshake (default: a
    new one for this connection; a worker reuses one for a few seconds). A responder
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
                for part in frame.iter_parts():  # seal each 1 MiB slice as it is sent
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
        encrypt: bool = True,
        ephemeral: EphemeralKeys | None = None,
        ciphers: Sequence[str] | None = None,
    ) -> None:
        self.role = role
        self.identity = identity
        self.limits = limits if limits is not None else Limits()
        self.keyed = key is not None
        self.encrypt = encrypt and key is not None
        """Whether frames are encrypted (and authenticated) after the handshake; both ends
        must agree (a keyed connection of ends that disagree is refused in the handshake)."""
        self._ciphers = (tuple(ciphers) if ciphers is not None else offered_ciphers()) if key is not None else ()
        self.cipher = ""
        """The cipher of the frames after the handshake (a name of :mod:`.ciphers`; "" before
        it ends, and without a key)."""
        if more_keys and (key is None or role is not Role.RESPONDER):
            raise ValueError("more_keys are for a keyed responder")
        self._keys = {k.group: k for k in (*more_keys, *([key] if key is not None else []))}
        self.peer: Greeting | None = None
        self.state = ConnectionState.HANDSHAKE
        self._caps = CAPABILITIES  # what this end says it understands, in HELLO or CHALLENGE
        self._candidates: list[bytes] = []
        self._ephemeral = ephemeral if ephemeral is not None else EphemeralKeys()
        self._dh: tuple[Any, bytes] | None = None
        self._use_key(key)
        self._allocate = allocate
        self._packer = msgpack.Packer(use_bin_type=True, buf_size=_PACKER_BYTES)
        self._outbox: list[OutgoingFrame] = []
        self._send_seq = 0
        self._recv_seq = 0
        self._send_key: DirectionKey | None = None
        self._recv_key: DirectionKey | None = None
        self._ring: SliceRing | None = None  # made for the first large encrypted frame sent
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
        self._landing: memoryview | None = None
        self._small_body = False
        self._tag_buf = bytearray(TAG_SIZE)
        # READY: type number -> (type, header cap, most buffers, body cap), made once ready
        self._ready_specs: dict[int, tuple[MessageType, int, int, int]] = {}
        if role is Role.INITIATOR:
            self._expect = frozenset({MessageType.CHALLENGE, MessageType.ERROR})
            self._dh = self._ephemeral.get() if self.keyed else None
            hello = Hello(identity.peer_id, self.group, identity.user, identity.host, self.keyed, self._nonce,
                          self._caps, self.encrypt, self._key_fingerprints(), self._dh[1] if self._dh else b"",
                          self._ciphers)  # fmt: skip
            self._transcript.append(self._queue_handshake(hello, b""))
        else:
            self._expect = frozenset({MessageType.HELLO})

    def close(self) -> None:
        """Its socket was closed: drop what the connection holds (a frame half read, frames
        not sent, the allocator, which may refer to the connection's owner and so make a
        cycle), so that it and its owner are freed as soon as nothing else refers to them."""
        self._close()
        self._outbox = []
        self._allocate = bytearray
        self._ring = None

    # ------------------------------------------------------------ moving to another process

    def session(self) -> dict[str, Any]:
        """What another process needs to carry this connection on (with its socket): the
        keys and sequence numbers of both directions, the peer's greeting, the admissions
        open. Plain values (msgpack). Only between frames: nothing half read, nothing waiting
        to be sent; the connection here must not be used after (see :meth:`resumed`). It
        holds the connection's own keys, never the group key's secret."""
        if self.state is not ConnectionState.READY or self._sent_bye or self.peer is None:
            raise PeerError(f"cannot move a connection that is {self._state_text()}")
        if self._outbox or self._stage is not _Stage.FIXED or self._pos:
            raise PeerError("cannot move a connection in the middle of a frame")
        keys = [[k._key, k.encrypt, k.cipher] if k is not None else None for k in (self._send_key, self._recv_key)]
        return {"role": self.role.value, "identity": [self.identity.peer_id, self.identity.user, self.identity.host],
                "peer": [type(self.peer) is Hello, self.peer.to_header()], "keyed": self.keyed,
                "encrypt": self.encrypt, "cipher": self.cipher, "group": self.group, "keys": keys,
                "seq": [self._send_seq, self._recv_seq],
                "admission": [sorted(self._asks_from_peer), sorted(self._accepted_for_peer),
                              sorted(self._asks_to_peer), sorted(self._accepted_by_peer)]}  # fmt: skip

    @classmethod
    def resumed(cls, session: dict[str, Any], *, limits: Limits | None = None,
                allocate: Allocator = bytearray) -> Connection:  # fmt: skip
        """The connection :meth:`session` described, READY, carried on in this process."""
        peer_id, user, host = session["identity"]
        conn = cls(Role(session["role"]), None, Identity(peer_id, user, host), limits=limits, allocate=allocate,
                   ciphers=())  # fmt: skip
        conn._outbox = []  # (an initiator queued a HELLO)
        hello, header = session["peer"]
        conn.peer = (Hello if hello else Challenge).from_header(header)
        conn.keyed, conn.encrypt, conn.cipher, conn.group = (bool(session["keyed"]), bool(session["encrypt"]),
                                                             str(session["cipher"]), str(session["group"]))  # fmt: skip
        conn._send_key, conn._recv_key = (DirectionKey(bytes(k[0]), bool(k[1]), str(k[2])) if k else None
                                          for k in session["keys"])  # fmt: skip
        conn._send_seq, conn._recv_seq = (int(n) for n in session["seq"])
        conn._dh = None
        (conn._asks_from_peer, conn._accepted_for_peer, conn._asks_to_peer,
         conn._accepted_by_peer) = (set(ids) for ids in session["admission"])  # fmt: skip
        conn._become_ready()
        return conn

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
        if len(header) > _PACKER_KEEP:  # a large header: do not keep the buffer it grew
            self._packer = msgpack.Packer(use_bin_type=True, buf_size=_PACKER_BYTES)
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
        ring = None
        if key is not None:
            head = key.seal_head(seq, head, FIXED_SIZE + 8 * len(lengths))
            if key.encrypt and views and len(head) + sum(lengths) > SMALL_BODY:
                if self._ring is None:
                    self._ring = SliceRing()
                ring = self._ring
        frame = OutgoingFrame(mtype, seq, head, views, key, sum(lengths), ring)
        self._send_seq = seq + 1
        self._outbox.append(frame)
        return frame

    def _build_head(self, mtype: MessageType, header: bytes, lengths: list[int], flags: int) -> bytes:
        """The fixed header, the buffer table and the msgpack header of the next frame."""
        seq = self._send_seq
        if seq >= _MAX_SEQ:
            raise PeerError("sequence numbers exhausted: open a new connection")
        n = len(lengths)
        return head_struct(n).pack(MAGIC, PROTOCOL_VERSION, mtype, flags, seq, len(header),
                                    sum(lengths), n, 0, *lengths) + header  # fmt: skip

    def _state_text(self) -> str:
        if self._sent_bye and self.state is ConnectionState.READY:
            return "closing (BYE or ERROR sent)"
        return self.state.value

    # ------------------------------------------------------------ admission

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
