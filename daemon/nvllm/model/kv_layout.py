"""Which pages each layer's keys and values go in: the page pool's groups of layers.

A model whose layers all attend alike has one group: a page holds every layer's keys and values for
block_size tokens, and a sequence has one block table. A model mixing sliding-window and global layers
(Gemma 3) has several, as vLLM's hybrid allocator lays them out: the layers of each kind are cut into
groups of `slots` layers each; each group has its own block table per sequence, and a page (one block
id) holds `slots` layers' keys and values for whichever group owns it. A sliding group's pages before
its window can then be given back while the global group keeps every page of the context.

Layer l writes and reads slot layer_slot[l] of the pool through the block table of group
layer_group[l]. Group size follows vLLM's rule: the fewest layers of any kind, or the most where the
kinds are within a quarter of each other (a group with fewer layers leaves slots of its pages unused).
"""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.model.config import ModelConfig


@dataclass(frozen=True)
class KVLayout:
    windows: tuple[int, ...]       # per group: the keys a query sees (0: all of them)
    layer_group: tuple[int, ...]   # per layer
    layer_slot: tuple[int, ...]    # per layer: its index in the pool's first axis
    slots: int                     # layers per page

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @classmethod
    def single(cls, num_layers: int) -> KVLayout:
        """One group of every layer: the pool [L, 2, ...] with one table per sequence."""
        return cls((0,), (0,) * num_layers, tuple(range(num_layers)), num_layers)

    @classmethod
    def of_windows(cls, layer_windows: list[int]) -> KVLayout:
        """Groups for layers that attend within layer_windows[l] keys (0: all)."""
        kinds: dict[int, list[int]] = {}
        for layer, w in enumerate(layer_windows):
            kinds.setdefault(max(0, int(w)), []).append(layer)
        if len(kinds) <= 1:
            only = next(iter(kinds), 0)
            return cls((only,), (0,) * len(layer_windows), tuple(range(len(layer_windows))), len(layer_windows))
        fewest, most = min(map(len, kinds.values())), max(map(len, kinds.values()))
        size = most if most * 4 < fewest * 5 else fewest
        windows: list[int] = []
        group, slot = [0] * len(layer_windows), [0] * len(layer_windows)
        for w in sorted(kinds):   # the global layers (window 0) first: group 0
            layers = kinds[w]
            for start in range(0, len(layers), size):
                for s, layer in enumerate(layers[start:start + size]):
                    group[layer], slot[layer] = len(windows), s
                windows.append(w)
        return cls(tuple(windows), tuple(group), tuple(slot), size)

    @classmethod
    def of(cls, config: ModelConfig) -> KVLayout:
        window = config.sliding_window or 0
        sliding = config.sliding_layers or [False] * config.num_layers
        return cls.of_windows([window if s else 0 for s in sliding])
