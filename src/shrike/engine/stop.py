"""Streams a sequence's text while holding back anything that could still become a stop string."""
from __future__ import annotations


class StopStringFilter:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""  # text received but not yet released

    def push(self, text: str) -> tuple[str, bool]:
        """Add decoded text -> (text safe to emit now, whether a stop string was hit).

        On a hit the emitted text ends right before the stop string.
        """
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        hold = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(stop[:size]):
                    hold = max(hold, size)
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        """At the end of a sequence the held-back text is released."""
        out, self.pending = self.pending, ""
        return out
