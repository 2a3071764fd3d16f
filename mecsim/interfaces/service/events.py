"""Server-sent events of runs: one store reader per followed run, however many follow it.

``GET /runs/{id}/events`` streams ``round`` (a finished round's row; ``id`` is the
round) and then ``end`` (the final status). Each stream first reads what it missed
(everything after its ``Last-Event-ID``, made off the event loop, sent in chunks) from
the store, then follows the run's
:class:`RoundFeed`: one task per followed run reads the store every
:data:`EVENTS_POLL_S` seconds and encodes each new row once for every stream. Fifty
followers of a run cost one read and one encoding per round, not fifty (they took 12 %
of the training's speed on a 2-core machine when each stream read for itself).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from mecsim.interfaces.service.jobs import TERMINAL, Run, Store

#: How often a feed looks for new rounds (one store read per followed run per tick).
EVENTS_POLL_S = 0.5
#: Rounds a feed keeps for followers that fall behind (older ones are read again).
FEED_KEEP = 256
#: Events of a missed history sent at once (a follower asking for 600 rounds gets 19
#: sends, other requests served in between).
BACKLOG_CHUNK = 32
#: A comment line every so often keeps idle connections (and proxies) open.
KEEP_ALIVE_S = 15.0


def round_event(rnd: int, row_json: str) -> str:
    return f"id: {rnd}\nevent: round\ndata: {row_json}\n\n"


def end_event(run: Run | None) -> str:
    end = {
        "status": run.status if run else "deleted",
        "rounds_done": run.rounds_done if run else 0,
        "error": run.error if run else None,
    }
    return f"event: end\ndata: {json.dumps(end)}\n\n"


class RoundFeed:
    """The new rounds of one run, read once and encoded once for all its followers."""

    def __init__(self, store: Store, run_id: str, after: int) -> None:
        self.store, self.run_id = store, run_id
        self.last = after  # the newest round read
        self.events: deque[tuple[int, str]] = deque(maxlen=FEED_KEEP)
        self.end: str | None = None  # the end event, once the run has ended
        self.followers = 0
        # set when new rounds (or the end) arrive, then replaced: waiting on it needs no
        # lock, so a follower cancelled while it waits (its client gone) leaves nothing held
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while self.followers > 0 and self.end is None:
            run, rows = await run_in_threadpool(self._read)
            if rows or run is None or run.status in TERMINAL:
                for rnd, text in rows:
                    self.last = rnd
                    self.events.append((rnd, text))
                if run is None or run.status in TERMINAL:
                    self.end = end_event(run)
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
            if self.end is None:
                await asyncio.sleep(EVENTS_POLL_S)

    def _read(self) -> tuple[Run | None, list[tuple[int, str]]]:
        """The run and its new rounds' events (made here, off the event loop). The status
        is read first: a run seen ended has every round already in the store."""
        run = self.store.get_run(self.run_id)
        rows = self.store.round_texts(self.run_id, self.last)
        return run, [(r, round_event(r, t)) for r, t in rows]

    def changed(self) -> asyncio.Event:
        """Set when rounds (or the end) newer than what is in :attr:`events` now arrive:
        taken before looking at them, so nothing arriving meanwhile is missed."""
        return self._changed

    @staticmethod
    async def wait(changed: asyncio.Event, timeout_s: float) -> None:
        """Until ``changed`` is set, at most ``timeout_s``."""
        try:
            await asyncio.wait_for(changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Feeds:
    """The feeds of the runs being followed (made on first follower, dropped with the
    last)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._feeds: dict[str, RoundFeed] = {}

    def join(self, run_id: str, after: int) -> RoundFeed:
        feed = self._feeds.get(run_id)
        if feed is None or feed.end is not None:
            feed = self._feeds[run_id] = RoundFeed(self.store, run_id, after)
            feed.followers = 1
            feed.start()
        else:
            feed.followers += 1
        return feed

    def leave(self, feed: RoundFeed) -> None:
        feed.followers -= 1
        if feed.followers <= 0:
            feed.stop()
            if self._feeds.get(feed.run_id) is feed:
                del self._feeds[feed.run_id]

    def __len__(self) -> int:
        return len(self._feeds)

    async def stream(
        self, run: Run, after: int, disconnected: Callable[[], Any]
    ) -> AsyncIterator[str]:
        """One follower's events after round ``after``, until the run ends."""
        store = self.store

        def missed(since: int, before: int | None = None) -> tuple[Run | None, int, list[str]]:
            """The run, the last round missed and the missed rounds' events in chunks
            (made off the event loop and sent :data:`BACKLOG_CHUNK` events at a time, the
            loop serving other requests in between). A ``since`` beyond the rounds recorded (an old
            Last-Event-ID after a run went back to an older checkpoint) is brought back to
            the newest round recorded."""
            current = store.get_run(run.id)  # before the rounds: see RoundFeed._read
            rows = store.round_texts(run.id, since)
            if before is not None:
                rows = [(r, t) for r, t in rows if r < before]
            if rows:
                last = rows[-1][0]
            else:
                newest = store.last_round(run.id) if since >= 0 else None
                last = min(since, int(newest["round"])) if newest else -1
            events = [round_event(r, t) for r, t in rows]
            # in chunks: the loop serves other requests between a long history's sends
            return (
                current,
                last,
                [
                    "".join(events[i : i + BACKLOG_CHUNK])
                    for i in range(0, len(events), BACKLOG_CHUNK)
                ],
            )

        current, after, chunks = await run_in_threadpool(missed, after)
        for chunk in chunks:
            yield chunk
        if current is None or current.status in TERMINAL:
            yield end_event(current)
            return
        feed = self.join(run.id, after)
        loop = asyncio.get_running_loop()
        try:
            last_sent = loop.time()
            while True:
                changed = feed.changed()
                oldest = feed.events[0][0] if feed.events else feed.last + 1
                if after + 1 < oldest and after < feed.last:  # fell behind the feed
                    _, after, chunks = await run_in_threadpool(missed, after, oldest)
                    for chunk in chunks:
                        yield chunk
                sent = False
                for rnd, text in list(feed.events):
                    if rnd > after:
                        after = rnd
                        sent = True
                        yield text
                if feed.end is not None:  # the run has ended: what is left, then the end
                    _, after, chunks = await run_in_threadpool(missed, after)
                    for chunk in chunks:
                        yield chunk
                    yield feed.end
                    return
                if await disconnected():
                    return
                if sent:
                    last_sent = loop.time()
                elif loop.time() - last_sent >= KEEP_ALIVE_S:
                    last_sent = loop.time()
                    yield ": keep-alive\n\n"
                await feed.wait(changed, KEEP_ALIVE_S)
        finally:
            self.leave(feed)
