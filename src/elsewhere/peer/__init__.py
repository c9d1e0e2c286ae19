"""The peer network: group keys, the wire protocol, announcements, discovery.

Modules, from the bottom up:

- :mod:`.keys`: the group key and its file (no key: loopback-only mode);
- :mod:`.messages`: the protocol's numbers, the fixed frame header and the
  messages with their msgpack header codec;
- :mod:`.frames`: the keys and MACs of a connection's frames, and a frame
  ready to send (:class:`OutgoingFrame`);
- :mod:`.wire`: frames, handshake, MACs and admission rules of one TCP
  connection, sans-IO (:class:`Connection`), and the protocol's description;
- :mod:`.announce`: the signed UDP announcement and the table of known peers,
  sans-IO (:class:`AnnouncementDecoder`, :class:`PeerTable`);
- :mod:`.discovery`: the announcer and listener threads on real sockets.

The protocol is described in ``docs/peer-protocol.md``.
"""

from __future__ import annotations

from .announce import (
    Announcement,
    AnnouncementDecoder,
    PeerFilter,
    PeerInfo,
    PeerState,
    PeerTable,
    encode_announcement,
    new_peer_id,
)
from .discovery import DEFAULT_MULTICAST_GROUP, DEFAULT_PORT, Announcer, DiscoveryConfig, Listener
from .frames import OutgoingFrame
from .keys import (
    LOOPBACK_HOST,
    LOOPBACK_ONLY,
    GroupKey,
    default_key_path,
    find_key,
    generate_key,
    is_loopback_only,
    load_key,
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
from .wire import Connection, ConnectionState, Event, HandshakeComplete, Limits, Received, Role

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
    "write_key",
]
