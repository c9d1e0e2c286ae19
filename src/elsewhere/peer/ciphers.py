"""Which cipher a connection's frames use, and ChaCha20-Poly1305 fed slice by slice.

Two AEADs protect frames after the handshake, both with 32-byte keys, 12-byte nonces and
16-byte tags: AES-256-GCM (:data:`AES_GCM`), the fastest where the CPU has AES
instructions, and ChaCha20-Poly1305 (:data:`CHACHA`, RFC 8439), the fastest where it has
none (measured in ``docs/peer-protocol.md``). Each end offers the ciphers it has in its
order of preference (:func:`offered_ciphers`: AES-256-GCM first where the CPU has AES
instructions, else ChaCha20-Poly1305 first; ``ELSEWHERE_PEER_CIPHER`` limits an end to
one) in its HELLO or CHALLENGE; the worker takes the first of the controller's list that it
has too (:func:`choose_cipher`), and the controller, which sees the worker's list, makes
the same choice. A peer older than this names none and speaks AES-256-GCM
(:data:`LEGACY`). The handshake's proofs cover both lists, so no one on the path can
change the choice.

``cryptography`` streams AES-GCM (a context fed slice by slice), but its ChaCha20-Poly1305
takes a whole message in one call. :class:`ChaChaPolyStream` is the same AEAD put
together from ``cryptography``'s ChaCha20 and Poly1305 as RFC 8439 (section 2.8) does it,
with the methods of a GCM context, so that a large body is sealed and opened slice by slice
(in place, as it arrives) under either cipher; its ciphertext and tag are exactly those of
the one-call :class:`~cryptography.hazmat.primitives.ciphers.aead.ChaCha20Poly1305`.
"""

from __future__ import annotations

import hmac
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import AlreadyFinalized, InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.poly1305 import Poly1305

from ..util.errors import PeerError
from ..util.system import aes_in_hardware, parse_aes_flag

__all__ = [
    "AES_GCM",
    "CHACHA",
    "CIPHERS",
    "CIPHER_ENV",
    "LEGACY",
    "ChaChaPolyStream",
    "aes_in_hardware",
    "choose_cipher",
    "cipher_towards",
    "offered_ciphers",
    "parse_aes_flag",
]

AES_GCM = "aes-256-gcm"
CHACHA = "chacha20-poly1305"
CIPHERS = (AES_GCM, CHACHA)
"""Every cipher this end can use."""
LEGACY = (AES_GCM,)
"""What a peer that names no ciphers (one older than the choice) speaks."""
CIPHER_ENV = "ELSEWHERE_PEER_CIPHER"
"""An environment variable that limits this end to one cipher (``aes`` or ``chacha20``;
the full names too): for tests and measurements, or a machine whose choice is wrong."""

_NAMES = {"aes": AES_GCM, "aes-gcm": AES_GCM, "aes256gcm": AES_GCM, AES_GCM: AES_GCM,
          "chacha": CHACHA, "chacha20": CHACHA, "chacha20poly1305": CHACHA, CHACHA: CHACHA}  # fmt: skip
_LENGTHS = struct.Struct("<QQ")
_ZEROS = bytes(16)


def offered_ciphers(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The ciphers this end offers, best first: the one ``ELSEWHERE_PEER_CIPHER`` names
    alone, else both, AES-256-GCM first if the CPU has AES instructions. A name not known
    raises :class:`PeerError`."""
    env = os.environ if environ is None else environ
    forced = env.get(CIPHER_ENV, "").strip().lower()
    if forced:
        if forced not in _NAMES:
            raise PeerError(f"{CIPHER_ENV}={forced!r} names no cipher: use aes (AES-256-GCM) or "
                            "chacha20 (ChaCha20-Poly1305), or leave it unset to choose by the CPU")  # fmt: skip
        return (_NAMES[forced],)
    return CIPHERS if aes_in_hardware() else (CHACHA, AES_GCM)


def choose_cipher(controller: Sequence[str], worker: Sequence[str]) -> str | None:
    """The cipher of a connection, or None: ChaCha20-Poly1305 if either end puts it first
    (that end has no AES instructions: software AES there would be the slower end, 3.7-4.6x
    slower than ChaCha) and both have it; else the first of the controller's (the
    initiator's) offer that the worker has too. An empty offer, an older peer's, is
    AES-256-GCM alone. Both ends compute it from the two offers, so they agree."""
    ours, theirs = controller or LEGACY, worker or LEGACY
    if CHACHA in ours and CHACHA in theirs and CHACHA in (ours[0], theirs[0]):
        return CHACHA
    have = set(theirs)
    return next((c for c in ours if c in have and c in CIPHERS), None)


def cipher_towards(theirs: Sequence[str]) -> str:
    """The cipher a connection from this machine to a worker that offers ``theirs`` (announced)
    would use, or "none in common" (what ``elsewhere peer list`` shows)."""
    return choose_cipher(offered_ciphers(), theirs) or "none in common"


class ChaChaPolyStream:
    """ChaCha20-Poly1305 (RFC 8439) fed slice by slice, with the methods of a streaming
    ``cryptography`` GCM context: :meth:`authenticate_additional_data` (all of it first),
    :meth:`update_into` / :meth:`update`, then :meth:`finalize` (:attr:`tag`) or, decrypting,
    :meth:`finalize_with_tag`. Decrypting, each piece is authenticated before it is
    decrypted, so ``out`` may be the piece itself (decryption in place)."""

    __slots__ = ("_aad_len", "_ct_len", "_ctx", "_decrypt", "_mac", "_open", "tag")

    def __init__(self, key: bytes, nonce: bytes, decrypt: bool = False) -> None:
        # the Poly1305 key is the first 32 bytes of block 0; the message is encrypted from block 1
        poly_key = (
            Cipher(algorithms.ChaCha20(key, b"\0\0\0\0" + nonce), None)
            .encryptor()
            .update(_ZEROS * 2)
        )
        self._mac = Poly1305(poly_key)
        cipher = Cipher(algorithms.ChaCha20(key, b"\1\0\0\0" + nonce), None)
        self._ctx: Any = cipher.decryptor() if decrypt else cipher.encryptor()
        self._decrypt = decrypt
        self._aad_len = 0
        self._ct_len = -1  # -1: still taking associated data
        self._open = True
        self.tag = b""

    def authenticate_additional_data(self, data: bytes | bytearray | memoryview) -> None:
        """Associated data (authenticated, not encrypted): all of it before any message."""
        if self._ct_len >= 0 or not self._open:
            raise AlreadyFinalized("associated data goes before the message")
        self._mac.update(data)
        self._aad_len += len(data)

    def _start(self) -> None:
        if self._aad_len % 16:
            self._mac.update(_ZEROS[: 16 - self._aad_len % 16])
        self._ct_len = 0

    def update_into(self, data: bytes | bytearray | memoryview, out: bytearray | memoryview) -> int:
        """Encrypt (or decrypt) ``data`` into ``out`` (at least as long; may be ``data``)."""
        if not self._open:
            raise AlreadyFinalized("the context was finalized")
        if self._ct_len < 0:
            self._start()
        if self._decrypt:
            self._mac.update(data)  # the ciphertext, before it is overwritten
            n = self._crypt_into(data, out)
        else:
            n = self._crypt_into(data, out)
            self._mac.update(memoryview(out)[:n])
        self._ct_len += n
        return n

    def _crypt_into(self, data: bytes | bytearray | memoryview, out: bytearray | memoryview) -> int:
        try:
            return int(self._ctx.update_into(data, out))
        except ValueError:  # a ``cryptography`` that wants spare room in ``out``: a copy
            piece = self._ctx.update(data)
            memoryview(out)[: len(piece)] = piece
            return len(piece)

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        """Encrypt (or decrypt) ``data``: a new bytes object."""
        out = bytearray(len(data))
        self.update_into(data, out)
        return bytes(out)

    def finalize(self) -> bytes:
        """End the message; :attr:`tag` is its tag. Returns b"" (as a GCM context does)."""
        if not self._open:
            raise AlreadyFinalized("the context was finalized")
        if self._ct_len < 0:
            self._start()
        if self._ct_len % 16:
            self._mac.update(_ZEROS[: 16 - self._ct_len % 16])
        self._mac.update(_LENGTHS.pack(self._aad_len, self._ct_len))
        self.tag = self._mac.finalize()
        self._open = False
        return b""

    def finalize_with_tag(self, tag: bytes) -> bytes:
        """End the message and check ``tag``: :class:`InvalidTag` if it does not authenticate."""
        self.finalize()
        if not hmac.compare_digest(self.tag, bytes(tag)):
            raise InvalidTag
        return b""
