"""The handshake of a :class:`~.wire.Connection`: proof of the group key, keys per direction.

The initiator is the side that connected::

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
mode differs from theirs. A responder that serves several groups proves the
key of the group the HELLO names. HELLO and CHALLENGE also say what each end
understands beyond protocol 1's first form (``caps``, see
:data:`~.wire.CAPABILITIES`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

import msgpack

from ..util.errors import ProtocolError
from .events import ConnectionState, Event, HandshakeComplete, Role
from .frames import DirectionKey, OutgoingFrame, hkdf
from .keys import GroupKey
from .layout import HANDSHAKE_TYPES, PAYLOAD_TYPES, TAG_SIZE, Limits, MessageType
from .messages import Auth, Challenge, Error, Greeting, Hello, Identity, Message

__all__ = ["HANDSHAKE_DEADLINE_S", "Handshake"]

HANDSHAKE_DEADLINE_S = 1.0
"""How long a responder waits for a connection's handshake to complete (from its accept):
two round trips, milliseconds even between busy machines. A worker closes a connection
still in its handshake after this, so connections that never prove the key (idle, or a
stranger's) hold a place among the few it admits for no longer; an initiator whose
handshake was cut connects again."""


class Handshake:
    """The handshake of :class:`~.wire.Connection` (a part of it, not used alone)."""

    # the connection's, read or set here (Connection.__init__ makes them)
    role: Role
    identity: Identity
    limits: Limits
    keyed: bool
    state: ConnectionState
    peer: Greeting | None
    group: str
    _keys: dict[str, GroupKey]
    _caps: tuple[str, ...]
    _secret: bytes
    _hs_key: bytes
    _nonce: bytes
    _transcript: list[bytes]
    _outbox: list[OutgoingFrame]
    _packer: msgpack.Packer
    _send_seq: int
    _send_key: DirectionKey | None
    _recv_key: DirectionKey | None
    _expect: frozenset[MessageType]
    _ready_specs: dict[int, tuple[MessageType, int, int, int]]
    _head: bytes | bytearray  # the frame just read (see Reader)

    if TYPE_CHECKING:  # the other parts of the connection

        def _build_head(self, mtype: MessageType, header: bytes, lengths: list[int], flags: int) -> bytes: ...

    def _use_key(self, key: GroupKey | None) -> None:
        self.group = key.group if key is not None else ""
        self._secret = key.secret if key is not None else b""
        self._hs_key = b""  # derived when first used: never for a connection that says nothing

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
                                  self.identity.host, self.keyed, self._nonce, self._caps)  # fmt: skip
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

    def _queue_handshake(self, message: Message, label: bytes) -> bytes:
        """Queue a handshake frame, tagged with HMAC over the transcript when keyed."""
        header = self._packer.pack(message.to_header())
        head = self._build_head(message.TYPE, header, [], 0)
        if self.keyed and label:
            head += self._handshake_tag(label, head)
        self._outbox.append(OutgoingFrame(message.TYPE, self._send_seq, head, [], None))
        self._send_seq += 1
        return head

    def _handshake_tag(self, label: bytes, head: bytes | memoryview) -> bytes:
        if not self._hs_key:
            info = b"elsewhere peer v1 handshake\0" + self.group.encode()
            self._hs_key = hkdf(self._secret, None, info)
        prior = hashlib.sha256(b"".join(self._transcript)).digest()
        mac = hmac.new(self._hs_key, label + b"\0" + prior, hashlib.sha256)
        mac.update(head)
        return mac.digest()[:TAG_SIZE]

    def _fail_handshake(self, code: str, text: str) -> ProtocolError:
        """Queue an (untagged) ERROR for the peer and return the error to raise."""
        header = self._packer.pack(Error(code, text).to_header())
        head = self._build_head(MessageType.ERROR, header, [], 0)
        self._outbox.append(OutgoingFrame(MessageType.ERROR, self._send_seq, head, [], None))
        self._send_seq += 1
        return ProtocolError(text)
