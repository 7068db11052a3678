"""Hands out fixed-size KV-cache blocks to sequences and takes them back, sharing equal prefixes.

A block that has been filled is registered under a key built from its tokens and its
predecessor's key (the first block's from its sequence's LoRA adapter), so equal keys mean equal
tokens at equal positions computed by the same weights. A later sequence whose
prompt starts with the same blocks reuses them instead of recomputing them. Blocks nobody
uses stay cached in the free pool and are evicted least recently used first.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shrike.engine.sequence import Sequence


@dataclass
class _Block:
    ref_count: int = 0
    key: int | None = None  # set once the block is full and registered
    tokens: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [_Block() for _ in range(num_blocks)]
        # Unused blocks, least recently freed first; cached ones keep their contents until reused.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # key -> block id
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, tokens found cached

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """Share of blocks in use by sequences (cached-but-free blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks if self.num_blocks else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _key(self, parent: int | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def reuse_cached_prefix(self, seq: Sequence) -> None:
        """For a sequence with nothing computed: adopt the cached blocks its tokens start with.

        At least one token is left to compute, since the step that computes it yields the logits.
        """
        if not self.enable_prefix_caching or seq.num_computed_tokens or seq.block_table:
            return
        if seq.params.prompt_logprobs is not None:
            return  # the cached blocks' logits are gone, and these tokens need them
        if seq.pooling is not None and seq.pooling.pooler.modes != ("last",):
            return  # pooling reads these tokens' hidden states, which the cache does not keep
        bs = self.block_size
        usable = (seq.num_tokens - 1) // bs
        self.prefix_queries += usable * bs
        parent = _root_key(seq)
        for i in range(usable):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            key = self._key(parent, tokens)
            block_id = self.cached.get(key)
            if block_id is None or self.blocks[block_id].tokens != tokens:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            parent = key
        seq.num_computed_tokens = seq.num_registered_blocks = len(seq.block_table)
        seq.num_computed_tokens *= bs
        self.prefix_hits += seq.num_computed_tokens

    def extra_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.extra_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self.extra_blocks_needed(seq, num_new_tokens)):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.key is not None:  # evict its cached contents
                if self.cached.get(block.key) == block_id:
                    del self.cached[block.key]
                block.key, block.tokens = None, ()
            block.ref_count = 1
            seq.block_table.append(block_id)

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: make the sequence's newly filled blocks findable by later prompts."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(seq.num_registered_blocks, seq.num_computed_tokens // bs):
            block = self.blocks[seq.block_table[i]]
            if block.key is None:
                parent = self.blocks[seq.block_table[i - 1]].key if i else _root_key(seq)
                block.tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                block.key = self._key(parent, block.tokens)
                self.cached.setdefault(block.key, seq.block_table[i])
        seq.num_registered_blocks = max(seq.num_registered_blocks, seq.num_computed_tokens // bs)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Return the blocks past the first num_tokens tokens (those of rejected proposals) to the pool.

        They were never registered (only fully computed blocks are), so they come back empty.
        """
        keep = self.blocks_for(num_tokens)
        if len(seq.block_table) <= keep:
            return
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        # A new list, not a cut in place: the model runner's copy of the table notices the change.
        seq.block_table = seq.block_table[:keep]

    def release(self, seq: Sequence) -> None:
        # Tail blocks first, so that eviction takes a sequence's suffix before its shared prefix.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = seq.num_registered_blocks = 0


def _root_key(seq: Sequence):
    """The parent key of a sequence's first block: its LoRA adapter's (None for the base model)."""
    return None if seq.lora is None else seq.lora.cache_key
