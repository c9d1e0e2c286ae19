"""The peer network: group keys, the wire protocol, announcements, discovery.

Modules, from the bottom up. The protocol, sans-IO (bytes in, events out):

- :mod:`.keys`: the group key and its file (no key: loopback-only mode);
- :mod:`.layout`: the frame's byte table, the protocol's numbers, the fixed
  frame header and the caps on what a frame may carry (:class:`Limits`);
- :mod:`.messages`: the messages with their msgpack header codec;
- :mod:`.frames`: the keys, ciphers and tags of a connection's frames, and a
  frame ready to send (:class:`OutgoingFrame`);
- :mod:`.events`: a connection's role, state and events;
- :mod:`.handshake`, :mod:`.reader`: a connection's handshake, and its reading
  of frames stage by stage;
- :mod:`.wire`: one TCP connection (:class:`Connection`): what it sends, its
  admission rules, and the protocol's description;
- :mod:`.announce`: the signed UDP announcement (:class:`AnnouncementDecoder`) and
  :mod:`.peertable`, the table of known peers (:class:`PeerTable`).

On real sockets: :mod:`.net` (opening them; the selector loops' waker),
:mod:`.stream` (a connection on a socket, received buffers), :mod:`.discovery`
(the announcer and listener threads) with :mod:`.discoveryconfig` (where and how often)
and :mod:`.recentpeers` (what a stopped controller's listener heard, for the next one).

The controller (one job's tasks on the peers): :mod:`.controller`, its state
(:mod:`.controlstate`) and parts (:mod:`.links`, :mod:`.batching`,
:mod:`.results`, :mod:`.retries`, :mod:`.notes`), with :mod:`.placement`,
:mod:`.encoder` and :mod:`.recorder`. The worker daemon: :mod:`.daemon`, its
state (:mod:`.workerstate`) and parts (:mod:`.inbound`, :mod:`.intake`,
:mod:`.dispatch`, :mod:`.delivery`, :mod:`.offer`), with :mod:`.options`,
:mod:`.admission`, :mod:`.fairshare`, :mod:`.access`, :mod:`.runs`,
:mod:`.children` and the task process, :mod:`.child`; lanes (a controller's connection
served by a task process directly): the daemon's side :mod:`.lanes`, the task process's
:mod:`.lane`.

The protocol is described in ``docs/peer-protocol.md``.

The names below are loaded on first use: a task process imports :mod:`.child` alone, and
must not pay for the protocol, discovery and their imports (``random`` among them, which a
task process would then seed before every task).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time (a task process starts faster)
if TYPE_CHECKING:
    from typing import Any

    from .announce import (
        Announcement,
        AnnouncementDecoder,
        PeerState,
        encode_announcement,
        new_peer_id,
    )
    from .discovery import (
        DEFAULT_MULTICAST_GROUP,
        DEFAULT_PORT,
        Announcer,
        DiscoveryConfig,
        Listener,
    )
    from .frames import (
        OutgoingFrame,
    )
    from .keys import (
        LOOPBACK_HOST,
        LOOPBACK_ONLY,
        GroupKey,
        default_key_path,
        find_key,
        generate_key,
        is_loopback_only,
        load_key,
        rotate_key,
        write_key,
    )
    from .messages import (
        Accept,
        Ack,
        Ask,
        Bye,
        Cancel,
        Challenge,
        Error,
        Flags,
        Greeting,
        Hello,
        Identity,
        Message,
        MessageType,
        Ping,
        Pong,
        Refuse,
        RefuseReason,
        Result,
        Task,
    )
    from .peertable import (
        PeerFilter,
        PeerInfo,
        PeerTable,
    )
    from .wire import (
        Connection,
        ConnectionState,
        Event,
        HandshakeComplete,
        Limits,
        Received,
        Role,
    )

#: the names of the package, by the module each lives in (loaded on first use: __getattr__)
_NAMES = {
    "announce": ("Announcement", "AnnouncementDecoder", "PeerState", "encode_announcement",
        "new_peer_id"),
    "discovery": ("DEFAULT_MULTICAST_GROUP", "DEFAULT_PORT", "Announcer", "DiscoveryConfig",
        "Listener"),
    "frames": ("OutgoingFrame",),
    "keys": ("LOOPBACK_HOST", "LOOPBACK_ONLY", "GroupKey", "default_key_path", "find_key",
        "generate_key", "is_loopback_only", "load_key", "rotate_key", "write_key"),
    "messages": ("Accept", "Ack", "Ask", "Bye", "Cancel", "Challenge", "Error", "Flags",
        "Greeting", "Hello", "Identity", "Message", "MessageType", "Ping", "Pong", "Refuse",
        "RefuseReason", "Result", "Task"),
    "peertable": ("PeerFilter", "PeerInfo", "PeerTable"),
    "wire": ("Connection", "ConnectionState", "Event", "HandshakeComplete", "Limits", "Received",
        "Role"),
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_PORT",
    "LOOPBACK_HOST",
    "LOOPBACK_ONLY",
    "Accept",
    "Ack",
    "Announcement",
    "AnnouncementDecoder",
    "Announcer",
    "Ask",
    "Bye",
    "Cancel",
    "Challenge",
    "Connection",
    "ConnectionState",
    "DiscoveryConfig",
    "Error",
    "Event",
    "Flags",
    "Greeting",
    "GroupKey",
    "HandshakeComplete",
    "Hello",
    "Identity",
    "Limits",
    "Listener",
    "Message",
    "MessageType",
    "OutgoingFrame",
    "PeerFilter",
    "PeerInfo",
    "PeerState",
    "PeerTable",
    "Ping",
    "Pong",
    "Received",
    "Refuse",
    "RefuseReason",
    "Result",
    "Role",
    "Task",
    "default_key_path",
    "encode_announcement",
    "find_key",
    "generate_key",
    "is_loopback_only",
    "load_key",
    "new_peer_id",
    "rotate_key",
    "write_key",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next use finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
