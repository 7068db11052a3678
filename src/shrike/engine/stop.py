"""Streams a sequence's text while holding back anything that could still become a stop string."""
from __future__ import annotations


class StopStringFilter:
    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = stops
        self.include_stop = include_stop  # vLLM's include_stop_str_in_output
        self.pending = ""  # text received but not yet released

    def push(self, text: str) -> tuple[str, str | None]:
        """Add decoded text -> (text safe to emit now, the stop string hit or None).

        On a hit the emitted text ends right before the stop string (or right after it, with include_stop).
        """
        if not self.stops:
            return text, None
        self.pending += text
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            start, stop = min(hits)
            out, self.pending = self.pending[:start + (len(stop) if self.include_stop else 0)], ""
            return out, stop
        hold = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(stop[:size]):
                    hold = max(hold, size)
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def flush(self) -> str:
        """At the end of a sequence the held-back text is released."""
        out, self.pending = self.pending, ""
        return out
