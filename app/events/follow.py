"""Following a reader's channels from a cursor: history first, then live, every event exactly once.

All four transports read through this; they differ only in framing and in how long they wait.
Order of operations matters: subscribe locally, then read history, then take live events, dropping
any whose id is not after the position already delivered for its channel.

Access to named channels is checked by the caller before anything is held, and read again once the
subscription is in force, in the same round trip as the history: a revocation (or a role change) before
then reached no one, one after it reaches the hub. A member reads a channel from its grant's start on.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from ..channels.access import Access, recheck
from ..errors import forbidden
from .bus import Bus, Event, channels_for, reset_event
from .cursor import cursor_writer, decode_cursor, is_after, named_in, parse_id
from .hub import RESYNC, Hub, Unsubscribed
from .leases import ConnectionLeases

log = logging.getLogger(__name__)


class StreamEnded(Exception):
    """The connection must end: `reason` is token_expired, session_ended, overflow, shutdown, gone, or
    (a WebSocket whose client did not answer a ping) silent."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Delivery(NamedTuple):
    """An event and the cursor just after it (a tuple: one is made per reader per event), or a channel
    taken from the connection (`Unsubscribed`) and the cursor without it."""

    event: Event | Unsubscribed
    cursor: str  # the position just after this event: resuming from it yields the next one


NO_CHANNELS: dict = {}  # shared by the many readers of no named channel: never written (see add_channel)


class Follower:
    """A reader's view of its channels from a cursor: history first, then live, every event once."""

    presence = None  # the worker's PresenceKeeper, for connections that count as present
    present_in: dict | None = None  # channel -> presence entry, once there is one
    user: dict | None = None  # a live connection's user, as the opening's session check found it (stored role)
    max_named = 100  # MAX_CHANNELS_PER_CONNECTION, for subscribe frames (the view sets it)
    subscribe_proxy = None  # asks a proxy namespace's backend, for subscribe frames (the view sets it)

    def __init__(
        self,
        bus: Bus,
        hub: Hub,
        caller,
        cursor: str | None,
        queue_size: int,
        leases: ConnectionLeases | None = None,
        lease: str | None = None,
        named: dict | None = None,
        presence=None,
    ):
        """Start following; a 400 for a malformed cursor comes before anything is held.

        With `leases`, this is a live connection: it holds a lease (taken here unless `lease` is one
        already taken) and a hub subscription until `close()`, and raises StreamEnded("session_ended")
        if the session ended, or the user's role changed, while it was subscribing. Without, it reads
        history only (polling). `named`: the named channels asked for, each with the caller's Access
        (checked by the caller); one whose access ended meanwhile is taken as a revocation takes it (the
        first delivery says so). `presence`: the worker's PresenceKeeper, for a connection that counts as
        present (SSE, WebSocket).
        """
        self.bus = bus
        self.hub = hub
        self.caller = caller
        self.access = dict(named) if named else NO_CHANNELS  # named channel -> Access
        self.channels = channels_for(caller.user_id, caller.is_admin) + list(self.access)
        self.write_cursor = cursor_writer(self.channels, compact=bool(self.access))
        self.leases, self.lease, self.subscription = leases, lease, None
        if presence is not None:
            self.presence = presence
        if cursor:  # validate before subscribing: a malformed cursor is a plain 400
            self.start_at(decode_cursor(cursor, self.channels))
        # A named channel the cursor does not name starts at the present; so does every channel without a cursor.
        unnamed = [c for c in self.access if c not in named_in(cursor, list(self.access))] if cursor else self.channels
        try:
            checks, asked = [], None
            if leases is not None:
                self.subscription = hub.subscribe(
                    self.channels, caller.user_id, caller.session_id, queue_size, caller.is_admin
                )
                asked = None if lease else leases.ask(caller.user_id)
                # A logout between authentication and the subscription reached no one: look once more.
                checks = [bus.session_check(caller)] + ([asked.call] if asked else [])
            # One round trip, after the subscription is confirmed: the lease, the session, where the channels
            # stand, the history after the cursor (a member's from its grant's start on), and access to the
            # named channels once more. Events after what it reads arrive live.
            resumed = {c: p for c, p in self.positions.items() if c not in unnamed} if cursor else {}
            resumed = from_grant_starts(resumed, self.access)
            again = recheck(bus.client, caller.user_id, caller.is_admin, self.access) if self.access else None
            try:
                opening = bus.opening(checks, self.channels, resumed, again.commands if again else ())
            except BaseException:
                if asked is not None:
                    leases.withdraw(asked)
                raise
            if asked is not None:
                self.lease = leases.granted(asked, opening.checked[1])  # 429 when the user has too many
            if leases is not None:
                self.user = bus.held_user(caller, opening.checked[0])
                # A role change closes live connections so that they open again with the new role's channels.
                if self.user is None or self.user["role"] != caller.role:
                    raise StreamEnded("session_ended")
            self.start_at({**resumed, **{channel: opening.present[channel] for channel in unnamed}})
            self.pending: list[Delivery] = []
            if again is not None:
                self._access_again(again.judge(opening.checked[len(checks) :]))
            self._start = (self.write_cursor, dict(self.positions))  # where it starts reading (start_cursor)
            self.pending += [Delivery(reset_event(c), self.cursor) for c in opening.trimmed if c in self.after]
            self._catch_up(first=opening.first)
            for channel, access in self.access.items():
                self._hold_access(channel, access)
        except BaseException:
            self.close()
            raise

    @property
    def named(self) -> list[str]:
        """The named channels read now."""
        return list(self.access)

    def add_channel(self, channel: str, access: Access, cursor: str | None = None) -> str:
        """Read one more named channel (a WebSocket's subscribe frame): from the cursor's position for it
        (not before the reader's grant's start), else from the present; its history after that comes next.
        Returns the cursor at that start, before any of its history is delivered (a client that resumes from
        it misses none). 403 if its access ended while the hub subscribed to it (`access` was checked before)."""
        if channel in self.access:
            return self.cursor
        if self.subscription is not None:
            self.hub.add_channel(self.subscription, channel)
        queued = len(self.pending)
        try:
            resumed = {}
            if cursor and channel in named_in(cursor, [channel]):
                resumed = from_grant_starts({channel: decode_cursor(cursor, [channel])[channel]}, {channel: access})
            # As an opening does: where it stands, its history, and its access once more, in one round trip.
            again = recheck(self.bus.client, self.caller.user_id, self.caller.is_admin, {channel: access})
            opening = self.bus.opening([], [channel], resumed, again.commands)
            access = again.judge(opening.checked)[channel]
            if not access.allowed:
                raise forbidden(f"You may not subscribe to {channel!r}.")
            position = resumed.get(channel) or opening.present[channel]
            if self.access is NO_CHANNELS:
                self.access = {}
            self.access[channel] = access
            self.channels.append(channel)
            self.write_cursor = cursor_writer(self.channels, compact=True)
            self.start_at(from_grant_starts({**self.positions, channel: position}, {channel: access}))
            started = self.cursor
            if channel in opening.trimmed:
                self.pending.append(Delivery(reset_event(channel), started))
            self._catch_up([channel], first=opening.first)
            if channel in self.access:  # not taken while its history was read
                self._hold_access(channel, self.access[channel])
        except BaseException:
            self.remove_channel(channel)
            del self.pending[queued:]  # the channel's history read so far: not sent for a channel not read
            raise
        return started

    def remove_channel(self, channel: str) -> None:
        """Read a named channel no more (an unsubscribe frame, or its access ended)."""
        if self.subscription is not None:
            self.hub.remove_channel(self.subscription, channel)
        self._leave(channel)
        if channel not in self.access:
            return
        del self.access[channel]
        self.channels.remove(channel)
        self.write_cursor = cursor_writer(self.channels, compact=bool(self.access))
        self.positions.pop(channel, None)
        self.after.pop(channel, None)

    def _access_again(self, found: dict[str, Access]) -> None:
        """Access to named channels as read again: one no longer allowed is taken as a revocation takes it (the
        client is told first); one still allowed keeps its latest terms, and is read from its grant's start on."""
        allowed = {}
        for channel, access in found.items():
            checked = self.access.get(channel)
            if checked is None:
                continue
            if access.allowed:
                self.access[channel] = allowed[channel] = access
                continue
            # A grant (or membership) missing where the check found none needed: the namespace's rules changed.
            granted = checked.namespace is not None and (checked.namespace.by_grant or checked.namespace.by_org)
            reason = "access_changed" if access.reason == "revoked" and not granted else access.reason
            self.remove_channel(channel)
            self.pending.append(Delivery(Unsubscribed(channel, reason or "access_changed"), self.cursor))
        moved = from_grant_starts(self.positions, allowed)
        if moved is not self.positions:
            self.start_at(moved)

    def _hold_access(self, channel: str, access) -> None:
        """For a live connection: watch the grant's end, and count as present where the namespace asks."""
        if self.subscription is None:
            return
        self.hub.watch_expiry(self.subscription, channel, access.expires_at)
        namespace = access.namespace
        if self.presence is not None and namespace is not None and namespace.presence:
            if self.present_in is None:
                self.present_in = {}
            self.present_in[channel] = self.presence.enter(
                channel, self.caller.user_id, namespace.join_leave, namespace.presence_diff
            )

    def _leave(self, channel: str) -> None:
        entry = self.present_in.pop(channel, None) if self.present_in else None
        if entry is not None:
            self.presence.leave(entry)

    def start_at(self, positions: dict[str, str]) -> None:
        """The position of each channel: a stream id, and the same as numbers for comparing."""
        self.positions = positions
        self.after = {channel: parse_id(position) for channel, position in positions.items()}

    @property
    def cursor(self) -> str:
        """The cursor just after everything delivered so far."""
        return self.write_cursor(self.positions)

    @property
    def start_cursor(self) -> str:
        """Where this connection started reading, before the history it delivers: a client resuming from it misses
        nothing, also of the channels its cursor did not name (they started at the present)."""
        write, positions = self._start
        return write(positions)

    def close(self) -> None:
        """Stop following: unsubscribe, leave presence and give the connection's lease back (idempotent)."""
        for channel in list(self.present_in or ()):
            self._leave(channel)
        if self.subscription is not None:
            self.hub.unsubscribe(self.subscription)
            self.subscription = None
        if self.leases is not None:
            self.leases.release(self.lease)
            self.lease = None

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def take_ready(self, limit: int | None = None) -> list[Delivery]:
        """Deliveries available now, without waiting."""
        taken, self.pending = (self.pending, []) if limit is None else (self.pending[:limit], self.pending[limit:])
        return taken

    def wait(self, timeout: float, outlet=None) -> list[Delivery]:
        """Deliveries, waiting up to `timeout` s (less if the access token expires first); [] on time-out.

        With an `outlet` (outlet.py), events arriving while waiting are written by the hub through it;
        what it could not write is finished here first, before anything else reaches the client.
        """
        if self.pending:
            return self.take_ready()
        remaining = self.caller.expires_at - time.time()
        if remaining <= 0:
            raise StreamEnded("token_expired")
        return self._after_waiting(self.subscription.take(min(timeout, remaining), outlet), outlet)

    def take_now(self, outlet) -> list[Delivery]:
        """Like wait() without waiting, for a parked stream the hub woke (parked.py): the outlet's unsent
        rest is written first; [] when nothing is queued."""
        if self.pending:
            return self.take_ready()
        if time.time() >= self.caller.expires_at:
            raise StreamEnded("token_expired")
        return self._after_waiting(self.subscription.take_now(), outlet)

    def idle(self) -> bool:
        """Nothing to deliver and no reason to end: a stream may park."""
        subscription = self.subscription
        return not self.pending and not subscription.items and subscription.ended is None

    def _after_waiting(self, items: list, outlet) -> list[Delivery]:
        if outlet is not None:
            outlet.finish()
        if self.subscription.ended:
            raise StreamEnded(self.subscription.ended)
        for item in items:
            if item == RESYNC:
                if not self.bus.session_is_valid(self.caller):
                    raise StreamEnded("session_ended")  # a control message may have been missed
                if self.access:  # so may a revocation: ask again (the catch-up reads access again after history)
                    self.hub.recheck([(self.subscription, channel) for channel in self.access], "resync")
                self._catch_up()
            elif item.__class__ is Unsubscribed:
                if item.channel in self.access:
                    self.remove_channel(item.channel)
                    self.pending.append(Delivery(item, self.cursor))
            else:
                self._accept(item)
        if not items and time.time() >= self.caller.expires_at:
            raise StreamEnded("token_expired")
        return self.take_ready()

    def advance(self, event: Event) -> str | None:
        """Move past a live event; the cursor just after it, or None if it is not after the position (seen)."""
        after = self.after.get(event.channel)
        if after is None or event.order <= after:
            return None
        self.after[event.channel], self.positions[event.channel] = event.order, event.id
        return self.write_cursor.moved(self.positions, event.channel, event.id, event.packed())

    def _accept(self, event: Event) -> None:
        cursor = self.advance(event)
        if cursor is not None:
            self.pending.append(Delivery(event, cursor))

    def _catch_up(self, channels: list[str] | None = None, first: tuple[list[Event], bool] | None = None) -> None:
        """Read history after the positions until none is left; `first`: the first batch, read already."""
        while True:
            if first is None:
                wanted = {c: p for c, p in self.positions.items() if channels is None or c in channels}
                if not wanted:
                    return  # taken while its history was read
                first = self._read_after(dict(wanted))
            batch, more = first
            first = None
            for event in sorted(batch, key=lambda e: e.order):
                self._accept(event)
            if not more:
                return

    def _read_after(self, positions: dict[str, str]) -> tuple[list[Event], bool]:
        """The next batch of history; with named channels, their access read again after it (as in the opening),
        so a channel revoked meanwhile is taken before any of its events read here is delivered."""
        named = {channel: self.access[channel] for channel in positions if channel in self.access}
        if not named:
            return self.bus.read_after(positions)
        again = recheck(self.bus.client, self.caller.user_id, self.caller.is_admin, named)
        read = self.bus.opening([], [], positions, again.commands)
        self._access_again(again.judge(read.checked))
        return read.first


def from_grant_starts(positions: dict[str, str], access: dict[str, Access]) -> dict[str, str]:
    """The positions, each moved up to the start of the reader's grant of its channel where that is later: a
    member reads a channel from its grant on, not what was said before it (nor while it was excluded)."""
    moved = positions
    for channel, position in positions.items():
        found = access.get(channel)
        if found is not None and found.start is not None and is_after(found.start, position):
            moved = {**moved, channel: found.start}
    return moved
