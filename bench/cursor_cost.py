"""What writing a room reader's cursor costs per delivery: each reader packing the event's id itself (a call
with the positions, as every delivery did before) beside the event's id packed once for all its readers
(`moved`, as deliveries do now). A reader of a room reads its own two channels and the room: the compact form.

Run: .venv/bin/python -m bench.cursor_cost [--deliveries 200000] [--readers 10]
     (in a checkout from before `moved`: PYTHONPATH=. <this repository>/.venv/bin/python <this file> --each-only)
"""

from __future__ import annotations

import argparse
import json
import time

from app.events.bus import Event
from app.events.cursor import CompactCursorWriter

ROOM = "rooms:r1"


def per_delivery_us(deliveries: int, readers: int, shared_packing: bool) -> float:
    """Microseconds of one reader's cursor, `readers` readers of each event, `deliveries` in all."""
    writers = [CompactCursorWriter([f"user:{n:032x}", "broadcast", ROOM]) for n in range(readers)]
    positions = [{f"user:{n:032x}": "1795951802934-0", "broadcast": "0-0", ROOM: "0-0"} for n in range(readers)]
    events = [Event(f"{1795951802934 + n}-{n % 3}", ROOM, "m", "1", "") for n in range(deliveries // readers)]
    started = time.perf_counter()
    for event in events:
        for writer, held in zip(writers, positions, strict=True):
            held[ROOM] = event.id
            if shared_packing:
                writer.moved(held, ROOM, event.id, event.packed())
            else:
                writer(held)
    return (time.perf_counter() - started) / (len(events) * readers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deliveries", type=int, default=200_000)
    parser.add_argument("--readers", type=int, default=10, help="readers of each event (a room's size)")
    parser.add_argument("--each-only", action="store_true", help="only each reader packing (an older tree)")
    args = parser.parse_args()
    result = {"each_reader_packs_us": round(per_delivery_us(args.deliveries, args.readers, False), 2)}
    if not args.each_only:
        result["packed_once_us"] = round(per_delivery_us(args.deliveries, args.readers, True), 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
