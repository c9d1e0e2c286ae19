"""Keys, tags and ciphers of a connection's frames, and a frame ready to send.

:class:`DirectionKey` is the AEAD of one direction of one connection (AES-256-GCM, or
ChaCha20-Poly1305 where the handshake chose it: see :mod:`.ciphers`), its key derived
with HKDF (:func:`hkdf`). It either encrypts each frame's msgpack header and raw buffers
and authenticates the rest (``encrypt=True``, the default of a keyed group), or only
authenticates the whole frame (an empty plaintext, the frame as associated data: GMAC
under AES; a group whose members all turned encryption off). The head and the body of a
frame have a tag each, under the nonces ``seq ‖ 0`` and ``seq ‖ 1``.
:class:`OutgoingFrame` is one encoded frame whose parts go out in order, its body sealed at
once or slice by slice as it is sent. Where the tags sit in a frame is in the byte table of
:mod:`.layout`; how the keys are derived from the group key and the handshake, in
:mod:`.handshake`.
"""

from __future__ import annotations

import hmac
import pickle
import struct
import sys
from collections.abc import Iterator
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..util.errors import PeerError
from .ciphers import AES_GCM, CHACHA, ChaChaPolyStream
from .layout import TAG_SIZE, MessageType

__all__ = ["SMALL_BODY", "BodyOpener", "DirectionKey", "OutgoingFrame", "SliceRing", "as_bytes_view", "hkdf"]

_NONCE = struct.Struct(">QI")
SMALL_BODY = 256 << 10
"""Frames with a body up to this size are sealed and opened in one call, not streamed."""
SLICE_BYTES = 1 << 20
"""A large body is sealed and sent in slices of this size (each hot in cache when sent)."""


def hkdf(secret: bytes, salt: bytes | None, info: bytes) -> bytes:
    """32 bytes derived from ``secret`` with HKDF-SHA256."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


def _nonce(seq: int, part: int) -> bytes:
    return _NONCE.pack(seq, part)


def _update_into(ctx: Any, data: memoryview, out: memoryview) -> None:
    """``ctx.update_into`` with an output exactly as long as the input (GCM is a stream mode;
    a ``cryptography`` that asks for 15 spare bytes gets ``update`` and a copy instead)."""
    try:
        ctx.update_into(data, out)
    except ValueError:
        out[:] = ctx.update(data)


class DirectionKey:
    """The AEAD of one direction of one connection (``cipher``: AES-256-GCM or
    ChaCha20-Poly1305): encrypts and authenticates (``encrypt``) or only authenticates
    (GMAC, or Poly1305) each frame's head and body."""

    __slots__ = ("_aead", "_key", "cipher", "encrypt")

    def __init__(self, key: bytes, encrypt: bool = False, cipher: str = AES_GCM) -> None:
        self._key = key
        if cipher == AES_GCM:
            self._aead: AESGCM | ChaCha20Poly1305 = AESGCM(key)
        elif cipher == CHACHA:
            self._aead = ChaCha20Poly1305(key)
        else:
            raise ValueError(f"unknown cipher {cipher!r}")
        self.cipher = cipher
        self.encrypt = encrypt

    def _stream(self, nonce: bytes, decrypt: bool) -> Any:
        """A streaming context of this cipher (GCM's, or :class:`ChaChaPolyStream`)."""
        if self.cipher == CHACHA:
            return ChaChaPolyStream(self._key, nonce, decrypt)
        cipher = Cipher(algorithms.AES(self._key), modes.GCM(nonce))
        return cipher.decryptor() if decrypt else cipher.encryptor()

    # -- the head: fixed bytes and buffer table in clear (authenticated), the msgpack header
    def seal_head(self, seq: int, head: bytes, clear: int) -> bytes:
        """``head`` (fixed bytes, buffer table, msgpack header) as sent: its first ``clear``
        bytes as they are, the header encrypted (or not), then the head tag."""
        if self.encrypt:
            return head[:clear] + self._aead.encrypt(_nonce(seq, 0), head[clear:], head[:clear])
        return head + self._aead.encrypt(_nonce(seq, 0), b"", head)

    def open_head(self, seq: int, head: memoryview, clear: int) -> bytes | memoryview | None:
        """The msgpack header of a received head (tag last), or None if it does not
        authenticate; nothing of it is used before that."""
        try:
            if self.encrypt:
                return self._aead.decrypt(_nonce(seq, 0), head[clear:], head[:clear])
            self._aead.decrypt(_nonce(seq, 0), bytes(head[-TAG_SIZE:]), head[:-TAG_SIZE])
        except InvalidTag:
            return None
        return head[clear:-TAG_SIZE]

    # -- the body: the raw buffers, after the head (which is its associated data)
    def seal_body(self, seq: int, head: bytes, buffers: list[memoryview]) -> list[memoryview]:
        """The body of a small frame in one call: its parts after the head, tag last."""
        if self.encrypt:
            return [memoryview(self._aead.encrypt(_nonce(seq, 1), b"".join(buffers), head))]
        tag = self._aead.encrypt(_nonce(seq, 1), b"", b"".join([head, *buffers]))
        return [*buffers, memoryview(tag)]

    def open_body(self, seq: int, head: bytes | bytearray | memoryview,
                  sealed: bytes | bytearray | memoryview) -> bytes | None:  # fmt: skip
        """The buffers of a small encrypted frame, back to back, from ``sealed`` (their
        ciphertext, then the tag), or None if they do not authenticate."""
        try:
            return self._aead.decrypt(_nonce(seq, 1), sealed, head)
        except InvalidTag:
            return None

    def body_ok(self, seq: int, covered: bytes | bytearray | memoryview, tag: bytes | bytearray | memoryview) -> bool:
        """Whether ``tag`` authenticates a small frame that is not encrypted, ``covered``
        being every byte of it before the tag."""
        try:
            self._aead.decrypt(_nonce(seq, 1), bytes(tag), covered)
        except InvalidTag:
            return False
        return True

    def body_sealer(self, seq: int, head: bytes) -> Any:
        """A streaming encryptor of a large body, the head already fed as associated data."""
        ctx = self._stream(_nonce(seq, 1), decrypt=False)
        ctx.authenticate_additional_data(head)
        return ctx

    def body_opener(self, seq: int, head: bytes | bytearray | memoryview) -> BodyOpener:
        """A streaming check (and decryption) of a large body as it arrives."""
        ctx = self._stream(_nonce(seq, 1), decrypt=self.encrypt)  # (authenticating only: an encryptor)
        ctx.authenticate_additional_data(head)
        return BodyOpener(ctx, self.encrypt)


class BodyOpener:
    """The body of one large frame, checked (and decrypted) slice by slice as it is
    received; :meth:`finish` says whether it authenticates."""

    __slots__ = ("_ctx", "_decrypt")

    def __init__(self, ctx: Any, decrypt: bool) -> None:
        self._ctx = ctx
        self._decrypt = decrypt

    @property
    def decrypts(self) -> bool:
        """Whether the body is encrypted (:meth:`open_into`), else only authenticated
        (:meth:`update`)."""
        return self._decrypt

    def open_into(self, data: memoryview, out: memoryview) -> None:
        """Take in ``data``, received, decrypting it into ``out`` (as long, and apart from it:
        ``cryptography`` from version 51 on takes no output that overlaps its input)."""
        _update_into(self._ctx, data, out)

    def update(self, view: memoryview) -> None:
        """``view`` was received, in the clear, into the buffer it will be handed on in:
        authenticate it."""
        self._ctx.authenticate_additional_data(view)

    def finish(self, tag: bytes | bytearray | memoryview) -> bool:
        """Whether the body authenticates under ``tag`` (its buffers are used only if so)."""
        try:
            if self._decrypt:
                self._ctx.finalize_with_tag(bytes(tag))
                return True
            self._ctx.finalize()
        except InvalidTag:
            return False
        return hmac.compare_digest(self._ctx.tag, bytes(tag))


def as_bytes_view(buf: Any) -> memoryview:
    """``buf`` as a flat memoryview of bytes, to send; :class:`PeerError` if it is not contiguous."""
    view = memoryview(buf)
    if view.format == "B" and view.ndim == 1 and view.c_contiguous:
        return view
    try:
        return pickle.PickleBuffer(buf).raw()
    except BufferError:
        raise PeerError("a buffer to send is not contiguous") from None


class SliceRing:
    """Buffers that a connection's large encrypted bodies are sealed into, a slice at a
    time, reused once nothing holds a view of them any more (a slice is alive until the
    socket took all of it; its reference count says when), so that a 100 MB frame costs a
    few warm MiB rather than 100 MB of fresh pages. Not thread-safe: one sender."""

    __slots__ = ("_base", "_bufs", "size")

    def __init__(self, size: int = SLICE_BYTES) -> None:
        self.size = size
        self._bufs: list[bytearray] = []
        probe = [bytearray(1)]
        self._base = max(sys.getrefcount(b) for b in probe)  # held by the list alone

    def take(self, n: int) -> memoryview:
        """A writable view of ``n`` <= :attr:`size` bytes nothing else uses now."""
        for b in self._bufs:
            if sys.getrefcount(b) <= self._base:
                return memoryview(b)[:n]  # a new view: it holds ``b`` while it (or a slice) lives
        buf = bytearray(self.size)
        self._bufs.append(buf)
        return memoryview(buf)[:n]

    def __len__(self) -> int:
        return len(self._bufs)


class OutgoingFrame:
    """One encoded frame. Send its parts, in order, and frames in the order made.

    :meth:`parts` seals the body at once and returns every part (for one
    ``sendmsg``); :meth:`iter_parts` seals it slice by slice while the caller sends
    each slice (the slice is hot in cache when it is sent; an encrypted slice is
    sealed into a buffer of the connection's :class:`SliceRing`, valid until the
    caller drops the view).
    """

    __slots__ = ("_buffers", "_head", "_key", "_ring", "_sealed", "_streamed", "msg_type", "nbytes", "seq")

    def __init__(
        self,
        msg_type: MessageType,
        seq: int,
        head: bytes,
        buffers: list[memoryview],
        key: DirectionKey | None,
        body_len: int | None = None,
        ring: SliceRing | None = None,
    ) -> None:
        self.msg_type = msg_type
        self.seq = seq
        self._head = head
        self._buffers = buffers
        self._key = key if buffers else None
        self._ring = ring
        self._sealed: list[memoryview] | None = None if self._key is not None else buffers
        self._streamed = False
        if body_len is None:
            body_len = sum(len(b) for b in buffers)
        self.nbytes = len(head) + body_len + (TAG_SIZE if self._key is not None else 0)

    @property
    def small(self) -> bool:
        """Whether the body is sealed in one call (see :meth:`iter_parts`)."""
        return self.nbytes <= SMALL_BODY

    def parts(self) -> list[memoryview]:
        """Every part of the frame: head, the body (as sent), body tag (if any)."""
        key = self._key
        if self._sealed is None:
            assert key is not None  # set whenever the body is still to seal
            if self.nbytes <= SMALL_BODY:
                self._sealed = key.seal_body(self.seq, self._head, self._buffers)
            elif key.encrypt:  # streamed, each slice copied out (the ring's buffers are reused)
                it = self.iter_parts()
                next(it)
                self._sealed = [memoryview(bytes(p)) for p in it]
            else:
                for _ in self.iter_parts():  # the stream keeps the tag
                    pass
        assert self._sealed is not None
        return [memoryview(self._head), *self._sealed]

    def iter_parts(self, slice_bytes: int = SLICE_BYTES) -> Iterator[memoryview]:
        """The frame as slices of at most ``slice_bytes`` of each buffer."""
        if self._sealed is None and self.nbytes <= SMALL_BODY:  # one call, not a stream
            assert self._key is not None  # set whenever the body is still to seal
            self._sealed = self._key.seal_body(self.seq, self._head, self._buffers)
        yield memoryview(self._head)
        if self._sealed is not None:
            yield from self._sealed
            return
        key = self._key
        assert key is not None  # set whenever the body is still to seal
        if self._streamed:  # sealing twice would use the frame's nonce twice
            raise PeerError("an encrypted frame's body is streamed once: send its parts as they come")
        self._streamed = True
        ctx = key.body_sealer(self.seq, self._head)
        if key.encrypt:
            ring = self._ring if self._ring is not None and self._ring.size >= slice_bytes else SliceRing(slice_bytes)
            for buf in self._buffers:
                for start in range(0, len(buf), slice_bytes):
                    piece = buf[start : start + slice_bytes]
                    out = ring.take(len(piece))
                    _update_into(ctx, piece, out)
                    yield out
                    del out
            ctx.finalize()
            yield memoryview(bytes(ctx.tag))
            return
        for buf in self._buffers:
            for start in range(0, len(buf), slice_bytes):
                piece = buf[start : start + slice_bytes]
                ctx.authenticate_additional_data(piece)
                yield piece
        ctx.finalize()
        self._sealed = [*self._buffers, memoryview(bytes(ctx.tag))]  # a second stream reuses it
        yield self._sealed[-1]

    def tobytes(self) -> bytes:
        """The whole frame as one bytes object (copies: for tests and tiny frames)."""
        return b"".join(self.parts())
