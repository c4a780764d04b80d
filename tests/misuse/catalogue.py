"""Every case of the misuse catalogue, by name."""
from tests.misuse import (Case, entry_cases, layer_cases, loop_cases, module_cases,
                          module_transform_cases, pipeline_cases, scale_cases, scope_cases,
                          sharding_cases,
                          stack_cases, transform_cases, vmap_scan_cases)

AREAS = {
    'scopes, variables and rngs': scope_cases.CASES,
    'vmap and scan': vmap_scan_cases.CASES,
    'other lifted transforms': transform_cases.CASES,
    'loops and as_scan': loop_cases.CASES,
    'writing modules': module_cases.CASES,
    'init, apply and bind': entry_cases.CASES,
    'module transforms': module_transform_cases.CASES,
    'layer stacks': stack_cases.CASES,
    'pipelines': pipeline_cases.CASES,
    'layers, Flax interop and partitioning': layer_cases.CASES,
    'sharding on a mesh': sharding_cases.CASES,
    'compiling for TPU pods and attention kernels': scale_cases.CASES,
}
CASES: dict[str, Case] = {}
for _cases in AREAS.values():
  for _case in _cases:
    assert _case.name not in CASES, f'two cases named {_case.name!r}'
    CASES[_case.name] = _case
