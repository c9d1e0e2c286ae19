"""The peer network: group keys, the wire protocol, announcements, discovery.

Modules, from the bottom up:

- :mod:`.keys`: the group key and its file (no key: loopback-only mode);
- :mod:`.wire`: frames, handshake, MACs and admission rules of one TCP
  connection, sans-IO (:class:`Connection`);
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
from .discovery import (
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_PORT,
    Announcer,
    DiscoveryConfig,
    Listener,
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
    write_key,
)
from .wire import (
    Accept,
    Ack,
    Ask,
    Bye,
    Cancel,
    Challenge,
    Connection,
    ConnectionState,
    Error,
    Event,
    Flags,
    Greeting,
    HandshakeComplete,
    Hello,
    Identity,
    Limits,
    Message,
    MessageType,
    OutgoingFrame,
    Ping,
    Pong,
    Received,
    Refuse,
    RefuseReason,
    Result,
    Role,
    Task,
)

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
