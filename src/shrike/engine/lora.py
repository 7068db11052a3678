"""LoRA adapters served beside the base model, as vLLM serves them: registered by name (`--lora-modules
NAME=PATH`, a `LoRARequest`, or /v1/load_lora_adapter), and loaded into one of `--max-loras` adapter slots
while sequences use them. A slot whose adapter no running sequence uses is reused least recently used first;
a sequence whose adapter finds no slot waits until one is free.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from shrike.errors import ConfigError
from shrike.model.lora import LoRAAdapter, attach_lora_slots, check_adapter, read_peft_adapter, write_adapter


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's LoRARequest(lora_name, lora_int_id, lora_path): the adapter a request runs with."""

    lora_name: str
    lora_int_id: int
    lora_path: str


_cache_keys = itertools.count(1)


@dataclass(eq=False)
class RegisteredAdapter:
    name: str
    adapter: LoRAAdapter
    # Roots the prefix-cache keys of its sequences' blocks: two adapters (or two loads of one name) never
    # share cached KV blocks.
    cache_key: tuple = field(default_factory=lambda: ("lora", next(_cache_keys)))
    slot: int = -1  # its adapter slot while resident
    users: int = 0  # running sequences holding the slot


class LoRAManager:
    def __init__(self, model, max_loras: int, max_rank: int):
        self.max_loras, self.max_rank = max_loras, max_rank
        self.layers = attach_lora_slots(model, max_loras, max_rank)
        self.adapters: dict[str, RegisteredAdapter] = {}  # by name, in registration order
        self.resident: OrderedDict[int, RegisteredAdapter] = OrderedDict()  # slot -> adapter, least recently used first

    def register(self, name: str, path: str) -> RegisteredAdapter:
        """Read and check the adapter at `path` under `name`; ConfigError when it cannot be served or the name is taken."""
        if name in self.adapters:
            raise ConfigError(f"a LoRA adapter named {name!r} is loaded already; unload it first or pick another name")
        adapter = read_peft_adapter(path)
        check_adapter(adapter, self.layers, self.max_rank)
        registered = self.adapters[name] = RegisteredAdapter(name, adapter)
        return registered

    def unregister(self, name: str) -> None:
        registered = self.adapters.get(name)
        if registered is None:
            raise KeyError(name)
        if registered.users:
            raise ConfigError(f"LoRA adapter {name!r} is in use by {registered.users} running request(s); "
                              "unload it when they are done")
        if registered.slot >= 0:
            del self.resident[registered.slot]
            for layer in self.layers:
                layer.lora.clear(registered.slot)
        del self.adapters[name]

    def for_request(self, request: LoRARequest) -> RegisteredAdapter:
        """The registered adapter a LoRARequest names, registered from its path on first use."""
        registered = self.adapters.get(request.lora_name)
        if registered is None:
            return self.register(request.lora_name, request.lora_path)
        return registered

    def acquire(self, registered: RegisteredAdapter) -> bool:
        """A running sequence starts using the adapter: bring it into a slot -> False when every slot holds an
        adapter in use (the sequence waits)."""
        if registered.slot < 0:
            used = {a.slot for a in self.resident.values()}
            free = [s for s in range(self.max_loras) if s not in used]
            if free:
                slot = free[0]
            else:
                evictable = next((a for a in self.resident.values() if not a.users), None)
                if evictable is None:
                    return False
                slot, evictable.slot = evictable.slot, -1
                del self.resident[slot]
            write_adapter(self.layers, slot, registered.adapter)
            registered.slot = slot
            self.resident[slot] = registered
        self.resident.move_to_end(registered.slot)
        registered.users += 1
        return True

    def release(self, registered: RegisteredAdapter) -> None:
        registered.users -= 1
