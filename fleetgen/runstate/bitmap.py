"""A bitmap of slots laid out as Redis lays out its own (bit 0 is the most significant bit of
byte 0): the run's `done` and `sent` bitmaps as read with one GET, and the sets of slots the
producer and the drainer keep in memory the same way, so the two compare byte by byte."""

from __future__ import annotations

from collections.abc import Iterator


class Bits:
    """A Redis bitmap read once, or a set of slots kept as one (`add` grows it)."""

    def __init__(self, raw: bytes | bytearray | str | None = None) -> None:
        self.raw = bytearray(raw.encode() if isinstance(raw, str) else (raw or b""))

    def __contains__(self, slot: int) -> bool:
        byte = slot >> 3
        return byte < len(self.raw) and bool(self.raw[byte] & (0x80 >> (slot & 7)))

    def add(self, slot: int) -> None:
        if (slot >> 3) >= len(self.raw):
            # Doubling: a pass numbers slots one after another, so growing byte by byte
            # would copy the bitmap once a byte.
            self.raw.extend(bytes(max((slot >> 3) + 1 - len(self.raw), len(self.raw))))
        self.raw[slot >> 3] |= 0x80 >> (slot & 7)

    def missing(self, first: int, last: int) -> Iterator[int]:
        """Slots in first..last whose bit is clear; whole bytes of set bits are skipped, so a
        nearly finished 10-million-row run is scanned in a fraction of a second."""
        raw = self.raw.ljust((last >> 3) + 1, b"\0")
        for index in range(first >> 3, (last >> 3) + 1):
            if raw[index] == 0xFF:
                continue
            for bit in range(8):
                slot = (index << 3) | bit
                if first <= slot <= last and not raw[index] & (0x80 >> bit):
                    yield slot

    def set_in(self, first: int, last: int) -> Iterator[int]:
        """Slots in first..last whose bit is set; whole bytes of clear bits are skipped."""
        raw = self.raw
        for index in range(first >> 3, min(last >> 3, len(raw) - 1) + 1):
            if not raw[index]:
                continue
            for bit in range(8):
                slot = (index << 3) | bit
                if first <= slot <= last and raw[index] & (0x80 >> bit):
                    yield slot

    def not_in(self, other: bytes | bytearray) -> list[int]:
        """Slots set here whose bit is clear in `other` (a Redis bitmap): one big-integer
        operation, then only the non-zero bytes."""
        size = len(self.raw)
        held = int.from_bytes(self.raw, "big")
        diff = (held & ~int.from_bytes(bytes(other[:size]).ljust(size, b"\0"), "big")).to_bytes(
            size, "big")
        return [(index << 3) | bit for index, byte in enumerate(diff) if byte
                for bit in range(8) if byte & (0x80 >> bit)]
