"""Keys and MACs of a connection's frames, and a frame ready to send.

:class:`DirectionKey` is AES-GCM used as a MAC (GMAC) for one direction of one
connection, its key derived with HKDF (:func:`hkdf`); :class:`OutgoingFrame`
is one encoded frame whose parts go out in order, its body tag computed at
once or slice by slice as they are sent. Where the tags sit in a frame is in
the byte table of :mod:`.layout`; how the keys are derived from the group key
and the handshake, in :mod:`.handshake`.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterator
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..util.errors import PeerError
from .layout import TAG_SIZE, MessageType

__all__ = ["SMALL_BODY", "DirectionKey", "OutgoingFrame", "as_bytes_view", "hkdf"]

_NONCE = struct.Struct(">QI")
SMALL_BODY = 256 << 10
"""Frames with a body up to this size get their body tag in one call, not streamed."""


def hkdf(secret: bytes, salt: bytes | None, info: bytes) -> bytes:
    """32 bytes derived from ``secret`` with HKDF-SHA256."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


def _nonce(seq: int, part: int) -> bytes:
    return _NONCE.pack(seq, part)


class DirectionKey:
    """AES-GCM used as a MAC (GMAC) for one direction of one connection."""

    __slots__ = ("_aead", "_key")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._aead = AESGCM(key)

    def head_tag(self, seq: int, data: bytes | bytearray | memoryview) -> bytes:
        return self._aead.encrypt(_nonce(seq, 0), b"", data)

    def head_ok(self, seq: int, data: memoryview, tag: memoryview) -> bool:
        try:
            self._aead.decrypt(_nonce(seq, 0), bytes(tag), data)
        except InvalidTag:
            return False
        return True

    def body_tag(self, seq: int, data: bytes | bytearray | memoryview) -> bytes:
        """The body tag of a frame whose every byte before the tag is ``data`` (one call)."""
        return self._aead.encrypt(_nonce(seq, 1), b"", data)

    def body_ok(self, seq: int, data: bytes | bytearray | memoryview, tag: bytes | bytearray | memoryview) -> bool:
        try:
            self._aead.decrypt(_nonce(seq, 1), bytes(tag), data)
        except InvalidTag:
            return False
        return True

    def body_mac(self, seq: int) -> Any:
        # streaming: one authenticate_additional_data call per slice received or sent
        return Cipher(algorithms.AES(self._key), modes.GCM(_nonce(seq, 1))).encryptor()


def as_bytes_view(buf: Any) -> memoryview:
    """``buf`` as a flat memoryview of bytes, to send; :class:`PeerError` if it is not contiguous."""
    view = memoryview(buf)
    if view.format == "B" and view.ndim == 1 and view.c_contiguous:
        return view
    try:
        return pickle.PickleBuffer(buf).raw()
    except BufferError:
        raise PeerError("a buffer to send is not contiguous") from None


class OutgoingFrame:
    """One encoded frame. Send its parts, in order, and frames in the order made.

    :meth:`parts` computes the body tag at once and returns every part (for
    one ``sendmsg``); :meth:`iter_parts` computes it slice by slice while the
    caller sends each slice (the slice is hot in cache when it is sent).
    """

    __slots__ = ("_buffers", "_head", "_key", "_tag", "msg_type", "nbytes", "seq")

    def __init__(
        self,
        msg_type: MessageType,
        seq: int,
        head: bytes,
        buffers: list[memoryview],
        key: DirectionKey | None,
        body_len: int | None = None,
    ) -> None:
        self.msg_type = msg_type
        self.seq = seq
        self._head = head
        self._buffers = buffers
        self._key = key if buffers else None
        self._tag: bytes | None = None if self._key is not None else b""
        if body_len is None:
            body_len = sum(len(b) for b in buffers)
        self.nbytes = len(head) + body_len + (TAG_SIZE if self._key is not None else 0)

    @property
    def small(self) -> bool:
        """Whether the body tag is computed in one call (see :meth:`iter_parts`)."""
        return self.nbytes <= SMALL_BODY

    def parts(self) -> list[memoryview]:
        """Every part of the frame: head, each buffer, body tag (if any)."""
        if self._tag is None:
            if self.nbytes <= SMALL_BODY:
                assert self._key is not None  # set whenever the tag is still to compute
                self._tag = self._key.body_tag(self.seq, b"".join([self._head, *self._buffers]))
            else:
                for _ in self.iter_parts():
                    pass
        out = [memoryview(self._head), *self._buffers]
        if self._tag:
            out.append(memoryview(self._tag))
        return out

    def iter_parts(self, slice_bytes: int = 1 << 20) -> Iterator[memoryview]:
        """The frame as slices of at most ``slice_bytes`` of each buffer."""
        if self._tag is None and self.nbytes <= SMALL_BODY:  # one call, not a streaming MAC
            assert self._key is not None  # set whenever the tag is still to compute
            self._tag = self._key.body_tag(self.seq, b"".join([self._head, *self._buffers]))
        yield memoryview(self._head)
        if self._tag is not None:
            yield from self._buffers
            if self._tag:
                yield memoryview(self._tag)
            return
        assert self._key is not None  # set whenever the tag is still to compute
        mac = self._key.body_mac(self.seq)
        mac.authenticate_additional_data(self._head)
        for buf in self._buffers:
            for start in range(0, len(buf), slice_bytes):
                piece = buf[start : start + slice_bytes]
                mac.authenticate_additional_data(piece)
                yield piece
        mac.finalize()
        self._tag = bytes(mac.tag)
        yield memoryview(self._tag)

    def tobytes(self) -> bytes:
        """The whole frame as one bytes object (copies: for tests and tiny frames)."""
        return b"".join(self.parts())
