"""The handshake of a :class:`~.wire.Connection`: proof of the group key, keys per direction.

The initiator is the side that connected::

    initiator                                          responder
    HELLO      (nonce_i, id, group, keyed,
                encrypt, keys, dh_i, ciphers)  --->
                                               <---    CHALLENGE (nonce_r, id, group, keyed,
                                                                  encrypt, dh_r, ciphers)
                                                       tag = HMAC(K_hs, "CHALLENGE" | H(hello) | head)
    AUTH       tag = HMAC(K_hs, "AUTH" | H(hello | challenge) | head)  --->
    (ready)                                            (ready after checking AUTH)

``K_hs`` is derived from the group key with HKDF. After the handshake each
direction has its own 256-bit key, HKDF(group key ‖ X25519(dh_i, dh_r), salt =
SHA-256 of the three handshake frames, info = direction and cipher), for the cipher
the two ``ciphers`` lists choose (the first of the initiator's, the controller's, that
the responder has too: AES-256-GCM or ChaCha20-Poly1305, see :mod:`.ciphers`): fresh for
every connection, so a sequence number (the nonce) never repeats under one key,
and out of reach of whoever holds the group key but not one of the two
ephemeral private keys (a member recording others' connections, a thief of the
key file later). With ``encrypt`` (the default; both ends must say the same)
those keys encrypt each frame; else they only authenticate it.

``keys`` lists the fingerprints of the keys the initiator holds (after a
rotation, the previous ones still in their overlap): the responder proves the
newest one it holds too, or refuses ("no key ... in common"); the initiator
tries its keys on the CHALLENGE's tag. A responder that serves several groups
proves a key of the group the HELLO names. The HELLO's fields are covered by
the CHALLENGE's proof, so an attacker who changes them (to turn encryption off,
pick an old key or another cipher, drop the key share) makes the handshake fail.

Without a key (loopback-only mode) the same frames flow without tags or key
shares; a connection made with a key never accepts a frame without a tag, and
both sides refuse a peer whose mode differs from theirs. HELLO and CHALLENGE
also say what each end understands beyond protocol 1's first form (``caps``,
see :data:`~.wire.CAPABILITIES`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import TYPE_CHECKING

import msgpack
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..util.errors import ProtocolError
from .ciphers import AES_GCM, CIPHER_ENV, LEGACY, choose_cipher
from .events import ConnectionState, Event, HandshakeComplete, Role
from .frames import DirectionKey, OutgoingFrame, hkdf
from .keys import GroupKey
from .layout import HANDSHAKE_TYPES, PAYLOAD_TYPES, TAG_SIZE, Limits, MessageType
from .messages import Auth, Challenge, Error, Greeting, Hello, Identity, Message

__all__ = ["HANDSHAKE_DEADLINE_S", "EphemeralKeys", "Handshake", "HandshakeRefused"]

HANDSHAKE_DEADLINE_S = 1.0
"""How long a responder waits for a connection's handshake to complete (from its accept):
two round trips, milliseconds even between busy machines. A worker closes a connection
still in its handshake after this, so connections that never prove the key (idle, or a
stranger's) hold a place among the few it admits for no longer; an initiator whose
handshake was cut connects again."""


class HandshakeRefused(ProtocolError):
    """One end refused the other in the handshake, and said why: ``code`` is the ERROR's
    short word (``group``, ``key``, ``encrypt``, ...), the text what it said. Connecting
    again does not help until one end changes."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


class EphemeralKeys:
    """X25519 key pairs for the handshakes' key exchange: a new one for each connection, or
    (``reuse_s`` > 0, a worker's) one kept for that long, so that a flood of HELLOs from
    strangers does not cost a key generation each (about 0.1-0.3 ms here). A pair is
    forgotten once replaced: connections recorded before cannot be opened after, even with
    the group key."""

    def __init__(self, reuse_s: float = 0.0) -> None:
        self.reuse_s = reuse_s
        self._pair: tuple[X25519PrivateKey, bytes] | None = None
        self._made = 0.0

    def get(self) -> tuple[X25519PrivateKey, bytes]:
        """A private key and its public share (32 bytes)."""
        now = time.monotonic()
        if self._pair is None or now - self._made >= self.reuse_s:
            private = X25519PrivateKey.generate()
            self._pair = (private, private.public_key().public_bytes_raw())
            self._made = now
        return self._pair


class Handshake:
    """The handshake of :class:`~.wire.Connection` (a part of it, not used alone)."""

    # the connection's, read or set here (Connection.__init__ makes them)
    role: Role
    identity: Identity
    limits: Limits
    keyed: bool
    encrypt: bool
    cipher: str
    state: ConnectionState
    peer: Greeting | None
    group: str
    _keys: dict[str, GroupKey]
    _caps: tuple[str, ...]
    _ciphers: tuple[str, ...]  # what this end offers, best first
    _secret: bytes
    _hs_key: bytes
    _group_key: GroupKey | None
    _candidates: list[bytes]  # an initiator's keys: the CHALLENGE proves one of them
    _ephemeral: EphemeralKeys
    _dh: tuple[X25519PrivateKey, bytes] | None  # this end's key share, until the keys are made
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
        self._group_key = key

    @property
    def proven_secret(self) -> bytes:
        """The secret of the group key this connection's handshake proved (after a rotation,
        perhaps a previous one; empty without a key)."""
        return self._secret

    def _key_fingerprints(self) -> tuple[str, ...]:
        """The keys an initiator offers in its HELLO (newest first); it remembers their secrets."""
        accepted = self._group_key.accepted() if self._group_key is not None else []
        self._candidates = [k.secret for k in accepted]
        return tuple(k.fingerprint for k in accepted)

    def _choose_key(self, offered: tuple[str, ...]) -> None:
        """A responder proves the newest key it accepts that the initiator holds too."""
        assert self._group_key is not None  # keyed
        mine = self._group_key.accepted()
        chosen = next((k for k in mine if k.fingerprint in offered), None)
        if chosen is None:
            raise self._fail_handshake(
                "key", f"no key of group {self.group!r} in common: this peer accepts key "
                f"{', '.join(k.fingerprint for k in mine)}, the other holds {', '.join(offered)}: a wrong "
                "group key, or a rotated one (copy the group's newest key file to both machines)")  # fmt: skip
        if chosen.secret != self._secret:
            self._secret, self._hs_key = chosen.secret, b""

    def _handshake_tag_ok(self, label: bytes, head: bytes | memoryview, tag: bytes | memoryview) -> bool:
        """Whether ``tag`` proves the key; an initiator holding several keys (a rotation's
        overlap) tries each, and keeps the one the responder proved."""
        if hmac.compare_digest(self._handshake_tag(label, head), tag):
            return True
        if self.role is Role.INITIATOR:
            for secret in self._candidates:
                if secret != self._secret:
                    kept = self._secret, self._hs_key
                    self._secret, self._hs_key = secret, b""
                    if hmac.compare_digest(self._handshake_tag(label, head), tag):
                        return True
                    self._secret, self._hs_key = kept
        return False

    def _handshake_step(self, message: Message, events: list[Event]) -> None:
        frame = bytes(self._head)
        if isinstance(message, Error):
            raise HandshakeRefused(message.code, f"the peer refused the handshake: {message.code}: {message.message}")
        if isinstance(message, Hello):
            self._transcript.append(frame)
            self._check_greeting(message)
            self._dh = self._ephemeral.get() if self.keyed else None
            challenge = Challenge(self.identity.peer_id, self.group, self.identity.user, self.identity.host,
                                  self.keyed, self._nonce, self._caps, self.encrypt,
                                  dh=self._dh[1] if self._dh else b"", ciphers=self._ciphers)  # fmt: skip
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
        if self.keyed and isinstance(greeting, Hello) and greeting.keys:  # (none: an older peer's one key)
            self._choose_key(greeting.keys)
        if self.keyed and greeting.encrypt != self.encrypt:
            raise self._fail_handshake("encrypt", self._encrypt_mismatch())
        if self.keyed:
            self._choose_cipher(greeting.ciphers)
        if greeting.nonce == self._nonce:
            raise self._fail_handshake("nonce", "the peer echoed our nonce")

    def _choose_cipher(self, theirs: tuple[str, ...]) -> None:
        """The first of the controller's ciphers that the worker has too (either end works
        it out from the two lists), or a refusal that says what each end offers."""
        initiator = self.role is Role.INITIATOR
        chosen = choose_cipher(self._ciphers, theirs) if initiator else choose_cipher(theirs, self._ciphers)
        if chosen is not None:
            self.cipher = chosen
            return
        other = ", ".join(theirs) if theirs else f"{', '.join(LEGACY)} only (an older version, which names none)"
        ends = ("this controller", "the worker") if initiator else ("this worker", "the controller")
        raise self._fail_handshake(
            "cipher", f"no cipher in common: {ends[0]} offers {', '.join(self._ciphers or LEGACY)}, {ends[1]} {other} "
            f"(the environment variable {CIPHER_ENV} limits an end to one cipher: unset it, or set the "
            "same at both ends)")  # fmt: skip

    def _encrypt_mismatch(self) -> str:
        """Why ends that disagree about encryption are refused, said to the controller (the
        initiator), which reads the worker's (the responder's) ERROR."""
        worker_encrypts = self.encrypt if self.role is Role.RESPONDER else not self.encrypt
        if worker_encrypts:
            return ("the worker encrypts tasks and results (the default with a group key) and the "
                    "controller turned encryption off (encrypt=False): turn it on again, or start "
                    "the worker with --no-encrypt (both ends must agree)")  # fmt: skip
        return ("the worker was started with --no-encrypt and the controller encrypts (the default "
                "with a group key): pass encrypt=False to ew.peers() to use this worker in clear "
                "text, or start the worker without --no-encrypt (both ends must agree)")  # fmt: skip

    def _ready(self, events: list[Event]) -> None:
        if self.keyed:
            salt = hashlib.sha256(b"".join(self._transcript)).digest()
            secret = self._secret + self._exchange()
            cipher = self.cipher
            suffix = b"" if cipher == AES_GCM else b"\0" + cipher.encode()  # (AES-256-GCM's: as before)
            i2r = DirectionKey(hkdf(secret, salt, b"elsewhere peer v1 initiator->responder" + suffix),
                               self.encrypt, cipher)  # fmt: skip
            r2i = DirectionKey(hkdf(secret, salt, b"elsewhere peer v1 responder->initiator" + suffix),
                               self.encrypt, cipher)  # fmt: skip
            initiator = self.role is Role.INITIATOR
            self._send_key, self._recv_key = (i2r, r2i) if initiator else (r2i, i2r)
        self._transcript = []
        self._become_ready()
        assert self.peer is not None  # set by the HELLO or CHALLENGE step
        events.append(HandshakeComplete(self.peer))

    def _become_ready(self) -> None:
        """READY: every type but the handshake's may come, under the caps of :attr:`limits`."""
        self.state = ConnectionState.READY
        self._expect = frozenset(MessageType) - HANDSHAKE_TYPES
        limits = self.limits
        for mtype in self._expect:  # the caps of each type, for _check_fixed and _whole_frame
            payload = mtype in PAYLOAD_TYPES
            nbuf = limits.max_buffers if payload else 0
            cap = limits.max_header_bytes if payload else limits.max_control_header_bytes
            self._ready_specs[int(mtype)] = (mtype, cap, nbuf, limits.max_body_bytes if nbuf else 0)

    def _exchange(self) -> bytes:
        """The X25519 shared secret of the two key shares (both ends proved the key, which
        covers the shares): b"" if either end sent none (an older peer)."""
        mine, self._dh = self._dh, None
        theirs = self.peer.dh if self.peer is not None else b""
        if mine is None or not theirs:
            return b""
        try:
            return mine[0].exchange(X25519PublicKey.from_public_bytes(theirs))
        except ValueError:
            raise ProtocolError("the peer's key share is not a valid X25519 key") from None

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

    def _fail_handshake(self, code: str, text: str) -> HandshakeRefused:
        """Queue an (untagged) ERROR for the peer and return the error to raise."""
        header = self._packer.pack(Error(code, text).to_header())
        head = self._build_head(MessageType.ERROR, header, [], 0)
        self._outbox.append(OutgoingFrame(MessageType.ERROR, self._send_seq, head, [], None))
        self._send_seq += 1
        return HandshakeRefused(code, text)
