"""At scale without the hardware: compile a training step ahead of time for a named TPU
topology on any machine, read what each chip would hold, and plan the configuration
that fits (notes/0008-at-scale.md)."""
from linen_ext.scale.compiled import CompiledStats, compiled_stats, count_collectives
from linen_ext.scale.planner import Candidate, Plan, Trial, plan
from linen_ext.scale.topology import KNOWN_TOPOLOGIES, Topology, tpu_topology
from linen_ext.scale.train_step import (NO_BF16_PROPAGATION, CompiledStep, batch_sharding,
                                        compile_train_step, make_mesh, next_token_loss)

__all__ = ['Candidate', 'CompiledStats', 'CompiledStep', 'KNOWN_TOPOLOGIES',
           'NO_BF16_PROPAGATION', 'Plan',
           'Topology', 'Trial', 'batch_sharding', 'compile_train_step', 'compiled_stats',
           'count_collectives', 'make_mesh', 'next_token_loss', 'plan', 'tpu_topology']
