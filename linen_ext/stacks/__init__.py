"""Layer stacks: many layers of one block as one compiled loop.

Files: `stacked` (``Stacked``, ``BlockSeq``), `pipeline`
(``Stacked.pipeline``'s schedules), `layer_list` (``scan_layers`` over a Python
list of submodules), `layout` (the stacked and per-layer variable layouts, ``per_layer``
arguments, and the converters between layouts).
"""
from linen_ext.stacks.layer_list import scan_layers
from linen_ext.stacks.pipeline import circular_to_stacked, stacked_to_circular
from linen_ext.stacks.layout import layers_to_stacked, per_layer, stacked_to_layers
from linen_ext.stacks.block_seq import BlockSeq
from linen_ext.stacks.stacked import Stacked

__all__ = ['BlockSeq', 'Stacked', 'circular_to_stacked', 'layers_to_stacked', 'per_layer',
           'scan_layers', 'stacked_to_circular', 'stacked_to_layers']
